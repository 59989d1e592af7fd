"""Issue 22 against the real scripts: SIGTERM outside training (start-up, EVAL_BEFORE, export), a reward that
returns NaN mid-run.

    pytest tests/test_faults_round2_e2e.py -m slow
"""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_script
from test_faults_e2e import ENV, USER_REWARD, smoke_with_reward, wait_for

from grpo import checkpoints, guards

pytestmark = pytest.mark.slow


def launch(log, *args):
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT)


def stop_lines(text):
    return [line.removeprefix("[grpotrainer] ") for line in text.splitlines() if "stopped by" in line]


def test_sigterm_during_eval_before_says_so_in_one_line_and_the_rerun_finishes(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = launch(log, "grpotrainer.py", "--smoke", "--EVAL_BEFORE=16", f"--OUTPUT_DIR={out}")
    wait_for(log, "GSM8K test, before training", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143  # 128 + SIGTERM, as in training
    text = log.read_text()
    assert "Traceback" not in text
    assert stop_lines(text) == [
        "stopped by SIGTERM while scoring EVAL_BEFORE: no step was trained; the same command starts again"
    ]
    assert not (out / guards.LOCK_NAME).exists() and not list(out.glob("checkpoint-*"))
    rerun = run_script("grpotrainer.py", "--smoke", "--EVAL_BEFORE=16", f"--OUTPUT_DIR={out}")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (out / checkpoints.FINISHED_NAME).is_file()
    assert (out / "eval_test_before.json").is_file()  # the baseline the stopped run never wrote


def test_sigterm_while_loading_the_model_names_it(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = launch(log, "grpotrainer.py", "--smoke", f"--OUTPUT_DIR={out}")
    wait_for(log, "[grpotrainer] model ", proc)  # logged just before GRPOTrainer loads the weights
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143
    text = log.read_text()
    assert "Traceback" not in text
    [line] = stop_lines(text)
    # where the signal came: the model load, or (on a fast machine) --smoke's EVAL_BEFORE or training's first step
    phases = ("while loading the model", "while scoring EVAL_BEFORE", "at step")
    assert line.startswith(tuple(f"stopped by SIGTERM {p}" for p in phases)), line


NAN_REWARD = USER_REWARD.replace('[kwargs["difficulty"] for _ in completions]', '[float("nan") for _ in completions]')


def test_a_reward_returning_nan_mid_run_is_one_message_naming_entry_and_step(tmp_path):
    out = smoke_with_reward(tmp_path, NAN_REWARD)
    assert out.returncode == 2, out.stderr[-2000:]  # the reward's values, not a bug of code: exit 2, no traceback
    assert "Traceback" not in out.stderr
    assert (
        "the reward REWARD_FUNCS entry 'mymod:myreward' at training step 3 returned nan for completion 0" in out.stderr
    )
    assert checkpoints.checkpoint_problem(tmp_path / "run" / "checkpoint-2") is None  # kept whole
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()


def test_sigterm_during_an_export_leaves_no_half_folder_and_the_rerun_exports(tmp_path):
    run = tmp_path / "run"
    assert run_script("grpotrainer.py", "--smoke", f"--OUTPUT_DIR={run}").returncode == 0
    target, log = tmp_path / "merged", tmp_path / "export.log"
    proc = launch(log, "export.py", f"--ADAPTER={run}", f"--OUTPUT_DIR={target}")
    wait_for(log, "[export] merging", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143
    text = log.read_text()
    assert "Traceback" not in text and len(stop_lines(text)) == 1, text[-2000:]
    # merged, or writing: either way the folder is whole or absent, and no hidden partial is left beside it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".merged")) == []
    assert not target.exists() or (target / "export_settings.json").is_file()
    again = run_script("export.py", f"--ADAPTER={run}", f"--OUTPUT_DIR={target}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (Path(target) / "model.safetensors").is_file()
