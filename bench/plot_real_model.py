"""Plot `grpotrainer.py --real` runs (one OUTPUT_DIR per seed, docs/real-model.md): reward, held-out accuracy, KL and
completion length per GRPO step.

    python bench/plot_real_model.py outputs/real-s0 outputs/real-s1 outputs/real-s2 --out docs/real-model.png

Four panels, one colour per run: the correctness reward of the training samples per step (light) and its running
mean over 5 steps (bench/plot_demo.py's); held-out greedy lenient accuracy at every evaluation point of the run
(OUTPUT_DIR/eval_test.jsonl: before, EVAL_STEPS points, after) with its 95 % Wilson interval, and sampled accuracy
dashed; the mean per-token KL to the base model; the mean completion length, and dotted the share cut off at
MAX_COMPLETION_LENGTH (right axis). At BETA 0 (the --real profile) TRL computes no KL: the third panel then draws
the policy's mean token entropy, which TRL logs at every BETA.
An existing file is never replaced without --overwrite.

    python bench/plot_real_model.py outputs/real-s0 outputs/real-s1 outputs/real-s2 --table

prints instead docs/real-model.md's before/after table from each run's eval_test_before.json and
eval_test_after.json: each accuracy with its 95 % interval, the paired exact test's flips and p-value, and the
shares of answers cut off or padded past their final answer.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # grpo/ and bench/, when run as a script
from bench.plot_demo import CORRECTNESS, REWARD, read_scalars, run_folder, running_mean  # noqa: E402
from grpo.stats import format_interval, wilson  # noqa: E402

KL = "train/kl"
ENTROPY = "train/entropy"
LENGTH = "train/completions/mean_length"
CLIPPED = "train/completions/clipped_ratio"


def eval_points(output_dir):
    """[(step, lenient accuracy, (low, high), sampled accuracy or None)] from OUTPUT_DIR/eval_test.jsonl, by step."""
    points = []
    path = Path(output_dir) / "eval_test.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        record = json.loads(line)
        m = record["metrics"]
        interval = wilson(round(m["lenient_accuracy"] * m["n"]), m["n"])
        points.append((record["step"], m["lenient_accuracy"], interval, m.get("sampled_accuracy")))
    return sorted(points, key=lambda p: p[0])


ACCURACIES = (("strict", "strict_accuracy"), ("lenient", "lenient_accuracy"), ("sampled", "sampled_accuracy"))


def table(folders):
    """The markdown before/after table of `--real` runs, a row per run and accuracy, from their eval files."""
    rows = [
        "| run | accuracy | before [95 % CI] | after [95 % CI] | flips up / down | p (paired exact) | n |",
        "|---|---|---|---|---|---|---|",
    ]
    for folder in folders:
        before, after = (json.loads((Path(folder) / f"eval_test_{w}.json").read_text()) for w in ("before", "after"))
        label = run_label(folder)
        for name, key in ACCURACIES:
            cells = [format_interval(m[key], *m[key + "_ci95"]) if key in m else "-" for m in (before, after)]
            test = after.get("paired", {}).get(name)
            flips = f"{test['up']} / {test['down']}" if test else "-"
            p = f"{test['p_value']:.2g}" if test else "-"
            rows.append(f"| {label} | {name} | {cells[0]} | {cells[1]} | {flips} | {p} | {after['n']} |")
        for name, key in (("cut off", "truncated_rate"), ("padded", "padded_rate")):
            rows.append(f"| {label} | {name} (share) | {before.get(key, '-')} | {after.get(key, '-')} | | | |")
    return rows


def run_label(folder):
    """ "SEED n" from the run's run_settings.json, else the folder's name."""
    settings = Path(folder) / "run_settings.json"
    return f"SEED {json.loads(settings.read_text())['SEED']}" if settings.is_file() else Path(folder).name


def third_panel(runs):
    """(tag, title) of the third panel: the KL to the base model where any run logged it, else the entropy."""
    if any(KL in scalars for scalars, _ in runs.values()):
        return KL, "KL to the base model", "mean per-token KL"
    return ENTROPY, "policy entropy (no KL at BETA 0)", "mean token entropy"


def plot(runs, out):
    """Write the four-panel PNG of `runs` ({label: (scalars, eval points)}) to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (reward, held_out, kl, length) = plt.subplots(1, 4, figsize=(15, 3.4), dpi=100)
    clipped = length.twinx()
    kl_tag, kl_title, kl_label = third_panel(runs)
    for (label, (scalars, points)), color in zip(runs.items(), plt.cm.tab10.colors, strict=False):
        for ax, tag in ((reward, CORRECTNESS), (kl, kl_tag), (length, LENGTH)):
            if tag in scalars:
                steps, values = zip(*scalars[tag], strict=True)
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                ax.plot(steps, running_mean(list(values)), color=color, linewidth=2, label=label)
        if CLIPPED in scalars:
            steps, values = zip(*scalars[CLIPPED], strict=True)
            clipped.plot(steps, running_mean(list(values)), color=color, linewidth=1, linestyle=":")
        if points:
            steps = [p[0] for p in points]
            accuracy = [p[1] for p in points]
            below = [a - low for a, (_, _, (low, _), _) in zip(accuracy, points, strict=True)]
            above = [high - a for a, (_, _, (_, high), _) in zip(accuracy, points, strict=True)]
            bars = dict(yerr=[below, above], capsize=3, marker="o", color=color)
            held_out.errorbar(steps, accuracy, label=f"{label} greedy", **bars)
            sampled = [(p[0], p[3]) for p in points if p[3] is not None]
            if sampled:
                steps, values = zip(*sampled, strict=True)
                held_out.plot(steps, values, color=color, linestyle="--", marker="x", label=f"{label} sampled")
    reward.set(title="correctness reward (training samples)", xlabel="GRPO step", ylabel="mean reward")
    held_out.set(title="held-out accuracy, 95 % Wilson interval", xlabel="GRPO step", ylabel="accuracy", ylim=(0, 1))
    kl.set(title=kl_title, xlabel="GRPO step", ylabel=kl_label)
    length.set(title="completion length", xlabel="GRPO step", ylabel="tokens")
    clipped.set(ylabel="share cut off (dotted)", ylim=(-0.05, 1.05))
    for ax in (reward, held_out, kl, length):
        ax.legend(loc="best", fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO with LoRA on word problems (docs/real-model.md)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="OUTPUT_DIRs of --real runs (one per seed)")
    parser.add_argument("--out", type=Path, default=Path("real-model.png"), help="the PNG to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--table", action="store_true", help="print the before/after table instead of plotting")
    args = parser.parse_args(argv)
    if args.table:
        print(*table(args.runs), sep="\n")
        return
    if args.out.exists() and not args.overwrite:
        raise SystemExit(f"{args.out} exists; pass --overwrite to replace it")
    runs = {}
    for folder in args.runs:
        scalars = read_scalars(run_folder(folder))
        runs[run_label(folder)] = (scalars, eval_points(folder))
    if not any(REWARD in scalars for scalars, _ in runs.values()):
        raise SystemExit(f"no {REWARD} in {', '.join(map(str, args.runs))}: are they grpotrainer.py runs?")
    print(plot(runs, args.out))


if __name__ == "__main__":
    main()
