"""The GPU check: how fast grpotrainer.py generates and trains on a CUDA machine, against what the hardware allows.

    bash bench/gpu_check.sh                  # the whole check, offline, in at most 9 minutes (installs .whl/ first)
    bash bench/gpu_check.sh --quick          # Qwen3-0.6B only: two steps' cases and decode; at most 5 minutes
    python bench/gpu_check.py --dry-run      # tiny shapes on CPU in a few minutes: the same code path

Nothing is downloaded. The models are randomly initialised Qwen3ForCausalLM with the published shapes (Qwen3-8B, the
default MODEL_NAME, first; then Qwen3-0.6B when time is left; each when the GPU's memory and the disk allow), saved in
bf16 and loaded back through from_pretrained exactly as training loads them; the tokenizer is the smoke one. A random
network runs the same matrix multiplies as a trained one, and it rarely emits its end token, so every completion runs
to full length.

Cases, each in its own process with its own time budget (BUDGETS), under one deadline for the whole run
(--deadline). A case whose budget is more than the time left is skipped, not started, and reported as skipped; a
case that outlives its budget is killed and reported as a timeout, which is a failure. The JSON is rewritten after
every case, so a run cut short keeps what it measured. Per model, in this order:
    build          the random model folder
    step-generate  real `grpotrainer.py` steps at its default settings (evaluation off), plain `generate`
    weight-sync    grpo/weight_sync.py's out-of-place vLLM weight sync through TRL's own sync_weights() into a
                   stand-in engine: a pass/fail entry (the bf16 base bit-identical after SYNCS syncs, the engine
                   holding the fp32 merge within one bf16 rounding), each walk's seconds per sync, TRL's drift
    decode         `generate` of the LoRA-wrapped model (unmerged, as training generates) at batch 1
                   (decode-lora-b1) and at the GRPO generation batch (decode-lora-grpo), eager, with the host's cost
    eval           one held-out evaluation call as training makes it: generation.hf_generator on the LoRA-wrapped
                   model, EVAL_BATCH_SIZE prompts, MAX_COMPLETION_LENGTH new tokens, greedy (eval-hf)
    step-cb        step-generate with USE_TRANSFORMERS_CONTINUOUS_BATCHING=True, then dtype-after-cb: a pass/fail
                   entry, the LoRA weights and rotary inv_freq buffers fp32 at every step's end
    step-large     step-generate with 128 completions per step, all decoded by one generate call
    decode-static  decode with CACHE_IMPLEMENTATION=static: the static KV cache and the compiled decode step; the
                   compile (the warm-up call) reported apart from the timed repeats
    eval-vllm      the same call through vLLM (generation.vllm_generator), its engine's start timed apart (only where
                   vllm is installed)
    step-vllm      step-generate with USE_VLLM=True (only where vllm is installed)
calibrate (the device's memory bandwidth and bf16 matmul rate) runs first, once.

Figures (every case has all keys; null where a case does not measure it); each is the median over repeats (the
steps after the first, or DECODE_REPEATS generate calls), with the repeats beside it:
    step_seconds          wall time of one whole optimiser step (callback to callback, CUDA synchronised); the
                          first of --steps steps pays the warm-up and is left out
    generation_share      the part of that step spent generating (TRL's own generate timing, synchronised)
    decode_tokens_per_s   completion tokens per second of generation
    bandwidth_fraction    bytes a decode step must read (weights + KV cache) / decode step time / measured bandwidth
    peak_memory_gib       torch.cuda.max_memory_allocated of the case (null on CPU); peak_memory_no_kv_gib beside it
                          is the same outside generation (steps) or before it (decode): without the KV cache
    matmul_efficiency     step cases: the step's matmul FLOPs outside generation / that time / measured matmul rate
`host` names the CPU and its cores, and from the first decode case its CPU seconds and kernel launches per token.
"""

import argparse
import ast
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent  # the checkout: demo/smoke.py, grpotrainer.py, data/
FIXTURE = ROOT / "data" / "smoke_gsm8k.jsonl"
GIB = 2**30

