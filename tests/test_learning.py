"""The loop improves a policy, not only runs: the tiny smoke model learns to write the "####" answer marker.

    .venv/bin/python -m pytest tests/test_learning.py -q -s      # -s prints the before/after rewards

A randomly initialised model writes "####" in ~2% of its completions; a reward that pays for it gives GRPO a
signal, and after 150 LoRA steps most completions carry the marker. The settings differ from the smoke defaults
where a 30-dimensional model needs them: a high learning rate, and BETA=0 (with the KL penalty the adapter of so
small a model barely moves in 150 steps; Dr. GRPO and DAPO also train with BETA=0).
"""

import pytest
from conftest import event_dirs, read_scalars, run_script

STEPS, WINDOW = 150, 15


def marker_reward(completions, **kwargs):
    """1.0 when the completion contains GSM8K's answer marker "####", else 0.0."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float("####" in text) for text in texts]


@pytest.mark.slow
def test_grpo_raises_the_reward_of_a_tiny_model(tmp_path):
    out = run_script(
        "grpotrainer.py",
        "--smoke",
        f"--OUTPUT_DIR={tmp_path}",
        "--REWARD_FUNCS=test_learning:marker_reward",  # a user's own reward, imported as module:function
        "--REWARD_WEIGHTS=1",
        f"--MAX_STEPS={STEPS}",
        f"--SAVE_STEPS={STEPS}",
        "--LEARNING_RATE=0.1",
        "--BETA=0",
        env={"PYTHONPATH": "tests"},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rewards = [value for _, value in read_scalars(event_dirs(tmp_path)[0])["train/reward"]]
    assert len(rewards) == STEPS
    before, after = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"mean reward, first {WINDOW} steps: {before:.3f}; last {WINDOW} steps: {after:.3f}")
    # chance level is ~0.02; measured 0.0 -> 0.78 with SEED=42 and one thread (deterministic on CPU)
    assert before < 0.15
    assert after > before + 0.4
