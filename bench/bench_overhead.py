"""How much does our pipeline cost per step over a bare GRPOTrainer script? A CPU benchmark, in one run.

    python bench/bench_overhead.py                                   # ~1 min on 2 cores; prints the ratio
    python bench/bench_overhead.py --steps 20 --repeats 5 --json outputs/bench/overhead.json

Both sides train the same tiny random Qwen3 (demo/smoke.py) on the same fixture prompts, rewards, LoRA and
GRPO settings (the --smoke constants of grpotrainer.py), in this one process, interleaved ours/bare/bare/ours/...
so that drift in the machine's speed hits both. "Ours" is `grpotrainer.main(["--smoke", ...])` unchanged: preflight,
TensorBoard logging every step, our data loading. "Bare" is a GRPOTrainer built by hand below, reporting nowhere.
Only checkpoints are kept out of the timed window on both sides (a tiny model's save would swamp a 0.2 s step and
says nothing about a real run, which saves every SAVE_STEPS ~ 60 s steps).

A step is timed from one optimiser step's start to the next's (generation, rewards, loss, backward, optimiser,
logging); the first --warmup steps of each run are dropped, and start-up (imports, model load) is never timed.
The result is ours/bare per repeat (median step over median step) and its spread across repeats.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent  # the checkout: grpotrainer.py, demo/smoke.py, rewards.py, data/


def step_timer():
    """A TrainerCallback recording when each optimiser step begins; consecutive differences are step times."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begins = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begins.append(time.perf_counter())

    return StepTimer()


def step_times(timer, warmup):
    """Seconds per step after the first `warmup` steps (the last step has no successor, so it is not counted)."""
    b = timer.begins
    return [b[i + 1] - b[i] for i in range(warmup, len(b) - 1)]