# Shapes from each model's config.json on the Hub. Complete on purpose: smoke.build_model starts from
# smoke.TINY_QWEN3, whose values (initializer_range 0.2, ...) must not leak into a real shape.
_QWEN3 = dict(head_dim=128, num_key_value_heads=8, vocab_size=151936, max_position_embeddings=40960)
SHAPES = {  # the default MODEL_NAME (8B) first; the small ones run after it when time is left, or alone in --quick
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=False, initializer_range=0.02),
    "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True, initializer_range=0.02),
    "qwen3-1.7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True, initializer_range=0.02),
}  # fmt: skip
DEFAULT_MODELS = ["qwen3-8b", "qwen3-0.6b"]  # the plan of the default call (1.7B only with --models)
# --dry-run: demo/smoke.py's tiny Qwen3 under the real names (qwen3-8b untied, qwen3-0.6b tied, as the real ones),
# with a vocabulary 8x its tokenizer's so that ids the tokenizer does not know are exercised (the real models have
# 151936 against 512). The "deep" shapes keep the tiny width at the real models' depth: on the CPU their times are
# Python's and the kernel launches' share of a step, which is what bounds eager decoding on a GPU (the budgets below
# are built from them, see bench/README.md).
DRY_SHAPES = {
    "qwen3-8b": dict(vocab_size=4096, tie_word_embeddings=False),
    "qwen3-0.6b": dict(vocab_size=4096, tie_word_embeddings=True),
    "tiny-28-layers": dict(vocab_size=4096, tie_word_embeddings=False, num_hidden_layers=28),
    "tiny-36-layers": dict(vocab_size=4096, tie_word_embeddings=False, num_hidden_layers=36),
}
DRY_MODELS = ["qwen3-8b"]  # what --dry-run runs unless --models says otherwise: the default plan's first model
# --dry-run: grpotrainer.py's own batch layout (read from it, `step_settings`) and activation checkpointing over
# --smoke's (which trains 4 completions in one micro-batch), so that the CPU runs every micro-batch a GPU step runs
DRY_LAYOUT = ("PER_DEVICE_TRAIN_BATCH_SIZE", "GRADIENT_ACCUMULATION_STEPS")
# --quick: a second try in what is left of the GPU machine's window, on the small model
QUICK = dict(models=["qwen3-0.6b"], cases=["step-generate", "decode", "step-cb"], deadline=300)
# seconds for the whole run, install included (gpu_check.sh passes what it spent); the dry run 1200. A 15-minute
# device loan holds the machine's start (~3 min) and one command of at most 10 min: this, with a minute to spare.
DEADLINE = 540
# Seconds each case may take on an H200, per model: an estimate x 1.25, rounded up to 5 s. The estimates add the
# CPU-simulated image's measured times at the real depth (process start and imports, and eager decoding, which is
# launch-bound on a GPU: Python and kernel launches per token, not bandwidth) to the GPU's own work at its datasheet
# rates; the compile time of decode-static could not be measured at depth on the CPU and is the least certain.
# bench/README.md gives the measurements and the sums. The dry run gives every case DRY_BUDGET.
BUDGETS = {
    "calibrate": 20,
    "build": {"qwen3-8b": 60, "qwen3-0.6b": 20, "qwen3-1.7b": 25},
    "decode": {"qwen3-8b": 90, "qwen3-0.6b": 70, "qwen3-1.7b": 75},
    "weight-sync": {"qwen3-8b": 50, "qwen3-0.6b": 25, "qwen3-1.7b": 30},
    "eval": {"qwen3-8b": 80, "qwen3-0.6b": 50, "qwen3-1.7b": 55},
    "eval-vllm": {"qwen3-8b": 150, "qwen3-0.6b": 90, "qwen3-1.7b": 100},
    "decode-static": {"qwen3-8b": 155, "qwen3-0.6b": 140, "qwen3-1.7b": 145},
    "step": {"qwen3-8b": 175, "qwen3-0.6b": 135, "qwen3-1.7b": 140},
    "step-large": {"qwen3-8b": 185, "qwen3-0.6b": 140, "qwen3-1.7b": 145},
}
DRY_BUDGET = 450  # decode-static's cold compile of the LoRA model on 2 shared cores: up to ~5 min
EVAL_OFF = {"EVAL_STEPS": 0, "EVAL_BEFORE": 0, "EVAL_AFTER": 0}  # step cases time training alone
# twice the default layout in one generate call; the dry run's 32 fixture problems still hold a round (group 4)
LARGE_LAYOUT = {"PER_DEVICE_TRAIN_BATCH_SIZE": 16, "GRADIENT_ACCUMULATION_STEPS": 8, "STEPS_PER_GENERATION": 8}
STEP_CASES = {  # case -> grpotrainer.py overrides on top of its defaults (and EVAL_OFF)
    "step-generate": {},
    "step-cb": {"USE_TRANSFORMERS_CONTINUOUS_BATCHING": "true"},
    "step-large": LARGE_LAYOUT,
    "step-vllm": {"USE_VLLM": "true"},
}
DECODE_CASES = ("decode", "decode-static")
VLLM_CASES = ("eval-vllm", "step-vllm")  # run only where vllm imports, on a GPU
# after each build, in this order: the default step first, then what matters most if time runs out
CASES = ("step-generate", "weight-sync", "decode", "eval", "step-cb", "step-large", "decode-static", *VLLM_CASES)
SYNCS = 8  # weight-sync: syncs per walk, each after an optimiser-like update of the adapter (the first: warm-up)
DECODE_REPEATS = 3  # timed generate calls per batch size after the warm-up (the compile for decode-static)
PROFILED_TOKENS = 8  # decode steps the profiler counts kernel launches (CPU: aten ops) over
# On the CPU, TRL's continuous-batching default (half the free memory as paged KV cache) means gigabytes of RAM
# allocated per generation round; the tiny model needs 16 blocks of 256 tokens.
DRY_CB_CONFIG = '--transformers_continuous_batching_config={"num_blocks": 16, "max_batch_tokens": 256}'
GENERATION_NAMES = ("transformers.generate", "transformers.generate_batch", "vLLM.generate")  # TRL's profiling names
KEYS = ("step_seconds", "generation_share", "decode_tokens_per_s", "bandwidth_fraction", "peak_memory_gib")
FAILED = ("error", "timeout")  # statuses of a case that ran and did not succeed


# ----------------------------------------------------------------------------------------------------------------
# sizes and rooflines: pure functions of the shape, tested against the published parameter counts


def param_count(shape):
    """Parameters of a Qwen3ForCausalLM with this shape (embedding counted once when tied)."""
    h, kv_dim, q_dim = shape["hidden_size"], shape["num_key_value_heads"] * shape["head_dim"], 0
    q_dim = shape["num_attention_heads"] * shape["head_dim"]
    attention = h * q_dim + 2 * h * kv_dim + q_dim * h + 2 * shape["head_dim"]  # q, k, v, o and the q/k norms
    layer = attention + 3 * h * shape["intermediate_size"] + 2 * h  # gate, up, down and two RMSNorms
    embedding = shape["vocab_size"] * h
    return shape["num_hidden_layers"] * layer + h + embedding * (1 if shape["tie_word_embeddings"] else 2)


def decode_params(shape):
    """Parameters each decode step reads: all of them but an untied input embedding, which is a row lookup."""
    untied_input = 0 if shape["tie_word_embeddings"] else shape["vocab_size"] * shape["hidden_size"]
    return param_count(shape) - untied_input


def kv_bytes_per_token(shape, dtype_bytes):
    """KV cache bytes one token of context holds: keys and values of every layer."""
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["head_dim"] * dtype_bytes


def decode_step_bytes(shape, dtype_bytes, batch, prompt_tokens, new_tokens):
    """Bytes one decode step must read, averaged over `new_tokens` steps: the weights once, and each sequence's
    KV cache over a context growing from the prompt to prompt + new tokens (on average prompt + new_tokens / 2)."""
    kv = kv_bytes_per_token(shape, dtype_bytes) * batch * (prompt_tokens + new_tokens / 2)
    return decode_params(shape) * dtype_bytes + kv


def training_flops_per_token(shape, beta):
    """Matmul FLOPs per token of a LoRA step outside generation: the policy forward (2 per parameter), the backward
    to the activations (2 more; the frozen weights get no gradient), and the reference forward when BETA > 0.
    Activation checkpointing's recomputed forward is not counted (model FLOPs, as in MFU); nor is attention's
    score maths, small at GSM8K's few hundred tokens."""
    return 2 * decode_params(shape) * (2 + (beta > 0))


