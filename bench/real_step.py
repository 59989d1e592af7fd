"""Where a GRPO step of SmolLM2-135M-Instruct spends its CPU time, and what each lever saves, in one run.

    python bench/real_step.py                     # every lever, 2 steps each; ~10 CPU-minutes
    python bench/real_step.py --levers baseline,beta0 --json outputs/bench/real_step.json

Needs the model folder (`make real-model`). Each lever is one `grpotrainer.py --smoke` run in its own process, 2
GRPO steps on the `--real` task (demo/real.py, seed 0), no evaluation, no checkpoint. "baseline" is today's step
as docs/real-model.md first ran it, made small to fit a shared machine: 8 completions (2 problems x 4) of up to 64
tokens, the default system prompt, BETA 0.05 (a reference pass), fp32, micro-batches of 4, one thread. Each other
lever changes one thing; "real" (only when named: 4 times the work) is the `--real` profile itself. baseline runs
first and last, so that drift in the machine's load shows.

CPU time is what survives a shared machine: each run's user+sys CPU of the child (os.wait4), its max RSS, and,
measured inside it, the CPU time of `trainer.train()` (time.process_time, every thread) split between TRL's
methods: generation (`_generate`), the reference forward (`_get_per_token_logps_and_entropies` while scoring a
batch), the policy forward (the same method inside the loss), backward (`Accelerator.backward`), rewards
(`_calculate_rewards`), logging (`log`, the callbacks' writes included) and the rest (optimiser, advantages,
tokenising). A lever's ratio is its train CPU per completion over baseline's (the mean of its two runs).

"bf16" runs with BF16=True even on a CPU without bf16 instructions, where preflight refuses it (grpo/hardware.py's
cpu_bf16 is replaced in that child only); the output says which it was.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = [  # the task and the run's length; the model and the task are added in main()
    "--MAX_STEPS=2",
    "--SAVE_STEPS=100",
    "--EVAL_BEFORE=0",
    "--EVAL_AFTER=0",
    "--SEED=0",
]
BASELINE = [  # today's step: docs/real-model.md's first run, on the --real task
    "--MAX_COMPLETION_LENGTH=64",
    "--NUM_GENERATIONS=4",
    "--PER_DEVICE_TRAIN_BATCH_SIZE=4",
    "--GRADIENT_ACCUMULATION_STEPS=2",
    "--TEMPERATURE=0.7",
    "--BETA=0.05",
    "--BF16=False",
]
SHORT_PROMPT = "--SYSTEM_PROMPT=Solve it. End with '#### N'."
LEVERS = {  # name: (extra arguments after BASELINE, environment)
    "baseline": ([], {}),
    "bf16": (["--BF16=True"], {}),
    "beta0": (["--BETA=0"], {}),
    "short_prompt": ([SHORT_PROMPT], {}),
    "len32": (["--MAX_COMPLETION_LENGTH=32"], {}),
    "threads2": ([], {"OMP_NUM_THREADS": "2"}),
    "microbatch8": (["--PER_DEVICE_TRAIN_BATCH_SIZE=8", "--GRADIENT_ACCUMULATION_STEPS=1"], {}),
}
ORDER = ["baseline", "bf16", "beta0", "short_prompt", "len32", "threads2", "microbatch8"]  # + baseline; "real": 4x


class Split:
    """CPU seconds of each wrapped method, exclusive of the wrapped methods it calls (a stack of inner times)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.stack = []
        self.scoring = False  # inside _generate_and_score_completions: a forward there is the reference's

    def wrap(self, cls, method, name):
        original = getattr(cls, method)

        def timed(*args, **kwargs):
            label = name(self) if callable(name) else name
            start = time.process_time()
            self.stack.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.process_time() - start
                self.seconds[label] += spent - self.stack.pop()
                if self.stack:
                    self.stack[-1] += spent

        setattr(cls, method, timed)


