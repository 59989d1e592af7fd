"""Plot a demo run from its TensorBoard event files: train/reward and the held-out accuracies against the step.

    python grpotrainer.py --demo                                  # the run (docs/demo.md)
    python bench/plot_demo.py outputs/demo docs/demo.png          # OUTPUT_DIR (or one runs/<run> folder), PNG

The reward is drawn per step (light) and as a running mean over 5 steps; the accuracies are the EVAL_BEFORE (step 0)
and EVAL_AFTER (last step) points that grpotrainer.py logs: greedy strict, greedy lenient, sampled.
"""

import sys
from pathlib import Path

REWARD = "train/reward"
PARTS = {  # the reward's parts, each a share of the step's completions (0-1)
    "train/rewards/correctness_reward/mean": "correctness (lenient: any answer form)",
    "train/rewards/format_reward/mean": "format ('#### N' last)",
}
ACCURACIES = {  # tag -> legend label
    "eval/gsm8k_strict_accuracy": "greedy strict ('#### N' only)",
    "eval/gsm8k_lenient_accuracy": "greedy lenient (any answer form)",
    "eval/gsm8k_sampled_accuracy": "sampled (training temperature)",
}


def run_folder(path):
    """The TensorBoard run folder: `path` itself if it holds event files, else the newest one in path/runs."""
    path = Path(path)
    if any(path.glob("events.out.tfevents.*")):
        return path
    runs = sorted((p for p in (path / "runs").glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no TensorBoard events in {path} or {path / 'runs'}")
    return runs[-1]


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


def plot(scalars, out, title="grpotrainer.py --demo"):
    """Write the two-panel PNG (reward left, accuracies right) to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=100)
    colors = ("tab:blue", "tab:orange", "tab:green")
    for (tag, label), color in zip({REWARD: "train/reward", **PARTS}.items(), colors, strict=True):
        if tag in scalars:
            steps, values = zip(*scalars[tag], strict=True)
            left.plot(steps, values, color=color, alpha=0.25, linewidth=1)
            left.plot(steps, running_mean(list(values)), color=color, linewidth=2, label=label)
    left.set(title="training samples (lines: mean of 5 steps)", xlabel="GRPO step", ylabel="reward", ylim=(-0.05, 1.3))
    left.legend(loc="lower right", fontsize=8)
    for tag, label in ACCURACIES.items():
        if tag in scalars:
            xs, ys = zip(*scalars[tag], strict=True)
            values = " -> ".join(f"{y:.3f}" for y in ys)  # before -> after, in the legend: the lines can overlap
            right.plot(xs, ys, marker="o", linewidth=2, label=f"{label}: {values}")
    right.set(title="held-out test problems", xlabel="GRPO step", ylabel="accuracy", ylim=(-0.05, 1.1))
    right.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv):
    source = argv[0] if argv else "outputs/demo"
    out = argv[1] if len(argv) > 1 else "docs/demo.png"
    scalars = read_scalars(run_folder(source))
    if REWARD not in scalars:
        raise SystemExit(f"{source} has no {REWARD}: is it a grpotrainer.py run?")
    print(plot(scalars, out))


if __name__ == "__main__":
    main(sys.argv[1:])