def script_defaults(path, names):
    """The literal values of the module-level constants `names` of a Python file, read without importing it."""
    found = {}
    for node in ast.parse(Path(path).read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in names:
            found[target.id] = ast.literal_eval(node.value)
    return found


def grpo_defaults(**overrides):
    """grpotrainer.py's defaults that size the measurements, with a case's `overrides` (its layout) on top."""
    names = ("PER_DEVICE_TRAIN_BATCH_SIZE", "GRADIENT_ACCUMULATION_STEPS", "STEPS_PER_GENERATION", "BETA")
    d = {**script_defaults(ROOT / "grpotrainer.py", names + ("MAX_COMPLETION_LENGTH",)), **overrides}
    steps_per_generation = d["STEPS_PER_GENERATION"] or d["GRADIENT_ACCUMULATION_STEPS"]
    return {
        "generation_batch": d["PER_DEVICE_TRAIN_BATCH_SIZE"] * steps_per_generation,
        "completion_tokens": d["MAX_COMPLETION_LENGTH"],
        "beta": d["BETA"],
    }


def case_record(case, model, **figures):
    """One entry of `cases`: every key of KEYS present (None where the case does not measure it)."""
    return {"case": case, "model": model, **dict.fromkeys(KEYS), **figures}


# ----------------------------------------------------------------------------------------------------------------
# the cases; each runs in a child process (`--case`) and returns a dict of figures


def device_and_dtype(dry_run):
    import torch

    return ("cpu", torch.float32) if dry_run else ("cuda", torch.bfloat16)


def sync():
    import torch

    if torch.cuda.is_initialized():  # CUDA runs asynchronously: wait for queued kernels before reading the clock
        torch.cuda.synchronize()


def timed(fn):
    """(wall seconds, process CPU seconds) of one call of fn(), CUDA synchronised at both ends."""
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def repeat_times(fn, repeats):
    """The wall seconds of `repeats` timed calls of fn() after one untimed warm-up call, and the warm-up's."""
    warmup, _ = timed(fn)
    return [timed(fn)[0] for _ in range(repeats)], warmup


def medians(repeats):
    """Each figure's median over the repeats, a list of dicts with the same keys.

    >>> medians([{"s": 1.0, "share": 0.5}, {"s": 3.0, "share": 0.1}, {"s": 2.0, "share": 0.2}])
    {'s': 2.0, 'share': 0.2}
    """
    return {key: median([repeat[key] for repeat in repeats]) for key in repeats[0]}


def host_facts():
    """The machine that drives the GPU: eager decoding is bound by its Python and kernel launches, not the GPU's."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return {
        "cpu_model": names[0] if names else platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def launches(fn, cuda):
    """Kernel launches during fn() (torch.profiler): CUDA kernel launches (cudaLaunchKernel and friends, CUDA graph
    launches) on a GPU; aten ops, what would each launch a kernel there, on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = [event.name for event in prof.events()]
    if cuda:
        return sum(1 for n in names if "LaunchKernel" in n or n.startswith("cudaGraphLaunch"))
    return sum(1 for n in names if n.startswith("aten::"))


def run_calibrate(args):
    """Memory bandwidth from a device-to-device copy (bytes read + written), matmul rate from one square matmul."""
    import torch

    device, dtype = device_and_dtype(args.dry_run)
    n_bytes, n = (64 * 2**20, 512) if args.dry_run else (2 * GIB, 8192)
    src = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = median(repeat_times(lambda: dst.copy_(src), 5 if args.dry_run else 20)[0])
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    matmul_s = median(repeat_times(lambda: a @ b, 3 if args.dry_run else 10)[0])
    return {
        "bandwidth_bytes_per_s": 2 * n_bytes / copy_s,
        "matmul_flops_per_s": 2 * n**3 / matmul_s,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "total_memory_gib": torch.cuda.get_device_properties(0).total_memory / GIB if device == "cuda" else None,
    }


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


def run_build(args):
    """Save the random model and the smoke tokenizer into args.model_dir, as a downloaded checkpoint would be."""
    from demo import smoke

    device, dtype = device_and_dtype(args.dry_run)
    tokenizer = smoke.build_tokenizer()
    with build_defaults(device, dtype):
        model = smoke.build_model(tokenizer, **shape_of(args))
    model.config.dtype = dtype
    model.save_pretrained(args.model_dir)
    tokenizer.save_pretrained(args.model_dir)
    return {"params": sum(p.numel() for p in model.parameters())}


def load_model(args):
    """The saved model through from_pretrained, in the dtype and attention implementation training would use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo import hardware

    device, dtype = device_and_dtype(args.dry_run)
    attn = hardware.auto_attention(cpu_only=args.dry_run, bf16=dtype == torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype, attn_implementation=attn).to(device)
    return model.eval(), AutoTokenizer.from_pretrained(args.model_dir), attn


def decode_options(case, dry_run):
    """generate()'s keyword arguments for a decode case: none for eager; for decode-static, those of
    CACHE_IMPLEMENTATION=static (grpo/hardware.py, decode_options: the static KV cache and the compile config with
    which generate() compiles the decode step). transformers compiles on CUDA only; the dry run asks for it on the
    CPU too (transformers' own switch for tests), so that the same code path runs."""
    from grpo import hardware

    options = hardware.decode_options("static" if case == "decode-static" else "dynamic")
    if options:
        options["compile_config"]._compile_all_devices = dry_run
    return options


def with_lora(model):
    """The model wrapped as training generates with it: grpotrainer.py's own LoRA config (its defaults) through
    peft.get_peft_model, as TRL wraps it; the adapter stays unmerged, so every targeted linear layer adds its two
    small matmuls (and their launches) to each decode step."""
    from peft import LoraConfig, get_peft_model

    from grpo.settings import config_kwargs

    names = ("LORA_R", "LORA_ALPHA", "LORA_DROPOUT", "LORA_TARGET_MODULES", "USE_RSLORA", "USE_DORA")
    lora = config_kwargs(script_defaults(ROOT / "grpotrainer.py", names), prefix="lora_config.")
    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))  # as grpotrainer.build_trainer


