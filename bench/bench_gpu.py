"""One GRPO step on one GPU at real Qwen3 sizes, with no download: how fast is generation, how fast is training?

    python bench/bench_gpu.py                                  # Qwen3-0.6B and Qwen3-8B shapes, HF and (if installed)
                                                               # vLLM generation; ~5 min on one H200
    python bench/bench_gpu.py --models qwen3-8b --backends hf  # one case
    python bench/bench_gpu.py --dry-run                        # tiny shapes on CPU in seconds: the same code path

The models are randomly initialised Qwen3ForCausalLM with the real layer shapes (smoke.build_model), so nothing is
downloaded and the speed is the real one: a random network runs the same matrix multiplies as a trained one. Each
case (model x backend) runs in its own process: GRPOTrainer with our LoRA (grpotrainer.build_peft_config), bf16,
flash-attn if installed else sdpa, and a reward computed from token ids (the tokenizer is smoke.py's 512-token one
while the model's vocabulary has 151936 entries; decoding drops the ids it does not know, the rewards never need
text). Every completion is forced to exactly --completion-tokens tokens, so tokens/s is measured at a fixed length.
--steps optimiser steps run; the last is reported (the first pays CUDA and kernel warm-up).

Reported per case, and written as JSON (--json):
    gen_tokens_per_s     completion tokens / generation time (vLLM: without the weight sync, reported apart)
    train_tokens_per_s   prompt + completion tokens / (step time - generation - weight sync): reference log-probs
                         (BETA > 0), loss forward and backward, optimiser step
    peak_memory_gb       torch.cuda.max_memory_allocated over the whole case (with vLLM colocated this includes the
                         VLLM_GPU_MEMORY_UTILIZATION share it reserves up front for weights and KV cache)
    bandwidth_fraction   generation speed against the memory-bandwidth bound: every decode step must read all the
                         weights once, so a step cannot take less than weight bytes / peak bandwidth (--peak-tbs,
                         4.8 TB/s for an H200). fraction = (weight bytes / measured seconds per decode step) / peak.
                         bandwidth_fraction_with_kv also counts the KV cache read at each step.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: smoke.py, grpotrainer.py, data/

# Shapes from each model's config.json on the Hub (Qwen/Qwen3-0.6B, Qwen/Qwen3-8B); 0.596B and 8.19B parameters.
# Complete on purpose: smoke.build_model starts from smoke.TINY_QWEN3, whose values must not leak into a real shape.
SHAPES = {
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        initializer_range=0.02,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        initializer_range=0.02,
    ),
}
# --dry-run: smoke.py's tiny Qwen3, untied like Qwen3-8B, with a vocabulary 8x the tokenizer's (151936 is ~300x) so
# that ids beyond the tokenizer are exercised; the real 151936 would make each CPU step ~10 s of LM-head maths.
DRY_SHAPES = {"tiny": dict(vocab_size=4096, tie_word_embeddings=False)}
# Sized for a 10-minute slot on one H200: 8 prompts x 8 completions x 256 tokens per step, micro-batches of 16.
REAL = dict(prompts=8, num_generations=8, completion_tokens=256, micro_batch=16, steps=2)
DRY = dict(prompts=2, num_generations=2, completion_tokens=8, micro_batch=2, steps=2)


def token_reward(completions, completion_ids, **kwargs):
    """A cheap deterministic reward from token ids, spread over [0, 1] so that groups have a non-zero std.

    `**kwargs` takes the dataset columns and trainer state that TRL passes to every reward.

    >>> token_reward(["", ""], completion_ids=[[1, 2], [6]])
    [0.5, 1.0]
    """
    return [sum(ids) % 7 / 6 for ids in completion_ids]


@contextmanager
def build_defaults(device, dtype):
    """Create tensors directly on `device` in `dtype`: an 8B model never exists in fp32 or on the CPU."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def decode_weight_bytes(model):
    """Bytes of the weights every decode step reads: all layers and the LM head. An untied input embedding is only
    a row lookup, so it is left out; tied, it is the LM head and counts once (parameters() yields it once)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    return total - (0 if tied else embed.numel() * embed.element_size())


def kv_bytes_per_decode_step(shape, prompt_lengths, completion_tokens, dtype_bytes):
    """KV cache bytes read per decode step, averaged over the completion: keys and values of every layer over a
    context growing from the prompt to prompt + completion (mean prompt + completion / 2)."""
    per_token = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["head_dim"] * dtype_bytes
    return per_token * sum(p + completion_tokens / 2 for p in prompt_lengths)


def timed_trainer_class():
    """GRPOTrainer that times each generation round and each optimiser step (synchronising the GPU first)."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    def sync():  # CUDA runs asynchronously: wait for queued kernels before reading the clock
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self, records):
            self.records = records

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.records.append({"step": state.global_step + 1, "begin": time.perf_counter(), "gen": []})

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.records[-1]["step_s"] = time.perf_counter() - self.records[-1]["begin"]

    class TimedGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.bench_steps = []
            self.bench_sync_s = 0.0
            self.add_callback(StepTimer(self.bench_steps))
            if self.use_vllm:  # time the weight push to vLLM apart from generation
                sync_weights = self.vllm_generation.sync_weights

                def timed_sync_weights():
                    sync()
                    start = time.perf_counter()
                    sync_weights()
                    sync()
                    self.bench_sync_s += time.perf_counter() - start

                self.vllm_generation.sync_weights = timed_sync_weights

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            sync()
            start, sync_before = time.perf_counter(), self.bench_sync_s
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            sync()
            sync_s = self.bench_sync_s - sync_before
            self.bench_steps[-1]["gen"].append(
                {
                    "gen_s": time.perf_counter() - start - sync_s,
                    "sync_s": sync_s,
                    "prompt_lengths": [len(p) for p in prompt_ids],
                    "completion_lengths": [len(c) for c in completion_ids],
                }
            )
            return completion_ids, logprobs

    return TimedGRPOTrainer