def run_ours(model_dir, steps, out_dir):
    """grpotrainer.main with --smoke, timed by a callback slipped into the GRPOTrainer it builds."""
    import trl

    import grpotrainer

    timer = step_timer()

    class TimedGRPOTrainer(trl.GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(timer)

    argv = ["--smoke", f"--OUTPUT_DIR={out_dir}", f"--MODEL_NAME={model_dir}", f"--MAX_STEPS={steps}"]
    argv.append(f"--SAVE_STEPS={steps + 1}")  # no checkpoint inside the timed window (see the docstring)
    with mock.patch.object(trl, "GRPOTrainer", TimedGRPOTrainer):  # main() does `from trl import GRPOTrainer`
        trainer = grpotrainer.main(argv)
    return timer, trainer


def smoke_constants():
    """grpotrainer's constants as --smoke sets them: the numbers the bare script copies, nothing else."""
    import grpotrainer
    from demo import smoke
    from grpo import cli

    return {**cli.constants(grpotrainer), **smoke.SETTINGS}


def run_bare(model_dir, steps, out_dir):
    """The shortest GRPOTrainer script that does the same work: same model, prompts, rewards, LoRA, GRPO numbers."""
    import datasets
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    import rewards
    from grpo import grading, reward_guard

    c = smoke_constants()
    rows = [json.loads(line) for line in Path(c["DATASET"]).read_text(encoding="utf-8").splitlines() if line.strip()]
    system = {"role": "system", "content": c["SYSTEM_PROMPT"]}
    dataset = datasets.Dataset.from_dict(
        {
            "prompt": [[system, {"role": "user", "content": r["question"]}] for r in rows],
            "answer": [grading.extract_hash_answer(r["answer"]) for r in rows],
        }
    )
    length = c["MAX_COMPLETION_LENGTH"]
    funcs = [reward_guard.bind(rewards.REWARDS[name], max_completion_length=length) for name in c["REWARD_FUNCS"]]
    args = GRPOConfig(
        output_dir=str(out_dir),
        model_init_kwargs={"dtype": "float32", "attn_implementation": "sdpa"},
        chat_template_kwargs={"enable_thinking": c["ENABLE_THINKING"]},
        num_generations=c["NUM_GENERATIONS"],
        max_completion_length=c["MAX_COMPLETION_LENGTH"],
        temperature=c["TEMPERATURE"],
        beta=c["BETA"],
        loss_type=c["LOSS_TYPE"],
        scale_rewards=c["SCALE_REWARDS"],
        num_iterations=c["NUM_ITERATIONS"],
        mask_truncated_completions=c["MASK_TRUNCATED_COMPLETIONS"],
        reward_weights=c["REWARD_WEIGHTS"],
        learning_rate=c["LEARNING_RATE"],
        per_device_train_batch_size=c["PER_DEVICE_TRAIN_BATCH_SIZE"],
        gradient_accumulation_steps=c["GRADIENT_ACCUMULATION_STEPS"],
        max_steps=steps,
        gradient_checkpointing=c["ACTIVATION_CHECKPOINTING"],  # transformers 5.17 name (requirements.txt)
        bf16=False,
        use_cpu=True,
        seed=c["SEED"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    lora = LoraConfig(
        r=c["LORA_R"],
        lora_alpha=c["LORA_ALPHA"],
        lora_dropout=c["LORA_DROPOUT"],
        target_modules=c["LORA_TARGET_MODULES"],
        task_type="CAUSAL_LM",
    )
    timer = step_timer()
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=funcs, args=args, train_dataset=dataset, peft_config=lora, callbacks=[timer]
    )
    trainer.train()
    return timer, trainer


def compare(ours, bare):
    """ours/bare from runs that did the same work step by step (same seed, so step k samples the same completions
    on both sides): step k's fastest time over the repeats on each side, since other load on the machine only ever
    adds time; then the ratio and the difference per step, summarised over the steps."""
    best_ours = [min(times) for times in zip(*ours, strict=True)]
    best_bare = [min(times) for times in zip(*bare, strict=True)]
    ratios = [o / b for o, b in zip(best_ours, best_bare, strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {
        "ratio": median,
        "ratio_q1": q1,
        "ratio_q3": q3,
        "extra_ms_per_step": 1000 * statistics.median(o - b for o, b in zip(best_ours, best_bare, strict=True)),
        "ours_step_s": statistics.median(best_ours),
        "bare_step_s": statistics.median(best_bare),
        "timed_steps": len(ratios),
    }


def last_num_tokens(trainer):
    """Tokens processed by the end of training, as TRL logs them: equal on both sides means equal work."""
    return next((h["num_tokens"] for h in reversed(trainer.state.log_history) if "num_tokens" in h), None)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="optimiser steps per run (default 16)")
    p.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run (default 2)")
    p.add_argument("--repeats", type=int, default=4, help="ours/bare pairs, order alternating (default 4)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared box)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.steps < args.warmup + 2:
        p.error("--steps must be at least --warmup + 2 so that one step is timed")
    return args


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch
    import trl

    from demo.smoke import ensure_model_dir

    torch.set_num_threads(args.threads)
    runs = {"ours": [], "bare": []}
    tokens = {"ours": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        model_dir = ensure_model_dir(Path(tmp) / "smoke-model")  # one model folder, loaded by both sides
        for r in range(args.repeats):
            for side in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
                run = run_ours if side == "ours" else run_bare
                timer, trainer = run(model_dir, args.steps, Path(tmp) / f"{side}-{r}")
                runs[side].append(step_times(timer, args.warmup))
                tokens[side].append(last_num_tokens(trainer))
                median = statistics.median(runs[side][-1])
                print(f"[bench] repeat {r + 1}/{args.repeats} {side}: median step {median:.4f} s", flush=True)
                del trainer

    per_repeat = [statistics.median(o) / statistics.median(b) for o, b in zip(runs["ours"], runs["bare"], strict=True)]
    result = {
        "benchmark": "overhead",
        **compare(runs["ours"], runs["bare"]),
        "ratio_per_repeat": per_repeat,  # the spread that load from other processes causes
        "same_tokens": tokens["ours"] == tokens["bare"],  # identical sampling on both sides: the same work was timed
        "num_tokens": tokens,
        "step_times_s": runs,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "trl": trl.__version__},
    }
    print(
        f"ours/bare time per step: {result['ratio']:.3f} (interquartile range over steps {result['ratio_q1']:.3f}-"
        f"{result['ratio_q3']:.3f}; per-repeat medians {min(per_repeat):.3f}-{max(per_repeat):.3f}), "
        f"{result['extra_ms_per_step']:+.1f} ms per step; step ours {result['ours_step_s']:.4f} s, bare "
        f"{result['bare_step_s']:.4f} s; same tokens: {result['same_tokens']}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