def run_decode(args):
    """`generate` of the LoRA-wrapped model at batch 1 and at the GRPO generation batch on one GSM8K-style chat
    prompt: decode tokens/s, how close a decode step comes to the bandwidth bound, and what it costs the host (CPU
    seconds and kernel launches per token). Prefill is taken out by timing 1 and N new tokens; each is timed
    DECODE_REPEATS times after a warm-up (for decode-static: the compile, reported apart as warmup_seconds)."""
    import torch

    model, tokenizer, attn = load_model(args)
    model = with_lora(model).eval()
    weights_gib = memory_allocated_gib()
    question = json.loads(FIXTURE.read_text().splitlines()[0])["question"]
    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt_ids = prompt["input_ids"].to(model.device)
    defaults = grpo_defaults()
    new_tokens = 16 if args.dry_run else 32  # decode-bound per token at any length: the KV cache is in the bound
    bandwidth = args.calibration["bandwidth_bytes_per_s"]
    shape, dtype_bytes = shape_of(args), model.dtype.itemsize
    options = decode_options(args.case, args.dry_run)
    prefix = "decode-static" if options else "decode-lora"
    records = []
    for suffix, batch in (("b1", 1), ("grpo", defaults["generation_batch"])):
        ids = prompt_ids.expand(batch, -1)

        def generate(n, ids=ids):
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.7,
                               max_new_tokens=n, min_new_tokens=n, pad_token_id=tokenizer.pad_token_id,
                               **options)  # fmt: skip

        reset_peak_memory()
        full, warmup_s = repeat_times(lambda n=new_tokens: generate(n), DECODE_REPEATS)  # warm-up: the compile
        prefill, _ = repeat_times(lambda: generate(1), DECODE_REPEATS)
        steps = [(f - median(prefill)) / (new_tokens - 1) for f in full]  # each repeat's decode step
        step_s = median(steps)
        # the host's share, over the same difference: CPU seconds and kernel launches of N - 1 decode steps
        cpu_s = timed(lambda n=new_tokens: generate(n))[1] - timed(lambda: generate(1))[1]
        profiled = [launches(lambda n=n: generate(n), not args.dry_run) for n in (PROFILED_TOKENS + 1, 1)]
        step_launches = (profiled[0] - profiled[1]) / PROFILED_TOKENS
        step_bytes = decode_step_bytes(shape, dtype_bytes, batch, prompt_ids.shape[1], new_tokens)
        records.append(
            case_record(
                f"{prefix}-{suffix}",
                args.model,
                decode_tokens_per_s=batch / step_s,
                bandwidth_fraction=step_bytes / step_s / bandwidth,
                peak_memory_gib=peak_memory_gib(),
                peak_memory_no_kv_gib=weights_gib,  # the loaded model alone, before any generation
                kv_cache_gib=kv_bytes_per_token(shape, dtype_bytes) * batch * (prompt_ids.shape[1] + new_tokens) / GIB,
                batch=batch,
                lora=True,
                prompt_tokens=prompt_ids.shape[1],
                new_tokens=new_tokens,
                decode_step_seconds=step_s,  # the median of the repeats below
                decode_step_seconds_repeats=steps,
                warmup_seconds=warmup_s,  # the first full generate: kernel warm-up, and compilation when static
                cpu_seconds_per_token=cpu_s / (new_tokens - 1) / batch,  # process CPU time / tokens decoded
                cpu_seconds_per_decode_step=cpu_s / (new_tokens - 1),
                launches_per_decode_step=step_launches,  # GPU: kernel launches; CPU dry run: aten ops
                launches_per_token=step_launches / batch,
                roofline_tokens_per_s=batch * bandwidth / step_bytes,
                attn_implementation=attn,
                cache_implementation=options.get("cache_implementation", "dynamic"),
            )
        )
    return {"records": records}


class SyncEngine:
    """vLLM's model as TRL's sync_weights() reaches it (llm.llm_engine...model.load_weights, reset_prefix_cache):
    load_weights copies each tensor into a buffer of its own, as vLLM copies it into its weights."""

    def __init__(self):
        self.weights = {}
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=self))))  # fmt: skip

    def load_weights(self, weights):
        for name, tensor in weights:
            if name not in self.weights:
                self.weights[name] = tensor.new_empty(tensor.shape)
            self.weights[name].copy_(tensor)

    def reset_prefix_cache(self):
        pass


def colocated(model):
    """TRL's VLLMGeneration in colocate mode on one process, built without vllm: the attributes sync_weights()
    reads, the engine a SyncEngine."""
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    generation = object.__new__(VLLMGeneration)
    state = SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None)
    acc = SimpleNamespace(state=state, is_main_process=True, device=next(model.parameters()).device)
    generation.__dict__.update(mode="colocate", enable_sleep_mode=False, accelerator=acc, model=model)
    generation.__dict__.update(llm=SyncEngine(), _dist=DistributedBackend(acc))
    return generation