def child(argv, out):
    """One run of grpotrainer.main(argv) with its methods timed; the split and phases' RSS to `out` (JSON)."""
    import accelerate
    import trl
    from transformers import TrainerCallback

    import grpotrainer
    from grpo import hardware

    if "--BF16=True" in argv:
        info = {"cpu_bf16": hardware.cpu_bf16()}
        hardware.cpu_bf16 = lambda: True  # measure bf16 here even where preflight would refuse it
    else:
        info = {}
    split = Split()
    score = trl.GRPOTrainer._generate_and_score_completions

    def scoring(self, *args, **kwargs):
        split.scoring = True
        try:
            return score(self, *args, **kwargs)
        finally:
            split.scoring = False

    trl.GRPOTrainer._generate_and_score_completions = scoring
    split.wrap(trl.GRPOTrainer, "_generate_and_score_completions", "rest")
    split.wrap(trl.GRPOTrainer, "_generate", "generation")
    split.wrap(trl.GRPOTrainer, "_calculate_rewards", "rewards")
    forward = lambda s: "reference forward" if s.scoring else "policy forward"  # noqa: E731
    split.wrap(trl.GRPOTrainer, "_get_per_token_logps_and_entropies", forward)
    split.wrap(accelerate.Accelerator, "backward", "backward")
    split.wrap(trl.GRPOTrainer, "log", "logging")
    window = {}

    class Window(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            window["begin"] = time.process_time()
            window["rss_before_train_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        def on_train_end(self, args, state, control, **kwargs):
            window["train_cpu_s"] = time.process_time() - window.pop("begin")
            window["steps"] = state.global_step

    init = trl.GRPOTrainer.__init__

    def with_window(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Window())
        window["completions_per_step"] = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    trl.GRPOTrainer.__init__ = with_window
    grpotrainer.main(argv)
    split.seconds["rest"] += window["train_cpu_s"] - sum(split.seconds.values())
    Path(out).write_text(json.dumps({**info, **window, "split_s": dict(split.seconds)}))


def run_lever(name, model, task, work, python, label=None):
    """One lever's child run in work/<label> (default: the lever's name), with its log and result beside it."""
    extra, env = LEVERS[name]
    label = label or name
    output = Path(work) / label
    if extra is None:
        argv = ["--real", f"--OUTPUT_DIR={output}", *COMMON]
    else:
        argv = ["--smoke", f"--MODEL_NAME={model}", f"--DATASET={task}", f"--OUTPUT_DIR={output}"]
        argv += [*COMMON, *BASELINE, *extra]
    result = Path(work) / f"{label}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", **env}
    cmd = [python, __file__, "--child", str(result), "--", *argv]
    started = time.perf_counter()
    with open(Path(work) / f"{label}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed (exit {os.waitstatus_to_exitcode(status)}): see {Path(work) / label}.log")
    inside = json.loads(result.read_text())
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "max_rss_mib": round(usage.ru_maxrss / 1024),
        "load_1min": round(os.getloadavg()[0], 1),
        **inside,
    }


def summarize(runs):
    """Each run's train CPU per completion over baseline's mean, and the baseline's split as shares."""
    base = [r for name, r in runs if name == "baseline"]
    per = lambda r: r["train_cpu_s"] / (r["steps"] * r["completions_per_step"])  # noqa: E731
    base_per = sum(per(r) for r in base) / len(base)
    rows = []
    for name, r in runs:
        rows.append({"lever": name, "ratio": round(per(r) / base_per, 2), **r})
    total = sum(sum(r["split_s"].values()) for r in base)
    shares = defaultdict(float)
    for r in base:
        for part, seconds in r["split_s"].items():
            shares[part] += seconds / total
    return rows, {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levers", default=",".join(ORDER), help="comma list, in this order (baseline twice)")
    parser.add_argument("--json", type=Path, help="write the rows and the split here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child:
        sys.path.insert(0, str(ROOT))
        return child([a for a in rest if a != "--"], args.child)
    sys.path.insert(0, str(ROOT))
    from demo import real

    model = ROOT / real.MODEL
    if not (model / "config.json").is_file():
        raise SystemExit(f"no model at {model}: run `make real-model` first")
    names = args.levers.split(",")
    if names[-1] != "baseline" and names.count("baseline") == 1:
        names.append("baseline")
    work = tempfile.mkdtemp(prefix="real-step-")  # kept: each lever's log and output folder
    task = real.write_task(Path(work) / "task", 0)
    runs = []
    for i, name in enumerate(names):  # a folder per run: the closing baseline must not find the first one finished
        runs.append((name, run_lever(name, model, task, work, sys.executable, label=f"{i}-{name}")))
        print(json.dumps({"lever": name, **runs[-1][1]}), flush=True)
    rows, shares = summarize(runs)
    print("baseline's train CPU by part:", json.dumps(shares))
    print(f"{'lever':<14}{'ratio':>7}{'train CPU s':>13}{'child CPU s':>13}{'max RSS MiB':>13}{'wall s':>9}")
    for r in rows:
        print(
            f"{r['lever']:<14}{r['ratio']:>7}{r['train_cpu_s']:>13.1f}{r['cpu_s']:>13}{r['max_rss_mib']:>13}{r['wall_s']:>9}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "baseline_split": shares}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
