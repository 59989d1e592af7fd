"""Plot demo runs (one OUTPUT_DIR per seed): what GRPO changed on the held-out problems, and the training curve.

    python grpotrainer.py --demo --SEED=0 --OUTPUT_DIR=outputs/demo-s0     # one run per seed (docs/demo.md)
    python bench/plot_demo.py outputs/demo-s0 outputs/demo-s1 outputs/demo-s2 --out demo.png
    python bench/plot_demo.py outputs/demo-s* --out docs/demo.png --overwrite   # replace the tracked picture

Four panels, one line per seed: greedy lenient and sampled accuracy, the share of greedy answers that are worked
solutions (demo.sums.style) and the mean completion length, each before -> after GRPO (from
eval_test_{before,after}.json and their predictions), and the correctness reward per GRPO step from the training
run's own TensorBoard folder (the one holding train/reward, not a later evaluation's). An existing file is never
replaced without --overwrite.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # grpo/, when run as bench/plot_demo.py

REWARD = "train/reward"
CORRECTNESS = "train/rewards/correctness_reward/mean"


def run_folder(path):
    """The training run's TensorBoard folder: `path` itself if it holds event files, else the newest folder in
    path/runs whose events hold train/reward (an evaluate.py run logs only eval/* and is skipped)."""
    path = Path(path)
    if any(path.glob("events.out.tfevents.*")):
        return path
    runs = sorted((p for p in (path / "runs").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    training = [run for run in runs if REWARD in read_scalars(run)]
    if not training:
        raise SystemExit(f"no TensorBoard run with {REWARD} in {path / 'runs'}: is {path} a grpotrainer.py run?")
    return training[-1]


def read_scalars(logdir):
    """{tag: [(step, value), ...]} from one run folder, read with tensorboard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def running_mean(values, window=5):
    """The mean of each value and the up to window-1 before it.

    >>> running_mean([1, 2, 3, 4], window=2)
    [1.0, 1.5, 2.5, 3.5]
    """
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def before_after(output_dir):
    """{metric: (before, after)} of one demo run: lenient and sampled accuracy, worked share, completion tokens."""
    from demo import sums

    parts = []
    for when in ("before", "after"):
        metrics = json.loads((Path(output_dir) / f"eval_test_{when}.json").read_text(encoding="utf-8"))
        with open(Path(output_dir) / f"eval_test_{when}_predictions.jsonl", encoding="utf-8") as f:
            metrics |= sums.style_stats([json.loads(line) for line in f])
        parts.append(metrics)
    keys = ("lenient_accuracy", "sampled_accuracy", "worked_share", "mean_completion_tokens")
    return {k: (parts[0][k], parts[1][k]) for k in keys}


def plot(runs, out):
    """Write the four-panel PNG to `out`; `runs` maps a label (the seed) to (before_after, scalars)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench/plot_demo.py needs matplotlib: pip install -r requirements-dev.txt") from None
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.4), dpi=100)
    panels = [
        ("held-out accuracy", "accuracy", ("lenient_accuracy", "sampled_accuracy"), (-0.05, 1.05)),
        ("greedy answers that are worked", "share", ("worked_share",), (-0.05, 1.05)),
        ("mean completion length", "tokens", ("mean_completion_tokens",), None),
    ]
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for ax, (title, ylabel, keys, ylim) in zip(axes, panels, strict=False):
        for (label, (values, _)), color in zip(runs.items(), colors, strict=False):
            for key, dash in zip(keys, ("-", "--"), strict=False):
                name = f"{label} {key.split('_')[0]}" if len(keys) > 1 else label
                text = f"{name}: {values[key][0]:.2f} -> {values[key][1]:.2f}"
                ax.plot([0, 1], values[key], dash, marker="o", color=color, label=text)
        ax.set(title=title, ylabel=ylabel, xticks=[0, 1], xticklabels=["before", "after GRPO"], xlim=(-0.2, 1.2))
        if ylim:
            ax.set_ylim(*ylim)
        ax.legend(fontsize=7, loc="best")
    for (label, (_, scalars)), color in zip(runs.items(), colors, strict=False):
        if CORRECTNESS in scalars:
            steps, values = zip(*scalars[CORRECTNESS], strict=True)
            axes[3].plot(steps, running_mean(list(values)), color=color, label=label)
    axes[3].set(title="correctness reward (mean of 5 steps)", xlabel="GRPO step", ylim=(-0.05, 1.05))
    axes[3].legend(fontsize=7, loc="lower right")
    fig.suptitle("grpotrainer.py --demo: before -> after GRPO, per seed (solid lenient, dashed sampled)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv):
    parser = argparse.ArgumentParser(description="Plot demo runs, one OUTPUT_DIR per seed.")
    parser.add_argument("output_dirs", nargs="+", help="demo OUTPUT_DIRs (grpotrainer.py --demo --OUTPUT_DIR=...)")
    parser.add_argument("--out", default="demo.png", help="the PNG to write (default demo.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (docs/demo.png: ask)")
    args = parser.parse_args(argv)
    if Path(args.out).exists() and not args.overwrite:
        raise SystemExit(f"{args.out} exists (docs/demo.png is tracked): pass --overwrite to replace it")
    runs = {}
    for folder in args.output_dirs:
        missing = [f for f in ("eval_test_before.json", "eval_test_after.json") if not (Path(folder) / f).is_file()]
        if missing:
            raise SystemExit(f"{folder} has no {missing[0]}: is it a finished grpotrainer.py --demo run?")
        settings = json.loads((Path(folder) / "eval_test_after.json").read_text(encoding="utf-8"))["settings"]
        runs[f"seed {settings.get('SEED', folder)}"] = (before_after(folder), read_scalars(run_folder(folder)))
    print(plot(runs, args.out))


if __name__ == "__main__":
    main(sys.argv[1:])