def run_weight_sync(args):
    """grpo/weight_sync.py's out-of-place sync on the real shape in bf16 (the model loaded as training loads it,
    LoRA-wrapped by grpotrainer.py's config, the adapter part-trained and moved between syncs as Adam moves it):
    SYNCS syncs through TRL's sync_weights() with our walk, then the base checked bit for bit against a copy taken
    before and the engine's weights against the fp32 merge; then SYNCS through TRL's own walk (the control: its
    drift). Each sync timed, CUDA synchronised; the first of each walk is the warm-up."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo import weight_sync

    device, _ = device_and_dtype(args.dry_run)
    # bf16 on the CPU too: the drift is bf16's, and a sync does no matmul worth the fp32 the dry run decodes in
    model = with_lora(AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).to(device))
    lora = {name: p for name, p in model.named_parameters() if "lora_" in name}
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.items():
            if "lora_B" in name:  # peft starts B at zero, where no delta would show
                p.normal_(std=1e-3)
    start = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}
    reset_peak_memory()

    def syncs(generation):
        seconds = []
        for _ in range(SYNCS):
            with torch.no_grad():
                for p in lora.values():
                    p.add_(5e-6 * torch.randn_like(p).sign())  # grpotrainer's LEARNING_RATE, Adam's step size
            seconds.append(timed(generation.sync_weights)[0])
        return seconds

    ours = colocated(model)
    weight_sync.replace_weight_walk(ours)
    ours_s = syncs(ours)
    identical = all(torch.equal(p, start[name]) for name, p in model.named_parameters() if name in start)
    off, elements, worst = 0, 0, 0.0  # the engine's adapted weights against base + delta summed in fp32
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            base = start[name + ".base_layer.weight"]
            a, b = module.lora_A["default"].weight.float(), module.lora_B["default"].weight.float()
            exact = (base.float() + b @ a * module.scaling["default"]).to(base.dtype)
            held = ours.llm.weights[name.removeprefix("base_model.model.") + ".weight"]
            off, elements = off + (held != exact).sum().item(), elements + exact.numel()
            ratio = (held.float() - exact.float()).abs() / exact.float().abs().clamp_min(torch.finfo(base.dtype).tiny)
            worst = max(worst, ratio.max().item())
    rounding = torch.finfo(torch.bfloat16).eps
    trl_s = syncs(colocated(model))  # TRL's in-place merge and unmerge, on the same model
    changed = sum((p != start[n]).sum().item() for n, p in model.named_parameters() if n in start)
    drift = max((p.float() - start[n].float()).abs().max().item() for n, p in model.named_parameters() if n in start)
    record = case_record(
        "weight-sync",
        args.model,
        peak_memory_gib=peak_memory_gib(),
        passed=identical and worst <= rounding,
        base_bit_identical=identical,
        engine_off_exact_merge_share=off / elements,  # 0: the same bits as base + delta in fp32, cast once
        engine_max_relative_off=worst,  # must stay within one bf16 rounding (eps = 2**-7)
        syncs=SYNCS,
        sync_seconds=median(ours_s[1:]),
        sync_seconds_repeats=ours_s,
        trl_sync_seconds=median(trl_s[1:]),
        trl_sync_seconds_repeats=trl_s,
        sync_seconds_ours_over_trl=median(ours_s[1:]) / median(trl_s[1:]),
        trl_base_changed_share=changed / sum(t.numel() for t in start.values()),  # TRL's walk, the control
        trl_base_max_abs_drift=drift,
        adapter_dtype=str(next(iter(lora.values())).dtype).removeprefix("torch."),
    )
    return {"records": [record]}


def eval_prompts(dry_run):
    """(prompts, new tokens): EVAL_BATCH_SIZE GSM8K chat prompts (the fixture's questions, repeated to fill the
    batch) and MAX_COMPLETION_LENGTH, grpotrainer.py's defaults; 16 tokens on the CPU."""
    from grpo import gsm8k

    d = script_defaults(ROOT / "grpotrainer.py", ("EVAL_BATCH_SIZE", "MAX_COMPLETION_LENGTH"))
    questions = [json.loads(line)["question"] for line in FIXTURE.read_text().splitlines() if line.strip()]
    prompts = [gsm8k.make_prompt(questions[i % len(questions)]) for i in range(d["EVAL_BATCH_SIZE"])]
    return prompts, 16 if dry_run else d["MAX_COMPLETION_LENGTH"]


def eval_record(case, args, outputs, seconds, **figures):
    tokens = sum(n for _, n, _ in outputs)
    return case_record(
        case,
        args.model,
        decode_tokens_per_s=tokens / seconds,
        peak_memory_gib=peak_memory_gib(),
        eval_call_seconds=seconds,
        prompts=len(outputs),
        completion_tokens=tokens,
        truncated_share=sum(cut for _, _, cut in outputs) / len(outputs),
        **figures,
    )


def run_eval(args):
    """One held-out evaluation call as grpo/evaluation.py's evaluate_trainer makes it (generation.hf_generator on the
    trainer's LoRA-wrapped model, greedy, one batch of EVAL_BATCH_SIZE prompts), after a two-token warm-up call."""
    from grpo import generation

    model, tokenizer, attn = load_model(args)
    model = with_lora(model).eval()
    prompts, tokens = eval_prompts(args.dry_run)
    generation.hf_generator(model, tokenizer, 2)(prompts[:2])  # CUDA's and the kernels' warm-up
    generate = generation.hf_generator(model, tokenizer, tokens)
    reset_peak_memory()
    outputs = []
    seconds, _ = timed(lambda: outputs.extend(generate(prompts)))
    record = eval_record("eval-hf", args, outputs, seconds, new_tokens=tokens, attn_implementation=attn)
    return {"records": [record]}


def run_eval_vllm(args):
    """The same evaluation call through vLLM (generation.vllm_generator, as evaluate.py builds it; the run's own engine
    holds the same weights), the engine's start timed apart, then a warm-up call and the timed one."""
    from grpo import generation

    prompts, tokens = eval_prompts(args.dry_run)
    longest = generation.longest_prompt({"prompt": prompts}, args.model_dir)
    started = time.perf_counter()
    generate = generation.vllm_generator(
        args.model_dir,
        None,
        prompt_tokens=longest,
        max_completion_length=tokens,
        enable_thinking=False,
        bf16=True,
        trust_remote_code=False,
        gpu_memory_utilization=0.5,
    )
    engine_s = time.perf_counter() - started
    generate(prompts[:2])
    reset_peak_memory()
    outputs = []
    seconds, _ = timed(lambda: outputs.extend(generate(prompts)))
    record = eval_record("eval-vllm", args, outputs, seconds, new_tokens=tokens, engine_start_seconds=engine_s)
    return {"records": [record]}


def memory_allocated_gib():
    import torch

    return torch.cuda.memory_allocated() / GIB if torch.cuda.is_initialized() else None


def reset_peak_memory():
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib():
    import torch

    return torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_initialized() else None