def use_dummy_vllm_weights():
    """vLLM builds its engine from model.name_or_path; load_format="dummy" needs only config.json and the tokenizer
    there, and TRL's first weight sync replaces the dummy weights with ours. Saves writing 16 GB for the 8B case."""
    import trl.generation.vllm_generation as vllm_generation

    vllm_generation.LLM = functools.partial(vllm_generation.LLM, load_format="dummy")


def prompts_dataset():
    """The fixture's questions as chat prompts, built exactly as grpotrainer.py builds them."""
    import datasets

    import grpotrainer

    rows = [json.loads(line) for line in (ROOT / "data" / "smoke_gsm8k.jsonl").read_text().splitlines() if line]
    return datasets.Dataset.from_dict({"prompt": [grpotrainer.make_prompt(r["question"]) for r in rows]})


def grpo_config(args, size, backend, out_dir):
    """GRPOConfig from grpotrainer's constants, with the benchmark's batch shape and a forced completion length."""
    from trl import GRPOConfig

    import grpotrainer as g

    completions = size["prompts"] * size["num_generations"]
    length = size["completion_tokens"]
    if backend == "vllm":  # no detokenising: vLLM would meet ids beyond the 512-token tokenizer
        generation_kwargs = {"min_tokens": length, "detokenize": False}
    else:
        generation_kwargs = {"min_new_tokens": length}
    return GRPOConfig(
        output_dir=str(out_dir),
        chat_template_kwargs={"enable_thinking": False},
        num_generations=size["num_generations"],
        max_completion_length=length,
        generation_kwargs=generation_kwargs,
        temperature=g.TEMPERATURE,
        beta=g.BETA,
        loss_type=g.LOSS_TYPE,
        scale_rewards=g.SCALE_REWARDS,
        num_iterations=g.NUM_ITERATIONS,
        use_vllm=backend == "vllm",
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=g.VLLM_GPU_MEMORY_UTILIZATION,
        vllm_max_model_length=2048,
        learning_rate=g.LEARNING_RATE,
        per_device_train_batch_size=size["micro_batch"],
        gradient_accumulation_steps=completions // size["micro_batch"],  # one generation round per step
        max_steps=size["steps"],
        activation_checkpointing=g.ACTIVATION_CHECKPOINTING,
        bf16=not args.dry_run,
        use_cpu=args.dry_run,
        seed=g.SEED,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )


