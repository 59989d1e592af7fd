"""Plot the real-model GRPO run of docs/real-model.md from its TensorBoard events: reward, KL, completion length.

    python bench/plot_real_model.py outputs/real-measure/grpo docs/real-model.png     # OUTPUT_DIR (or a run), PNG

Each panel draws the per-step value (light) and its running mean over 5 steps (bench/plot_demo.py's); the reward
panel adds its two parts, the length panel the share of completions cut off at MAX_COMPLETION_LENGTH.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_demo import PARTS, REWARD, read_scalars, run_folder, running_mean  # noqa: E402

PANELS = (  # (title, y label, {tag: legend label})
    ("reward of the training samples", "reward", {REWARD: "train/reward (weighted sum)", **PARTS}),
    ("KL to the base model", "mean per-token KL", {"train/kl": "train/kl"}),
    ("completion length", "tokens", {"train/completions/mean_length": "mean length"}),
)
CLIPPED = "train/completions/clipped_ratio"  # 0-1, on the length panel's right axis


def plot(scalars, out, title):
    """Write the three-panel PNG to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), dpi=100)
    colors = ("tab:blue", "tab:orange", "tab:green")
    for ax, (name, ylabel, tags) in zip(axes, PANELS, strict=True):
        for (tag, label), color in zip(tags.items(), colors, strict=False):
            if tag in scalars:
                steps, values = zip(*scalars[tag], strict=True)
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                ax.plot(steps, running_mean(list(values)), color=color, linewidth=2, label=label)
        ax.set(title=name, xlabel="GRPO step", ylabel=ylabel)
        ax.legend(loc="best", fontsize=7)
    if CLIPPED in scalars:
        steps, values = zip(*scalars[CLIPPED], strict=True)
        right = axes[2].twinx()
        right.plot(steps, running_mean(list(values)), color="tab:red", linewidth=1.5, linestyle="--")
        right.set(ylabel="share cut off (dashed)", ylim=(-0.05, 1.05))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv):
    source = argv[0] if argv else "outputs/real-measure/grpo"
    out = argv[1] if len(argv) > 1 else "docs/real-model.png"
    scalars = read_scalars(run_folder(source))
    if REWARD not in scalars:
        raise SystemExit(f"{source} has no {REWARD}: is it a grpotrainer.py run?")
    print(plot(scalars, out, "SmolLM2-135M-Instruct, GRPO with LoRA on word-problem sums (docs/real-model.md)"))


if __name__ == "__main__":
    main(sys.argv[1:])