def instrument_trainer(events, memory, *callbacks):
    """In the measuring process only: append TRL's own timings (generation, weight sync, rewards ...) to `events` as
    {name, seconds, cpu_seconds, step}, keep the peak CUDA memory inside and outside generation in `memory`, and
    return the step timer (its `seconds`) that joins, with `callbacks`, the GRPOTrainer grpotrainer.py builds.

    TRL times each generation call with trl.extras.profiling.ProfilingContext but sends the figure only to wandb,
    mlflow or trackio, none of which the GPU machine has, and reads the clock without waiting for the GPU; its
    __enter__/__exit__ are the one place every timing passes through, so they are replaced here with synchronised
    ones. `step` is trainer.state.global_step when the timed block began: the optimiser step in progress minus one.
    grpotrainer.py runs unchanged, so the timer joins the trainer's callbacks when train() is called.
    """
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from trl.extras import profiling

    class StepTimer(TrainerCallback):
        """Whole optimiser steps, on_step_begin to on_step_end, CUDA synchronised at both ends: generation, rewards,
        every micro-batch's forward and backward, gradient clipping and the optimiser step."""

        def __init__(self):
            self.seconds, self._start = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.seconds.append(time.perf_counter() - self._start)

    timer = StepTimer()

    original_exit, original_train = profiling.ProfilingContext.__exit__, GRPOTrainer.train

    def enter(self):
        sync()
        if self.name.split(".", 1)[-1] in GENERATION_NAMES:  # peak so far: training, without the KV cache
            memory["outside"] = max(memory.get("outside") or 0, peak_memory_gib() or 0) or None
            reset_peak_memory()
        self._start_time, self._cpu_start = time.perf_counter(), time.process_time()
        return self

    def exit(self, *exc):
        sync()
        duration = time.perf_counter() - self._start_time
        self._start_time = None  # the original __exit__ below must not log a second, unsynchronised figure
        name = self.name.split(".", 1)[-1]
        cpu = time.process_time() - self._cpu_start
        events.append({"name": name, "seconds": duration, "cpu_seconds": cpu, "step": self.step})
        if name in GENERATION_NAMES:
            memory["generation"] = max(memory.get("generation") or 0, peak_memory_gib() or 0) or None
            reset_peak_memory()
        self._log_metrics(duration)
        return original_exit(self, *exc)

    def train(self, *args, **kwargs):
        for callback in (timer, *callbacks):
            self.add_callback(callback)
        return original_train(self, *args, **kwargs)

    profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__ = enter, exit
    GRPOTrainer.train = train
    return timer


def step_settings(args):
    """grpotrainer.py's settings a step case changes: evaluation off (it would run inside the timed steps), the dry
    run's layout, then the case's own."""
    layout = {**script_defaults(ROOT / "grpotrainer.py", DRY_LAYOUT), "ACTIVATION_CHECKPOINTING": "true"}
    return {**EVAL_OFF, **(layout if args.dry_run else {}), **STEP_CASES[args.case]}


def step_arguments(args, output_dir):
    """grpotrainer.py's command line for a step case: its defaults, on the saved model and the local fixture."""
    common = [f"--MODEL_NAME={args.model_dir}", f"--DATASET={FIXTURE}", f"--OUTPUT_DIR={output_dir}"]
    common += [f"--MAX_STEPS={args.steps}", f"--SAVE_STEPS={args.steps + 1}"]  # no checkpoint inside the timed steps
    settings = [f"--{name}={value}" for name, value in step_settings(args).items()]
    if args.dry_run:  # --smoke: CPU, fp32 (preflight refuses a real run without CUDA), 32 tokens per completion
        # ... in the script's own layout, with activation checkpointing on
        return ["--smoke", *common, *settings, *([DRY_CB_CONFIG] if args.case == "step-cb" else [])]
    return [*common, *settings]


def fp32_check(model):
    """The dtypes training sees (at each step's end, after the loss and the optimizer): the LoRA weights and the
    rotary inv_freq buffers, which must stay fp32 (grpo/patches.py, KeepFp32, under continuous batching in bf16)."""
    lora = {str(p.dtype).removeprefix("torch.") for name, p in model.named_parameters() if "lora_" in name}
    inv_freq = {str(b.dtype).removeprefix("torch.") for name, b in model.named_buffers() if name.endswith("inv_freq")}
    return {"lora": sorted(lora), "inv_freq": sorted(inv_freq)}