def run_case(args, name, backend):
    """Build the model, run --steps GRPO steps, return the measurements of the last one."""
    import torch

    import grpotrainer
    import preflight
    import smoke

    shape = {**smoke.TINY_QWEN3, **(DRY_SHAPES if args.dry_run else SHAPES)[name]}
    size = sizes(args)
    device, dtype = ("cpu", torch.float32) if args.dry_run else ("cuda", torch.bfloat16)
    attn = "flash_attention_2" if not args.dry_run and preflight.importable("flash_attn") else "sdpa"
    if backend == "vllm":
        use_dummy_vllm_weights()
    started = time.perf_counter()
    tokenizer = smoke.build_tokenizer()
    with build_defaults(device, dtype):
        model = smoke.build_model(tokenizer, **shape)
    model.set_attn_implementation(attn)
    model.config.dtype = dtype
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = decode_weight_bytes(model)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        model.config.save_pretrained(tmp)  # config + tokenizer only: what vLLM needs with dummy weights
        tokenizer.save_pretrained(tmp)
        model.config._name_or_path = tmp
        trainer = timed_trainer_class()(
            model=model,
            reward_funcs=token_reward,
            args=grpo_config(args, size, backend, Path(tmp) / "out"),
            train_dataset=prompts_dataset(),
            processing_class=tokenizer,
            peft_config=grpotrainer.build_peft_config(),
        )
        trainer.train()
    step = trainer.bench_steps[-1]
    gen_s = sum(g["gen_s"] for g in step["gen"])
    sync_s = sum(g["sync_s"] for g in step["gen"])
    prompt_lengths = [n for g in step["gen"] for n in g["prompt_lengths"]]
    completion_lengths = [n for g in step["gen"] for n in g["completion_lengths"]]
    decode_step_s = gen_s / max(completion_lengths)  # one forward per new token (the first also reads the prompt)
    kv_bytes = kv_bytes_per_decode_step(shape, prompt_lengths, size["completion_tokens"], dtype.itemsize)
    peak = args.peak_tbs * 1e12
    return {
        "gen_tokens_per_s": sum(completion_lengths) / gen_s,
        "train_tokens_per_s": (sum(prompt_lengths) + sum(completion_lengths)) / (step["step_s"] - gen_s - sync_s),
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None,
        "bandwidth_fraction": weight_bytes / decode_step_s / peak,
        "bandwidth_fraction_with_kv": (weight_bytes + kv_bytes) / decode_step_s / peak,
        "step_s": step["step_s"],
        "gen_s": gen_s,
        "weight_sync_s": sync_s,
        "decode_step_s": decode_step_s,
        "completions": len(completion_lengths),
        "completion_tokens": sum(completion_lengths),
        "prompt_tokens": sum(prompt_lengths),
        "params": params,
        "decode_weight_bytes": weight_bytes,
        "kv_bytes_per_decode_step": kv_bytes,
        "peak_tbs": args.peak_tbs,
        "attn_implementation": attn,
        "dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "shape": shape,
        "batch": size,
        "all_steps_s": [s["step_s"] for s in trainer.bench_steps],
        "case_wall_s": time.perf_counter() - started,
    }


