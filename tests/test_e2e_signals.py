"""End to end: SIGTERM while a --smoke run scores its held-out problems inside training (EVAL_STEPS, EVAL_AFTER) ends
the scoring at once, and the same command then does the evaluation it cut. The unit tests of the pieces are in
test_process.py (GracefulStop.evaluating) and test_callbacks.py (HeldOutEval); SIGTERM in a step, during EVAL_BEFORE
and while loading are in test_e2e_faults.py.

    .venv/bin/python -m pytest tests/test_e2e_signals.py -q    # ~2 min on 2 cores: three smoke runs
"""

import json
import signal
import time
from pathlib import Path

import pytest
from conftest import train

from grpo import checkpoints

# scored one problem per generate call, so that each evaluation lasts long enough for the signal to land inside it
EVALS = ("--EVAL_STEPS=2", "--EVAL_SUBSET=32", "--EVAL_AFTER=32", "--EVAL_BATCH_SIZE=1", "--EVAL_SAMPLES=1")


def wait_for(log, text, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def stopped_in(out, log, when):
    """Run the smoke training into `out` until it scores the held-out problems `when` ("during", "after"), then
    SIGTERM it: its exit status and its output."""
    proc = train(out, *EVALS, background=True)
    wait_for(log, f"GSM8K test, {when} training", proc)
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(120)
    return status, log.read_text()


def points(out):
    """The held-out points in OUTPUT_DIR/eval_test.jsonl: (step, when)."""
    rows = [json.loads(line) for line in (out / "eval_test.jsonl").read_text().splitlines()]
    return [(row["step"], row["when"]) for row in rows]


def stop_lines(text):
    return [line.removeprefix("[grpotrainer] ") for line in text.splitlines() if "stopped by" in line]


@pytest.mark.slow
def test_sigterm_while_scoring_in_training_stops_at_once_and_the_same_command_scores_it(tmp_path):
    out, log = tmp_path / "run", Path(f"{tmp_path / 'run'}.log")
    # during EVAL_STEPS at step 2: the step is saved, the point is not written, the run stops
    status, text = stopped_in(out, log, "during")
    assert status == 143 and "Traceback" not in text  # 128 + SIGTERM: the job is not done
    assert stop_lines(text) == [
        f"stopped by SIGTERM while scoring EVAL_STEPS at step 2; checkpoint saved to {out / 'checkpoint-2'}; "
        "rerun the same command to resume"
    ]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-2"] and not (out / "eval_test.jsonl").exists()
    # the same command resumes at step 2, scores the point first, trains on and stops in EVAL_AFTER at step 4
    status, text = stopped_in(out, log, "after")
    assert status == 143 and "Traceback" not in text
    assert stop_lines(text) == [
        "stopped by SIGTERM while scoring EVAL_AFTER at step 4; the adapter is saved, the run not marked finished; "
        "rerun the same command to score it and finish"
    ]
    assert points(out) == [(2, "during")]  # step 4 is EVAL_AFTER's (the last step scores the same model)
    assert (out / "adapter_model.safetensors").is_file() and not (out / checkpoints.FINISHED_NAME).exists()
    # the same command scores EVAL_AFTER without another step, and finishes the run
    rerun = train(out, *EVALS)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert points(out) == [(2, "during"), (4, "after")]
    assert json.loads((out / checkpoints.FINISHED_NAME).read_text())["global_step"] == 4