def run_step(args):
    """Run grpotrainer.py (unchanged, as __main__) in this process for --steps steps; report the median of the
    steps after the first (the warm-up), and each step."""
    import runpy

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import TrainerCallback

    events, memory, dtypes = [], {}, []

    class DtypeCheck(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            dtypes.append(fp32_check(model))

    timer = instrument_trainer(events, memory, DtypeCheck())
    output_dir = Path(args.work) / f"{args.model}-{args.case}"
    argv = step_arguments(args, output_dir)
    sys.argv = [str(ROOT / "grpotrainer.py"), *argv]
    try:
        runpy.run_path(str(ROOT / "grpotrainer.py"), run_name="__main__")
    except SystemExit as stop:
        if stop.code:
            raise RuntimeError(f"grpotrainer.py {' '.join(argv)} exited with status {stop.code}") from None
    memory["outside"] = max(memory.get("outside") or 0, peak_memory_gib() or 0) or None  # after the last generation
    (run,) = (output_dir / "runs").iterdir()
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    defaults = grpo_defaults(**step_settings(args))
    shape, dtype_bytes = shape_of(args), 4 if args.dry_run else 2
    batch = defaults["generation_batch"]  # completions per optimiser step (the dry run keeps the layout)
    steps = []
    for i in range(1, args.steps):  # global_step i while step i + 1 ran; the first step is the warm-up
        step_s = timer.seconds[i]
        tokens = scalars["train/num_tokens"][i] - scalars["train/num_tokens"][i - 1]  # prompt + completion
        gen = [e for e in events if e["step"] == i and e["name"] in GENERATION_NAMES]
        gen_s, gen_cpu_s = sum(e["seconds"] for e in gen), sum(e["cpu_seconds"] for e in gen)
        sync_s = sum(e["seconds"] for e in events if e["step"] == i and e["name"] == "sync_weights")
        completion_tokens = scalars["train/completions/mean_length"][i] * batch
        longest = scalars["train/completions/max_length"][i]  # decode steps of the generation round
        step_bytes = decode_step_bytes(shape, dtype_bytes, batch, (tokens - completion_tokens) / batch, longest)
        flops = tokens * training_flops_per_token(shape, defaults["beta"])
        steps.append({
            "step_seconds": step_s,
            "generation_share": gen_s / step_s,
            "decode_tokens_per_s": completion_tokens / gen_s,
            "bandwidth_fraction": step_bytes * longest / gen_s / args.calibration["bandwidth_bytes_per_s"],
            "matmul_efficiency": flops / (step_s - gen_s - sync_s) / args.calibration["matmul_flops_per_s"],
            "generation_seconds": gen_s,
            "weight_sync_seconds": sync_s,
            "cpu_seconds_per_token": gen_cpu_s / completion_tokens,  # generation's process CPU time / tokens
            "tokens": tokens,
            "completion_tokens": completion_tokens,
        })  # fmt: skip
    peaks = [m for m in (memory.get("outside"), memory.get("generation")) if m is not None]
    record = case_record(
        args.case,
        args.model,
        **medians(steps),  # of the timed steps
        peak_memory_gib=max(peaks) if peaks else None,
        peak_memory_no_kv_gib=memory.get("outside"),  # outside generation: no KV cache, paged or not
        completions=batch,
        timed_steps=steps,  # each timed step's figures
        steps_seconds=timer.seconds,  # every step, the warm-up first
        trl_step_time=scalars["train/step_time"],  # TRL's own figure: training_step calls, unsynchronised
        dtypes=dtypes[-1],
        grpotrainer_args=argv,
    )
    if args.case != "step-cb":
        return {"records": [record]}
    # after continuous batching (TRL casts the model to bf16 before each generate_batch), at every step's end
    passed = all(d[kind] == ["float32"] for d in dtypes for kind in ("lora", "inv_freq"))
    check = case_record("dtype-after-cb", args.model, passed=passed, dtypes_per_step=dtypes)
    return {"records": [record, check]}


def shape_of(args):
    from demo import smoke

    return {**smoke.TINY_QWEN3, **(DRY_SHAPES if args.dry_run else SHAPES)[args.model]}


def run_case(args):
    """Child process: run args.case and write its result to args.result."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.calibration = json.loads(args.calibration) if args.calibration else None
    run = {"calibrate": run_calibrate, "build": run_build, "decode": run_decode, "decode-static": run_decode}
    run |= {"weight-sync": run_weight_sync, "eval": run_eval, "eval-vllm": run_eval_vllm}
    result = run.get(args.case, run_step)(args)
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# the parent: plans the cases, runs each in a child under its budget and the deadline, writes the JSON


def in_child(args, case, budget, deadline, model=None, **extra):
    """Run one case in a child process; return (result dict or None, status, reason, seconds).

    A case whose budget is more than the time left before `deadline` is not started: "skipped". One that outlives
    its budget is killed with everything it started: "timeout", a failure like "error"."""
    left = deadline - time.monotonic()
    if budget > left:
        return None, "skipped", f"its budget of {budget:.0f} s is more than the {max(left, 0):.0f} s left", 0.0
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", case, "--result", str(result), "--work", args.work]
    cmd += ["--steps", str(args.steps), *(["--dry-run"] if args.dry_run else [])]
    cmd += [*(["--model", model] if model else []), *[f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = Path(args.logs) / f"{model or 'device'}-{case}.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started (vLLM workers)
            proc.wait()
            return None, "timeout", f"took longer than its budget of {budget:.0f} s; log {log}", budget
    seconds = time.monotonic() - started
    if code or not result.stat().st_size:
        tail = log.read_text()[-2000:]
        return None, "error", f"exit status {code}; log {log}: ...{tail}", seconds
    return json.loads(result.read_text()), "ok", None, seconds


def fits(shape, calibration, work):
    """Why a model cannot be measured here, or None: GPU memory for training (about 3x the bf16 weights plus 8 GiB
    for activations, logits and generation), and disk for the saved weights."""
    weights = param_count(shape) * 2
    total = calibration.get("total_memory_gib")
    if total is not None and total * GIB < 3 * weights + 8 * GIB:
        return f"needs about {(3 * weights) / GIB + 8:.0f} GiB of GPU memory, the GPU has {total:.0f} GiB"
    free = os.statvfs(work).f_bavail * os.statvfs(work).f_frsize
    if free < weights * 1.1 + GIB:
        return f"needs {weights * 1.1 / GIB + 1:.0f} GiB of free disk in {work}, {free / GIB:.0f} GiB free"
    return None


def environment():
    from importlib.metadata import PackageNotFoundError, version

    def ver(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    names = ("torch", "transformers", "trl", "peft", "accelerate", "flash-attn", "flash-attn-3", "kernels", "vllm")
    return {name: ver(name) for name in names}


def output_path(environ):
    """Where the JSON goes: $GPU_CHECK_OUT, else $OUT/gpu_check.json (the GPU machine returns only what lies under
    $OUT), else outputs/bench/gpu_check.json. The per-case logs go beside it, in gpu_check-logs/.

    >>> str(output_path({"OUT": "/o"})), str(output_path({"OUT": "/o", "GPU_CHECK_OUT": "/g.json"}))
    ('/o/gpu_check.json', '/g.json')
    """
    if environ.get("GPU_CHECK_OUT"):
        return Path(environ["GPU_CHECK_OUT"])
    return Path(environ["OUT"]) / "gpu_check.json" if environ.get("OUT") else ROOT / "outputs/bench/gpu_check.json"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.case:
        return run_case(args)
    started = time.monotonic()
    deadline = started + args.deadline
    out = output_path(os.environ)
    args.logs = str(out.parent / "gpu_check-logs")
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    args.work = args.work or tempfile.mkdtemp(prefix="gpu-check-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    report = {
        "benchmark": "gpu_check",
        "dry_run": args.dry_run,
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "deadline_s": args.deadline,
        "versions": environment(),
        "host": host_facts(),
        "plan": [f"{model} {case}" for model in args.models for case in ("build", *args.cases)],
        "calibration": None,
        "cases": [],
        "failed": [],
        "skipped": [],
        "complete": False,
    }

    def save(line):
        summarise(report)
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(line, flush=True)

    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            why = "no CUDA GPU is visible; `bash bench/gpu_check.sh --dry-run` checks the code path on CPU"
            report["cases"].append(case_record("calibrate", None, status="error", reason=why))
            save(f"error: {why}")
            return report
    budget = (lambda kind, model=None: DRY_BUDGET) if args.dry_run else budget_of
    calibration, status, reason, seconds = in_child(args, "calibrate", budget("calibrate"), deadline)
    report["cases"].append(case_record("calibrate", None, status=status, reason=reason, seconds=seconds))
    if calibration is None:
        save(f"calibrate: {status}: {reason}")
        return report
    report["calibration"] = calibration
    save(f"calibrate: {calibration['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s copy, "
         f"{calibration['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s {calibration['matmul_dtype']} matmul")  # fmt: skip
    for model in args.models:
        for record in run_model(args, model, calibration, budget, deadline):
            report["cases"].append(record)
            save(summary(record))
    save(f"wrote {out} ({len(report['failed'])} failed, {len(report['skipped'])} skipped)")
    return report


def summarise(report):
    """Fill in `failed` and `skipped` (as "model case") and `complete`: some case ran and every case that ran
    succeeded. A skipped case is not a failure; a timeout is (the case outlived its own budget)."""
    named = [(f"{c['model'] or 'device'} {c['case']}", c.get("status")) for c in report["cases"]]
    report["failed"] = [name for name, status in named if status in FAILED]
    report["skipped"] = [name for name, status in named if status == "skipped"]
    report["complete"] = any(status == "ok" for _, status in named) and not report["failed"]
    decode = [c for c in report["cases"] if c["case"] == "decode-lora-b1" and c.get("status") == "ok"]
    if decode and "host" in report:  # what eager decoding costs the host, from the first model's decode at batch 1
        keys = ("cpu_seconds_per_token", "launches_per_token")
        report["host"].update({"decode_model": decode[0]["model"], **{k: decode[0].get(k) for k in keys}})
    return report


def budget_of(kind, model=None):
    value = BUDGETS[kind if kind in BUDGETS else "step" if kind in STEP_CASES else kind]
    return value[model] if model else value


def run_model(args, model, calibration, budget, deadline):
    """Yield the case records of one model: build it, decode eager and static, then each step case. A case that
    needs the model folder is skipped when the build did not run or failed."""
    from grpo import hardware

    if not args.dry_run and (why := fits(SHAPES[model], calibration, args.work)):
        yield case_record("build", model, status="skipped", reason=why)
        return
    model_dir = str(Path(args.work) / model)
    built, status, reason, seconds = in_child(
        args, "build", budget("build", model), deadline, model, model_dir=model_dir
    )
    yield case_record("build", model, status=status, reason=reason, seconds=seconds, **(built or {}))
    if built is None:
        why = f"needs the model folder, and the build was {status}"
        for case in args.cases:
            yield case_record(case, model, status="skipped", reason=why)
        return
    calib = json.dumps(calibration)
    for case in args.cases:
        if case in VLLM_CASES and (args.dry_run or not hardware.importable("vllm")):
            why = "needs a CUDA GPU and vllm (requirements-vllm.txt)"
            yield case_record(case, model, status="skipped", reason=why)
            continue
        result, status, reason, seconds = in_child(
            args, case, budget(case, model), deadline, model, model_dir=model_dir, calibration=calib
        )
        for record in result["records"] if result else [case_record(case, model)]:
            failed = record.get("passed") is False  # a check that ran and found what it checks wrong
            found = {
                k: record[k]
                for k in ("dtypes_per_step", "base_bit_identical", "engine_max_relative_off")
                if k in record
            }
            why = f"failed: {json.dumps(found)}" if failed else reason
            yield {**record, "status": "error" if failed else status, "reason": why, "seconds": seconds,
                   "budget_s": budget(case, model)}  # fmt: skip


def summary(record):
    """One line per case for the terminal."""
    if record.get("status") != "ok":
        return f"{record['model']} {record['case']}: {record.get('status')}: {record.get('reason')}"
    shown = {k: record[k] for k in (*KEYS, "matmul_efficiency", "seconds") if record.get(k) is not None}
    passed = [f"passed {record['passed']}"] if "passed" in record else []
    return f"{record['model']} {record['case']}: " + ", ".join(passed + [f"{k} {v:.3g}" for k, v in shown.items()])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU: checks the code path, not speed")
    p.add_argument("--quick", action="store_true", help="Qwen3-0.6B: calibrate, build, decode, step-generate")
    p.add_argument("--models", help=f"comma list of {', '.join(SHAPES)} (dry run: {', '.join(DRY_SHAPES)})")
    p.add_argument("--cases", help=f"cases to run after each build (default: {', '.join(CASES)})")
    p.add_argument("--steps", type=int, default=3, help="optimiser steps per step case; the median after the first")
    p.add_argument("--deadline", type=float, default=None, help=f"seconds for the whole run ({DEADLINE})")
    p.add_argument("--work", help="folder for the models and runs (default: a new temporary folder)")
    p.add_argument("--spent", type=float, default=0.0, help=argparse.SUPPRESS)  # seconds gpu_check.sh used
    for hidden in ("--case", "--result", "--model", "--model-dir", "--calibration"):
        p.add_argument(hidden, help=argparse.SUPPRESS)  # internal: one case in a child process
    args = p.parse_args(argv)
    known = DRY_SHAPES if args.dry_run else SHAPES
    quick = QUICK if args.quick else {}
    default_models = DRY_MODELS if args.dry_run else quick.get("models", DEFAULT_MODELS)
    args.models = args.models.split(",") if args.models else default_models
    cases = args.cases.split(",") if args.cases else quick.get("cases", CASES)
    if bad := [m for m in args.models if m not in known] + [c for c in cases if c not in CASES]:
        p.error(f"unknown model or case {bad}; models: {', '.join(known)}; cases: {', '.join(CASES)}")
    args.cases = [c for c in CASES if c in cases]
    if args.steps < 2:
        p.error("--steps must be at least 2: the first step is warm-up")
    args.deadline = (args.deadline or (1200 if args.dry_run else quick.get("deadline", DEADLINE))) - args.spent
    return args


def exit_status(report):
    """0 unless a case failed (an error or a timeout); skipped cases are reported, not failures."""
    return 1 if report is not None and report["failed"] else 0


if __name__ == "__main__":
    sys.exit(exit_status(main()))