def sizes(args):
    base = DRY if args.dry_run else REAL
    return {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in base.items()}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (checks the code path, not speed)")
    p.add_argument("--models", help=f"comma list of {', '.join(SHAPES)} (dry run: {', '.join(DRY_SHAPES)})")
    p.add_argument("--backends", default="hf,vllm", help="hf, vllm or both (vllm only where it is importable)")
    p.add_argument("--json", type=Path, default=None, help="where to write results (default outputs/bench/)")
    p.add_argument("--peak-tbs", type=float, default=4.8, help="GPU memory bandwidth in TB/s (H200 4.8, H100 3.35)")
    for key in REAL:
        p.add_argument(f"--{key.replace('_', '-')}", type=int, help=f"default {REAL[key]} (dry run {DRY[key]})")
    p.add_argument("--case-timeout", type=int, default=480, help="seconds one case may take (default 480)")
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one "model:backend" in this process
    p.add_argument("--case-json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.models = (args.models or ",".join(DRY_SHAPES if args.dry_run else SHAPES)).split(",")
    args.backends = args.backends.split(",")
    known = DRY_SHAPES if args.dry_run else SHAPES
    if bad := [m for m in args.models if m not in known] + [b for b in args.backends if b not in ("hf", "vllm")]:
        p.error(f"unknown model or backend {bad}; models: {', '.join(known)}; backends: hf, vllm")
    size = sizes(args)
    if size["prompts"] * size["num_generations"] % size["micro_batch"]:
        p.error("--prompts x --num-generations must be a multiple of --micro-batch")
    if size["steps"] < 2:
        p.error("--steps must be at least 2: the first step is warm-up")
    return args


def skip_reason(args, backend):
    """Why a case cannot run here, or None."""
    import preflight

    if backend == "vllm" and args.dry_run:
        return "vLLM needs a CUDA GPU; the dry run covers the HF path only"
    if backend == "vllm" and not preflight.importable("vllm"):
        return "vllm is not installed; it lives in its own environment (pip install -r requirements-vllm.txt)"
    return None


def run_in_subprocess(args, argv, name, backend, tmp):
    """One case in a fresh process: its own peak memory, and vLLM's engine never shares a process with another."""
    out = Path(tmp) / f"{name}-{backend}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--case", f"{name}:{backend}", "--case-json", out]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"took longer than --case-timeout={args.case_timeout} s"}
    if proc.returncode or not out.is_file():
        return {"status": "error", "reason": f"exit status {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}
    return {"status": "ok", **json.loads(out.read_text())}


def report_line(case):
    if case["status"] != "ok":
        return f"{case['model']:<12} {case['backend']:<5} {case['status']}: {case['reason']}"
    mem = f"{case['peak_memory_gb']:.1f} GB" if case["peak_memory_gb"] is not None else "n/a"
    return (
        f"{case['model']:<12} {case['backend']:<5} gen {case['gen_tokens_per_s']:>9.0f} tok/s  "
        f"train {case['train_tokens_per_s']:>9.0f} tok/s  peak {mem:>8}  "
        f"bandwidth {case['bandwidth_fraction']:.1%} of {case['peak_tbs']} TB/s  step {case['step_s']:.2f} s"
    )


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.case:  # child: run one case, write its JSON
        name, backend = args.case.split(":")
        args.case_json.write_text(json.dumps(run_case(args, name, backend), indent=2) + "\n")
        return None
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: no CUDA GPU is visible; `bench/bench_gpu.py --dry-run` checks the code path on CPU.")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for name in args.models:
            for backend in args.backends:
                reason = skip_reason(args, backend)
                case = {"status": "skipped", "reason": reason} if reason else None
                case = case or run_in_subprocess(args, argv, name, backend, tmp)
                results.append({"model": name, "backend": backend, **case})
                print(report_line(results[-1]), flush=True)
    path = args.json or ROOT / "outputs" / "bench" / ("gpu-dry-run.json" if args.dry_run else "gpu.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "gpu", "dry_run": args.dry_run, "cases": results}, indent=2) + "\n")
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    sys.exit(1 if any(case["status"] == "error" for case in main() or []) else 0)
