"""End to end: `grpotrainer.py` runs in subprocesses that are signalled, cut, locked or fed a failing reward. A test
that resumes, damages or refuses a finished run does it to a copy of the shared smoke run (conftest.smoke_run).

.venv/bin/python -m pytest tests/test_e2e_faults.py -q -m slow     # all slow: several minutes on 2 cores
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import BASE_ENV, REPO, copy_run, event_dirs, read_scalars, run_script, tracker_env, train

from grpo import checkpoints, files, process

ENV = {**os.environ, **BASE_ENV}


TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def start(output_dir, *overrides, launcher=()):
    """A long smoke run in the background, its output in output_dir.log; returns the Popen once training has
    logged its first step (so a signal lands mid-training, not during the model load)."""
    log = Path(f"{output_dir}.log")
    proc = train(output_dir, *overrides, launcher=launcher, background=True)
    wait_for(log, "'loss'", proc)
    return proc, log


def wait_for(log, text, proc=None, timeout=240):
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert (proc is None or proc.poll() is None) and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def children(pid):
    """The pids whose parent is `pid` (from /proc/<pid>/stat: pid (name) state ppid ...)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def listing(output_dir):
    """Every file under output_dir with its size and mtime: what "touched nothing" compares."""
    return sorted(
        (str(p.relative_to(output_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in output_dir.rglob("*")
    )


def steps(checkpoint):
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def resumed(smoke_run, *overrides):
    """The shared run's command with `overrides` after it (the command line's last value wins): what a copy of its
    folder resumes with. TensorBoard alone and no held-out scoring, unless an override says otherwise."""
    return [*smoke_run.args, "--REPORT_TO=tensorboard", "--EVAL_STEPS=0", "--EVAL_AFTER=0", *overrides]


@pytest.mark.slow
def test_sigterm_saves_a_second_run_is_refused_meanwhile_and_the_rerun_resumes(smoke_run, tmp_path):
    out = copy_run(smoke_run, tmp_path / "run")  # finished at step 6, its final adapter from step 6
    args = resumed(smoke_run, "--MAX_STEPS=500", "--SAVE_STEPS=1000")
    proc, log = start(out, *args)  # resumed from checkpoint-6
    second = train(out, *args)  # while the first holds OUTPUT_DIR
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"is in use by another run (pid {proc.pid} on " in second.stderr
    proc.send_signal(signal.SIGTERM)
    wait_for(log, "SIGTERM received")  # (sent together, Python would handle the lower-numbered SIGINT first)
    proc.send_signal(signal.SIGINT)  # a second signal while stopping must not cut the save
    assert proc.wait(120) == 143  # 128 + SIGTERM: the job is not done
    text = log.read_text()
    assert "Traceback" not in text
    saved = checkpoints.checkpoint_dirs(out)[-1]  # the stop's checkpoint: SAVE_TOTAL_LIMIT=3 keeps 4 and 6 beside it
    assert [steps(c) for c in checkpoints.checkpoint_dirs(out)] == [4, 6, steps(saved)] and steps(saved) > 6
    assert f"stopped by SIGTERM at step {steps(saved)}; checkpoint saved to {saved}; rerun the same command" in text
    assert checkpoints.checkpoint_problem(saved) is None
    assert not (out / process.LOCK_NAME).exists()  # released on the way out
    # the final adapter is still the finished part's: evaluate.py scores it at its own step, not the newest one's
    result = run_script("evaluate.py", "--smoke", f"--ADAPTER={out}", "--LIMIT=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "eval_test.json").read_text())["step"] == 6
    (logdir,) = (out / "runs").glob("*_eval-test")
    assert [step for step, _ in read_scalars(logdir)["eval/gsm8k_strict_accuracy"]] == [6]
    rerun = train(out, *resumed(smoke_run, f"--MAX_STEPS={steps(saved) + 2}", "--SAVE_STEPS=1000"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {saved}" in rerun.stderr
    assert steps(out / f"checkpoint-{steps(saved) + 2}") == steps(saved) + 2


@pytest.mark.slow
def test_ctrl_c_saves_without_a_traceback(tmp_path):
    proc, log = start(tmp_path / "run", "--MAX_STEPS=500", "--SAVE_STEPS=1000")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 130
    assert "Traceback" not in log.read_text() and "stopped by SIGINT at step" in log.read_text()


@pytest.mark.slow
def test_finished_run_rerun_changes_nothing(smoke_run, tmp_path):
    out = copy_run(smoke_run, tmp_path / "run")
    before = listing(out)
    result = train(out, *smoke_run.args, env=tracker_env(tmp_path))  # the same command
    assert result.returncode == 0
    assert f"OUTPUT_DIR {out} holds a finished run (6 steps, adapter saved); nothing to do" in result.stderr
    assert listing(out) == before  # no step past MAX_STEPS, no checkpoint rotated away


@pytest.mark.slow
def test_cut_checkpoint_is_moved_aside_and_older_one_resumed(smoke_run, tmp_path):
    out = copy_run(smoke_run, tmp_path / "run")  # checkpoints 2, 4 and 6
    (out / checkpoints.FINISHED_NAME).unlink()  # as if the run had died at the last save
    with open(out / "checkpoint-6" / "trainer_state.json", "r+b") as f:
        f.truncate(1000)  # a full disk cut it
    result = train(out, *resumed(smoke_run))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-4'}" in result.stderr
    assert f"{out / 'checkpoint-6'} cannot be resumed (trainer_state.json does not parse" in result.stderr
    [moved] = list((out / "broken").iterdir())
    assert (moved / "trainer_state.json").stat().st_size == 1000  # kept as it was
    assert steps(out / "checkpoint-6") == 6  # trained again from step 4


@pytest.mark.slow
def test_a_resume_with_another_lora_rank_dataset_or_beta_is_refused_before_weights_load(smoke_run, tmp_path):
    out, other = copy_run(smoke_run, tmp_path / "run"), tmp_path / "other.jsonl"
    other.write_text((REPO / "data" / "smoke_gsm8k.jsonl").read_text())  # the same rows: still another DATASET
    record, before = (out / "run_settings.json").read_bytes(), listing(out)
    rank = train(out, *resumed(smoke_run, "--MAX_STEPS=8", "--LORA_R=8"))
    assert rank.returncode == 2 and "Traceback" not in rank.stderr
    assert "it was trained with LORA_R=16, and LORA_R is 8: set LORA_R=16" in rank.stderr
    assert "] model " not in rank.stderr  # refused before train() logs the model it is about to load
    data = train(out, *resumed(smoke_run, "--MAX_STEPS=8", f"--DATASET={other}", "--BETA=0.1"))
    assert data.returncode == 2 and "Traceback" not in data.stderr
    assert f"DATASET '{REPO / 'data' / 'smoke_gsm8k.jsonl'}' -> '{other}'" in data.stderr
    assert "BETA 0.05 -> 0.1 differ from its run's" in data.stderr  # each change named, old -> new
    assert (out / "run_settings.json").read_bytes() == record
    assert listing(out) == before  # nothing trained on the other data, no checkpoint, no file touched


@pytest.mark.slow
def test_torchrun_stops_all_ranks_at_one_step_when_one_is_signalled(tmp_path):
    out = tmp_path / "run"
    proc, log = start(out, "--MAX_STEPS=500", "--SAVE_STEPS=1000", launcher=TORCHRUN)
    os.kill(max(children(proc.pid)), signal.SIGTERM)  # one rank only: the other learns it at the step end
    proc.wait(180)
    text = log.read_text()
    [saved] = list(out.glob("checkpoint-*"))
    assert checkpoints.checkpoint_problem(saved) is None
    assert text.count(f"at step {steps(saved)}; checkpoint saved to {saved}") == 2  # both ranks, the same step
    assert "stopped by a signal on another rank" in text  # the rank that was not signalled stopped too
    assert "exitcode  : 143" in text  # torchrun's summary: a rank ended with the stop's status ...
    assert text.count("Traceback") == 1  # ... and its own ChildFailedError is the only traceback


@pytest.mark.slow
def test_a_run_cut_after_its_last_checkpoint_finishes_from_it_and_scores_eval_after_into_its_own_folder(
    smoke_run, tmp_path
):
    # killed during the final save (or EVAL_AFTER): the last checkpoint holds every step but the run is not marked
    # finished; resuming would train step 7, rotate checkpoint-2 away and overwrite the adapter
    out = copy_run(smoke_run, tmp_path / "run")
    (out / checkpoints.FINISHED_NAME).unlink()
    (out / "adapter_model.safetensors").unlink()
    again = train(out, *resumed(smoke_run, "--EVAL_AFTER=4"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint-6 already holds the last step" in again.stderr  # finished from it, outside trainer.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert (out / "adapter_model.safetensors").read_bytes() == (
        out / "checkpoint-6" / "adapter_model.safetensors"
    ).read_bytes()  # the final adapter is the last checkpoint's, trained no further
    assert json.loads((out / checkpoints.FINISHED_NAME).read_text())["global_step"] == 6
    kept = [json.loads(line) for line in (out / "eval_test.jsonl").read_text().splitlines()]
    assert [(row["step"], row["when"], row["metrics"]["n"]) for row in kept[4:]] == [(6, "after", 4)]  # a 5th point
    # TensorBoard's folder is fixed in OUTPUT_DIR/runs even though no training began (not ./runs in the cwd)
    newest = event_dirs(out)[-1]
    assert [step for step, _ in read_scalars(newest)["eval/gsm8k_strict_accuracy"]] == [6]


USER_REWARD = """\
def myreward(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 3:
        raise RuntimeError("LLM judge request timed out after 30 s")  # the user's own error, on line 3
    return [0.0 for _ in completions]
"""


MYREWARD = ("--REWARD_FUNCS=correctness_reward,mymod:myreward", "--REWARD_WEIGHTS=1,1")  # mymod.py: reward_module


@pytest.mark.slow
def test_a_users_reward_that_raises_in_training_shows_its_traceback_and_is_no_stall(tmp_path):
    # a bug in a reward of one's own: its traceback into the user's file and line, the entry and the step named;
    # exit 1; the last checkpoint kept whole and no final adapter written over it; "timed out" in its text is the
    # user's error, not a distributed stall
    out = train(tmp_path / "run", *MYREWARD, reward_module=USER_REWARD)
    assert out.returncode == 1, out.stderr[-2000:]  # a bug: not the exit 2 of a message
    assert "Traceback (most recent call last)" in out.stderr
    assert f'File "{tmp_path / "mymod.py"}", line 3, in myreward' in out.stderr
    assert "raised by the reward REWARD_FUNCS entry 'mymod:myreward' at training step 3" in out.stderr
    assert "RuntimeError: LLM judge request timed out after 30 s" in out.stderr  # the error, as raised
    assert "DDP_TIMEOUT" not in out.stderr and "waited for the others" not in out.stderr
    assert checkpoints.checkpoint_problem(tmp_path / "run" / "checkpoint-2") is None
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()


@pytest.mark.slow
def test_a_bad_setting_is_still_one_line_without_a_traceback(tmp_path):
    out = train(tmp_path / "run", "--REWARD_FUNCS=correctness_reward,nomod:myreward", "--REWARD_WEIGHTS=1,1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "there is no module 'nomod' on the Python path" in out.stderr


def launch(log, *args):
    return subprocess.Popen([sys.executable, *args], cwd=REPO, env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT)


def stop_lines(text):
    return [line.removeprefix("[grpotrainer] ") for line in text.splitlines() if "stopped by" in line]


@pytest.mark.slow
def test_sigterm_during_eval_before_says_so_in_one_line_and_the_rerun_finishes(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = train(out, "--EVAL_BEFORE=16", "--MAX_STEPS=2", background=True)
    wait_for(log, "GSM8K test, before training", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143  # 128 + SIGTERM, as in training
    text = log.read_text()
    assert "Traceback" not in text
    assert stop_lines(text) == [
        "stopped by SIGTERM while scoring EVAL_BEFORE: no step was trained; the same command starts again"
    ]
    assert not (out / process.LOCK_NAME).exists() and not list(out.glob("checkpoint-*"))
    rerun = train(out, "--EVAL_BEFORE=16", "--MAX_STEPS=2")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (out / checkpoints.FINISHED_NAME).is_file()
    assert (out / "eval_test_before.json").is_file()  # the baseline the stopped run never wrote


@pytest.mark.slow
def test_sigterm_while_loading_the_model_names_it(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = train(out, background=True)
    wait_for(log, "[grpotrainer] model ", proc)  # logged just before GRPOTrainer loads the weights
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143
    text = log.read_text()
    assert "Traceback" not in text
    [line] = stop_lines(text)
    # where the signal came: the model load, or (on a fast machine) --smoke's EVAL_BEFORE or training's first step
    phases = ("while loading the model", "while scoring EVAL_BEFORE", "at step")
    assert line.startswith(tuple(f"stopped by SIGTERM {p}" for p in phases)), line


EVAL_AFTER_RUN = ("--MAX_STEPS=2", "--EVAL_AFTER=32", "--EVAL_BATCH_SIZE=1", "--EVAL_SAMPLES=0")  # 32 generate calls


@pytest.mark.slow
def test_sigterm_while_eval_after_scores_saves_the_adapter_and_the_rerun_scores_and_finishes(tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = train(out, *EVAL_AFTER_RUN, background=True)
    wait_for(log, "GSM8K test, after training", proc)  # the scoring's progress bar: it has begun
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143  # not 0: the run is not done
    text = log.read_text()
    assert "Traceback" not in text
    assert stop_lines(text) == [  # the scoring ended at once, not after its 32 problems
        "stopped by SIGTERM while scoring EVAL_AFTER at step 2; the adapter is saved, the run not marked finished; "
        "rerun the same command to score it and finish"
    ]
    assert files.adapter_step(out) == 2  # the trained adapter, saved
    assert not (out / checkpoints.FINISHED_NAME).exists() and not (out / "eval_test_after.json").exists()
    assert not (out / process.LOCK_NAME).exists()
    rerun = train(out, *EVAL_AFTER_RUN)  # the same command
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "checkpoint-2 already holds the last step" in rerun.stderr  # scored from it, no step trained
    assert json.loads((out / "eval_test_after.json").read_text())["n"] == 32
    kept = [json.loads(line) for line in (out / "eval_test.jsonl").read_text().splitlines()]
    assert [(row["step"], row["when"]) for row in kept] == [(2, "after")]  # the one point, scored once
    assert json.loads((out / checkpoints.FINISHED_NAME).read_text())["global_step"] == 2


NAN_REWARD = """\
def myreward(completions, trainer_state=None, **kwargs):
    return [float("nan") if trainer_state.global_step >= 2 else 0.0 for _ in completions]  # NaN from step 3 on
"""


@pytest.mark.slow
def test_a_reward_returning_nan_mid_run_is_one_message_and_keeps_the_last_good_checkpoint(tmp_path):
    out = train(tmp_path / "run", *MYREWARD, "--SAVE_STEPS=1", reward_module=NAN_REWARD)
    assert out.returncode == 2, out.stderr[-2000:]  # the reward's values, not a bug of code: exit 2, no traceback
    assert "Traceback" not in out.stderr
    # refused where they are returned (reward_guard.check_values), naming the entry and the steps trained so far
    entry = "the reward REWARD_FUNCS entry 'mymod:myreward' at training step 2"
    assert f"{entry} returned nan for completion 0: not a finite number" in out.stderr
    run = tmp_path / "run"
    assert [steps(c) for c in checkpoints.checkpoint_dirs(run)] == [1, 2]  # SAVE_STEPS=1: no step 3 saved
    assert checkpoints.checkpoint_problem(run / "checkpoint-2") is None  # the last good checkpoint, whole
    assert not (run / "adapter_model.safetensors").exists()  # nor is a final adapter written


@pytest.mark.slow
def test_sigterm_during_an_export_leaves_no_half_folder_and_the_rerun_exports(smoke_run, tmp_path):
    run = copy_run(smoke_run, tmp_path / "run")
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


HUNG_ONCE_REWARD = """\
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MARK = Path(__file__).with_name("hung-once")


def myreward(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 1 and not MARK.exists():  # step 2, in the first run only
        MARK.write_text("hanging")
        with ThreadPoolExecutor(1) as pool:  # an LLM judge that never answers: the main thread waits in a join
            pool.submit(threading.Event().wait).result()
    return [0.0 for _ in completions]
"""


@pytest.mark.slow  # two --smoke runs
def test_a_reward_hung_in_a_thread_ends_at_reward_timeout_and_the_same_command_resumes(tmp_path):
    args = ("--MAX_STEPS=3", "--SAVE_STEPS=1", "--REWARD_TIMEOUT=5", *MYREWARD)
    out = train(tmp_path / "run", *args, reward_module=HUNG_ONCE_REWARD, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]  # ended by the watchdog, not by the test's timeout
    said = "REWARD_FUNCS entry 'mymod:myreward' did not return within REWARD_TIMEOUT=5 s (at training step 1)"
    assert said in out.stderr.strip().splitlines()[-2]  # the last message, after the stacks of the hung threads
    assert f'File "{tmp_path / "mymod.py"}", line 12 in myreward' in out.stderr  # the user's hung line
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1"]
    again = train(tmp_path / "run", *args, reward_module=HUNG_ONCE_REWARD)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {tmp_path / 'run' / 'checkpoint-1'}" in again.stderr


@pytest.mark.slow  # two --smoke runs
def test_sigterm_during_a_hung_step_ends_within_stop_grace_and_the_same_command_resumes(tmp_path):
    run = tmp_path / "run"
    args = ("--MAX_STEPS=3", "--SAVE_STEPS=1", "--REWARD_TIMEOUT=0", "--STOP_GRACE=3", *MYREWARD)
    proc = train(run, *args, reward_module=HUNG_ONCE_REWARD, background=True)
    log = Path(f"{run}.log")
    deadline = time.monotonic() + 300
    while not (tmp_path / "hung-once").exists():  # step 2's reward hangs, and no REWARD_TIMEOUT bounds it
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143  # ended by STOP_GRACE: the step never ends, and no REWARD_TIMEOUT would end it
    last = log.read_text().strip().splitlines()[-1]
    assert last == (
        "stopped by SIGTERM in step 2: not ended within STOP_GRACE=3 s, so it is not saved; rerun the same command "
        f"to resume from {run / 'checkpoint-1'}"
    )
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]  # no half checkpoint of step 2
    again = train(run, *args, reward_module=HUNG_ONCE_REWARD)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {run / 'checkpoint-1'}" in again.stderr


@pytest.mark.slow
def test_raised_max_steps_continues_the_rebuilt_schedule_and_takes_the_new_save_steps(smoke_run, tmp_path):
    out, lr = copy_run(smoke_run, tmp_path / "run"), 1e-3  # --smoke's LEARNING_RATE, no warm-up, SAVE_STEPS=2
    rerun = train(out, *resumed(smoke_run, "--MAX_STEPS=8", "--SAVE_STEPS=1", "--SAVE_TOTAL_LIMIT=10"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    logged = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    rates = {row["step"]: row["learning_rate"] for row in logged if "learning_rate" in row}
    # README: the linear schedule rebuilt for 8 steps, from the step reached; step k trains at lr * (1 - (k-1)/8)
    assert [rates[k] for k in (7, 8)] == pytest.approx([lr * (1 - (k - 1) / 8) for k in (7, 8)])
    assert [rates[k] for k in range(1, 7)] == pytest.approx([lr * (1 - (k - 1) / 6) for k in range(1, 7)])
    # the new SAVE_STEPS=1, not the checkpoint's 2: a kill now loses at most one step
    assert [steps(c) for c in checkpoints.checkpoint_dirs(out)] == [2, 4, 6, 7, 8]
    # the record keeps the first part's values beside the new ones, from the step they apply
    [segment] = json.loads((out / "run_settings.json").read_text())["segments"]
    changed = {"MAX_STEPS": [6, 8], "SAVE_STEPS": [2, 1], "SAVE_TOTAL_LIMIT": [3, 10], "EVAL_STEPS": [2, 0]}
    changed |= {"EVAL_AFTER": [8, 0], "OUTPUT_DIR": [str(smoke_run.out), str(out)]}  # no held-out scoring; a copy
    if smoke_run.report_to != ("tensorboard",):  # the trackers installed here, then TensorBoard alone
        changed["REPORT_TO"] = [",".join(smoke_run.report_to), "tensorboard"]
    assert segment == {"from_step": 6, "changed": changed}


# ---------------------------------------------------------------------------------------------------------------
# SIGKILL at any moment: the same command finishes

KILL_COMMAND = ("--MAX_STEPS=6", "--SAVE_STEPS=1", "--SAVE_TOTAL_LIMIT=2")  # a checkpoint (and a rotation) each step
# The file-system events a kill lands on, in OUTPUT_DIR: the run lock taken, a file or folder being written aside
# (files.py's .tmp/.partial), a checkpoint folder appearing (Trainer mid-save), its trainer_state.json (the save's
# end), the final adapter written; "delay": a seeded time into the run, up to the measured length of a first part.
KILL_EVENTS = ("lock", "aside", "checkpoint", "checkpoint-state", "final", "delay", "delay", "delay")


def reached(event, out, before, started, delay):
    """Whether the run in `out` has reached `event`; `before`: (checkpoint names, final adapter's mtime) at start."""
    if event == "delay":
        return time.monotonic() - started >= delay
    names = set(os.listdir(out)) if out.is_dir() else set()
    new = {n for n in names if n.startswith("checkpoint-")} - before[0]
    if event == "lock":
        return process.LOCK_NAME in names
    if event == "aside":
        return any(n.startswith(".") and (".tmp-" in n or ".partial-" in n) for n in names)
    if event == "checkpoint":
        return bool(new)
    if event == "checkpoint-state":
        return any((out / n / "trainer_state.json").exists() for n in new)
    with contextlib.suppress(OSError):  # "final"
        return (out / "adapter_model.safetensors").stat().st_mtime_ns != before[1]
    return False


def state_of(out):
    names = {p.name for p in out.glob("checkpoint-*")}
    adapter = out / "adapter_model.safetensors"
    return names, adapter.stat().st_mtime_ns if adapter.exists() else None


def generates(out):
    """The final adapter of `out` loads onto its base model and generates."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(out / "smoke-model", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out).eval()
    ids = AutoTokenizer.from_pretrained(out)("What is 2 + 3?", return_tensors="pt").input_ids
    return model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]


def kill_attempt(out, rng, length, log):
    """One run of KILL_COMMAND in `out`, started now, to be killed at a moment drawn from `rng`: a file-system event,
    or a delay up to `length` (the first part's, once measured; until then, its first new checkpoint)."""
    event = rng.choice(KILL_EVENTS) if length else "checkpoint"
    delay = rng.uniform(0, length or 0)
    before, started = state_of(out), time.monotonic()
    proc = train(out, *KILL_COMMAND, background=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return SimpleNamespace(out=out, event=event, delay=delay, before=before, started=started, proc=proc, log=log)


@pytest.mark.slow
def test_sigkill_at_20_seeded_moments_then_the_same_command_finishes_and_the_adapter_generates(tmp_path, monkeypatch):
    # `generates` loads models here, under transformers' progress bars: no tqdm monitor thread to outlive the test
    monkeypatch.setattr("tqdm.std.tqdm.monitor_interval", 0)
    # two lanes of runs at once, each with its own folders and seeded moments: a 2-core machine kills twice as fast
    lanes = [([tmp_path / f"lane{i}" / "run0"], random.Random(31 + i)) for i in range(2)]
    kills, running, attempts, length = [], {}, 0, None
    while len(kills) < 20 or running:
        for lane, (runs, rng) in enumerate(lanes):
            if lane not in running and len(kills) + len(running) < 20:
                attempts += 1
                running[lane] = kill_attempt(runs[-1], rng, length, tmp_path / f"attempt{attempts}.log")
        for lane, run in list(running.items()):
            if run.proc.poll() is None and not reached(run.event, run.out, run.before, run.started, run.delay):
                continue
            del running[lane]
            if run.proc.poll() is None:
                run.proc.kill()  # SIGKILL: no handler, no finally, no flush
                run.proc.wait()
                kills.append(run.event)
                length = length or time.monotonic() - run.started
                continue
            assert run.proc.returncode == 0, run.log.read_text()[-3000:]  # it ended before the moment: finished
            assert (run.out / checkpoints.FINISHED_NAME).is_file() and generates(run.out)
            runs = lanes[lane][0]
            runs.append(run.out.with_name(f"run{len(runs)}"))  # a finished run changes no more: a new one
        time.sleep(0.002)
    finishing = [train(runs[-1], *KILL_COMMAND, background=True) for runs, _ in lanes]  # the same command
    for (runs, _), proc in zip(lanes, finishing, strict=True):
        assert proc.wait(300) == 0, Path(f"{runs[-1]}.log").read_text()[-3000:]
        assert json.loads((runs[-1] / checkpoints.FINISHED_NAME).read_text())["global_step"] == 6
        assert files.adapter_step(runs[-1]) == 6 and generates(runs[-1])
    assert "Traceback" not in "".join(p.read_text() for p in tmp_path.glob("attempt*.log"))
    # the kills landed at several kinds of moment; a file written aside and the tiny final save last milliseconds,
    # so a poll may miss them (the run then finishes, and the next kills go to a new one)
    assert len(set(kills)) >= 4, kills
