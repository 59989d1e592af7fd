"""End to end: `grpotrainer.py --demo`. Its task and summary are tested in test_profiles.py, the sampled accuracy
it reports in test_gsm8k.py.

    .venv/bin/python -m pytest tests/test_demo.py -q -m slow -s        # the whole demo: ~7-10 minutes, one thread

It is the evidence that the loop learns on the real objective: GRPO with the default rewards raises
held-out correctness (greedy lenient and sampled accuracy), measured by the same evaluation code as a real run.
"""

import json

import pytest
from conftest import event_dirs, read_scalars, train

# ---------------------------------------------------------------------------------------------------------------
# The demo end to end


@pytest.mark.slow
def test_the_demo_raises_held_out_correctness(tmp_path):
    # no tight time limit: ~7-10 minutes on one thread, more on a loaded machine
    out = train(tmp_path, profile="--demo", timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = (json.loads((tmp_path / f"eval_test_{w}.json").read_text()) for w in ("before", "after"))
    summary = {k: (before[k], after[k]) for k in ("lenient_accuracy", "sampled_accuracy", "mean_completion_tokens")}
    print(summary)
    assert before["n"] >= 200 and after["n"] >= 200
    # GRPO paid for correctness moves the model from one-shot answers to working: measured for SEED 0 (docs/demo.md)
    # lenient +0.60 and sampled +0.49; the bar is +0.25, which leaves a margin of ~0.25 for noise
    assert after["lenient_accuracy"] >= before["lenient_accuracy"] + 0.25
    assert after["sampled_accuracy"] >= before["sampled_accuracy"] + 0.25
    assert after["mean_completion_tokens"] >= before["mean_completion_tokens"] + 5  # longer: the working is written
    assert "demo, before -> after GRPO: lenient_accuracy" in out.stderr + out.stdout  # the run's closing line
    (run,) = event_dirs(tmp_path)  # one TensorBoard run: the evaluations and the training curves together
    scalars = read_scalars(run)
    final = after["step"]
    for tag in ("eval/gsm8k_strict_accuracy", "eval/gsm8k_lenient_accuracy", "eval/gsm8k_sampled_accuracy"):
        assert [step for step, _ in scalars[tag]] == [0, final], tag
    assert len(scalars["train/reward"]) == final
