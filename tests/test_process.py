"""Tests of grpo/process.py: the run lock, the timer that skips stopped time, SIGTERM and Ctrl-C in training and in a
held-out evaluation (all ranks agreeing), and stalls, full disks and NaN sampling named by their type.

    .venv/bin/python -m pytest tests/test_process.py -q
"""

import errno
import json
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers.generation.utils
from conftest import REPO, run_in_process
from safetensors.torch import save_file
from transformers import TrainerControl, TrainerState

from grpo import callbacks, process
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# one run per folder

# Another run holding OUTPUT_DIR, as output_lock's rank 0 takes it. A fresh Python importing grpo.process alone
# (take_lock needs no torch; output_lock's any_rank would import it), so it costs a fraction of a CPU-second.
HOLDER = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from grpo import process
lock, refusal = process.take_lock(sys.argv[1])
print("locked" if lock else refusal, flush=True)
time.sleep(120)
"""


def start_holder(output_dir):
    """Another run's process holding OUTPUT_DIR, once it has printed "locked"."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def stop(proc):
    proc.kill()  # SIGKILL: no cleanup runs, as when a node dies
    proc.wait()
    proc.stdout.close()


def test_second_run_is_refused_without_waiting_and_first_is_unaffected(tmp_path, monkeypatch):
    holder = start_holder(tmp_path)
    try:

        def no_wait(seconds):
            raise AssertionError(f"waited {seconds} s for the lock instead of refusing at once")

        monkeypatch.setattr(time, "sleep", no_wait)  # filelock polls with time.sleep while it waits
        with pytest.raises(ConfigError) as err, process.output_lock(tmp_path, rank0=True):
            pass
        monkeypatch.undo()
        assert f"is in use by another run (pid {holder.pid} on {socket.gethostname()}, since " in str(err.value)
        assert len(str(err.value).splitlines()) == 2  # what holds it, then what to do
        assert holder.poll() is None  # still running
        assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == holder.pid  # its lock untouched
        # the refused run wrote nothing
        assert sorted(p.name for p in tmp_path.iterdir()) == [process.LOCK_NAME, process.HOLDER_NAME]
    finally:
        stop(holder)


def test_lock_of_a_killed_run_is_taken_over_and_removed_after(tmp_path, caplog):
    holder = start_holder(tmp_path)
    stop(holder)  # its files stay, naming it, but the OS released its flock
    assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.INFO), process.output_lock(tmp_path, rank0=True):
        assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == os.getpid()
    assert f"took over run.lock from pid {holder.pid} on {socket.gethostname()}" in caplog.text
    assert sorted(tmp_path.iterdir()) == []  # both files go with the lock


def test_lock_is_released_after_the_block(tmp_path):
    with process.output_lock(tmp_path / "new", rank0=True):
        assert (tmp_path / "new" / process.LOCK_NAME).is_file()  # OUTPUT_DIR is created for it
    assert not (tmp_path / "new" / process.LOCK_NAME).exists()
    with process.output_lock(tmp_path / "new", rank0=True):  # and can be taken again at once
        pass


def test_lock_is_released_when_the_block_raises(tmp_path):
    with pytest.raises(ConfigError), process.output_lock(tmp_path, rank0=True):
        raise ConfigError("a bad setting")
    assert not (tmp_path / process.LOCK_NAME).exists()


def test_other_ranks_take_no_lock(tmp_path):
    with process.output_lock(tmp_path / "out", rank0=False):
        assert not (tmp_path / "out").exists()  # one lock per run, held by global rank 0


def test_unwritable_output_dir_is_a_message(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    message = r"cannot lock OUTPUT_DIR .*file/sub .*: it must be a folder this user"
    with pytest.raises(ConfigError, match=message), process.output_lock(tmp_path / "file" / "sub", rank0=True):
        pass


KILLED_AFTER_LOCKING = f"""
import os, signal, sys
sys.path.insert(0, {str(REPO)!r})
from filelock import FileLock
from grpo import process
FileLock(os.path.join(sys.argv[1], process.LOCK_NAME), timeout=0).acquire()  # as take_lock does, first
os.kill(os.getpid(), signal.SIGKILL)  # the instant before take_lock names its holder in run.lock.json
"""


def test_a_run_killed_between_locking_and_naming_itself_does_not_lock_the_folder(tmp_path):
    from grpo import preflight

    out = tmp_path / "run"
    out.mkdir()
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_LOCKING, str(out)])
    assert killed.returncode == -signal.SIGKILL
    assert sorted(p.name for p in out.iterdir()) == [process.LOCK_NAME]  # the state it left: run.lock alone
    assert preflight.run_folder_problem(out) is None  # the rerun's folder check: its own run's file
    with process.output_lock(out, rank0=True):  # the OS released its flock: taken over
        assert json.loads((out / process.HOLDER_NAME).read_text())["pid"] == os.getpid()


def test_a_held_lock_whose_holder_is_not_named_yet_is_refused_saying_so(tmp_path):
    lock, _ = process.take_lock(tmp_path)
    (tmp_path / process.HOLDER_NAME).unlink()  # as between another run's acquire and its holder file
    try:
        refusal = r"pid \? on an unknown host, which has not named itself"
        with pytest.raises(ConfigError, match=refusal), process.output_lock(tmp_path, rank0=True):
            pass
    finally:
        lock.release()


def test_any_rank_without_a_process_group_is_the_flag():
    assert (process.any_rank(True), process.any_rank(False)) == (True, False)


# ---------------------------------------------------------------------------------------------------------------
# Watchdog: seconds of the process's running time


class FakeClock:
    """process.time and the Watchdog's cancel Event, on a clock that moves only when the Watchdog waits: each wait
    moves it by the seconds asked, and the wait numbered `stopped_in` by `stopped` seconds more, as if the process
    had been stopped (Ctrl-Z, SIGSTOP) during it."""

    def __init__(self, stopped_in=None, stopped=0.0):
        self.now, self.waits = 0.0, 0
        self.stopped_in, self.stopped = stopped_in, stopped

    def monotonic(self):
        return self.now

    def Event(self):  # noqa: N802  (stands in for threading.Event)
        clock = self

        class Cancelled(threading.Event):
            def wait(self, timeout=None):
                clock.waits += 1
                clock.now += timeout + (clock.stopped if clock.waits == clock.stopped_in else 0.0)
                return self.is_set()

        return Cancelled()


def watch(monkeypatch, clock, seconds):
    """Run a Watchdog of `seconds` on `clock` to its end; the clock's time when it fired, or None."""
    monkeypatch.setattr(process, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(process, "threading", SimpleNamespace(Event=clock.Event))
    fired = []
    dog = process.Watchdog(seconds, lambda *args: fired.append((clock.now, args)), "why")
    dog.join(10)
    assert not dog.is_alive()
    assert [args for _, args in fired] in ([], [("why",)])  # at most once, with its arguments
    return fired[0][0] if fired else None


def test_a_watchdog_fires_once_its_seconds_have_passed(monkeypatch):
    assert watch(monkeypatch, FakeClock(), seconds=2.0) == pytest.approx(2.0)


def test_a_watchdog_does_not_count_the_time_the_process_was_stopped(monkeypatch):
    # stopped for 100 s during its third wait: that wait counts as one tick of at most TICK + SLACK, so it fires
    # after 2 s of running time plus the stop (less the SLACK it allowed), not at the end of the stop
    fired = watch(monkeypatch, FakeClock(stopped_in=3, stopped=100.0), seconds=2.0)
    assert fired - 100.0 == pytest.approx(2.0 - process.Watchdog.SLACK)


def test_a_cancelled_watchdog_never_fires():
    fired = []
    dog = process.Watchdog(60, fired.append, "fired")
    dog.cancel()
    dog.join(10)  # it sees the cancel within a tick
    assert not dog.is_alive() and fired == []


# A Watchdog of 1.5 s in a Python of its own that the test stops for 2 s: the fire time it prints, measured from its
# start. SLACK 0.1: the tick the stop falls in counts 0.35 s at most.
STOPPED_CHILD = f"""
import os, sys, time
sys.path.insert(0, {str(REPO)!r})
from grpo import process
process.Watchdog.SLACK = 0.1
start = time.monotonic()
def fire():
    print(f"{{time.monotonic() - start:.3f}}", flush=True)
    os._exit(0)
process.Watchdog(1.5, fire)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_watchdog_in_a_stopped_process_fires_that_much_later():
    child = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(2.0)
        paused = time.monotonic() - stopped
        child.send_signal(signal.SIGCONT)
        fired_after = float(child.stdout.readline())
        assert child.wait(30) == 0
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    # running time 1.5 s, less the 0.35 s the stopped tick may count, plus the pause: a timer counting the pause
    # would have fired as the child continued, ~2 s after its start
    assert fired_after >= 1.5 - (process.Watchdog.TICK + 0.1) + paused - 0.05  # 0.05: signal delivery


# ---------------------------------------------------------------------------------------------------------------
# GracefulStop: the step ends, the processes agree (driven by callbacks.StopOnSignal's step events)


def step_end(stopper, step, device="cpu"):
    control = TrainerControl()
    stopper.on_step_end(SimpleNamespace(device=torch.device(device)), TrainerState(global_step=step), control)
    return control


def test_a_second_signal_says_what_the_run_is_doing(caplog, tmp_path, monkeypatch):
    monkeypatch.setattr(process.os, "_exit", lambda code: pytest.fail(f"exited {code}: no signal here ends the run"))
    stopper = callbacks.StopOnSignal()
    with caplog.at_level(logging.WARNING, logger="grpotrainer"):
        stopper.handle(signal.SIGTERM, None)
        stopper.on_step_begin(None, TrainerState(global_step=2), None)
        stopper.handle(signal.SIGINT, None)  # in the step, at once: torchrun's copy of the terminal's Ctrl-C
        stopper.signal_name = "SIGTERM"  # the processes agreed: Trainer saves now
        stopper.received_at -= 10  # a later signal, no copy: the save must not be cut either
        stopper.handle(signal.SIGINT, None)
        stopper.saved = tmp_path / "checkpoint-3"
        stopper.handle(signal.SIGINT, None)
    said = [r.getMessage().split(";")[0] for r in caplog.records]
    assert said == [
        "SIGTERM received: saving a checkpoint after this step when it ends",  # STOP_GRACE=0: no limit
        "SIGINT ignored: it is a copy of the first signal (a launcher forwards it)",
        "SIGINT ignored: a checkpoint is being saved",
        "SIGINT ignored: the checkpoint is saved and the run is ending",
    ]


def stop_exits(monkeypatch):
    """os._exit, as GracefulStop calls it, recording the code and waking the "hung step" (an Event) instead."""
    codes, ended = [], threading.Event()
    monkeypatch.setattr(process.os, "_exit", lambda code: (codes.append(code), ended.set()))
    return codes, ended


def test_a_step_that_outlasts_the_grace_ends_the_run_unsaved(monkeypatch, capfd, tmp_path):
    codes, ended = stop_exits(monkeypatch)
    stopper = callbacks.StopOnSignal(resuming=tmp_path / "checkpoint-2", grace=0.2)
    stopper.on_train_begin(None, None, None)
    try:
        stopper.on_step_begin(None, TrainerState(global_step=2), None)
        os.kill(os.getpid(), signal.SIGTERM)
        assert ended.wait(60)  # the step "hangs" here: only the grace timer ends it
    finally:
        stopper.restore()
    assert codes == [143]  # 128 + SIGTERM: the job is not done, and nothing half-written
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines[-1] == (
        "stopped by SIGTERM in step 3: not ended within STOP_GRACE=0.2 s, so it is not saved; rerun the same "
        f"command to resume from {tmp_path / 'checkpoint-2'}"
    )


def test_a_second_signal_in_a_step_ends_the_run_at_once(monkeypatch, capfd):
    codes, ended = stop_exits(monkeypatch)
    monkeypatch.setattr(process, "COPY_WINDOW", 0.0)  # every later signal is a person's second, none a copy
    stopper = callbacks.StopOnSignal(grace=0)  # no grace: only the second signal ends the step
    stopper.on_train_begin(None, None, None)
    try:
        stopper.on_step_begin(None, TrainerState(global_step=0), None)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        assert ended.wait(60)
    finally:
        stopper.restore()
    assert codes == [130]  # 128 + SIGINT
    lines = capfd.readouterr().err.strip().splitlines()  # the stand-in os._exit returns: a warning may follow
    assert (
        "stopped by SIGINT in step 1: SIGINT came while it ran, so it is not saved; rerun the same command to resume "
        "from the start"
    ) in lines


def test_the_grace_never_cuts_a_save_between_steps(monkeypatch):
    codes, ended = stop_exits(monkeypatch)
    stopper = callbacks.StopOnSignal(grace=0.1)
    stopper.on_train_begin(None, None, None)
    try:
        stopper.on_step_begin(None, TrainerState(global_step=4), None)
        step_end(stopper, 5)  # the step ended, and the Trainer writes SAVE_STEPS' checkpoint ...
        os.kill(os.getpid(), signal.SIGTERM)  # ... when the signal comes
        assert not ended.wait(0.5)  # the grace ran out several times over: the save is never cut
        stopper.on_step_begin(None, TrainerState(global_step=5), None)  # the next step gets the grace anew
        assert ended.wait(60)
    finally:
        stopper.restore()
    assert codes == [143]


# ---------------------------------------------------------------------------------------------------------------
# GracefulStop.evaluating: a signal ends a held-out evaluation at once


def handlers():
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


@pytest.fixture
def training_handlers():
    """A GracefulStop whose handlers are in place, as StopOnSignal's are from the first step on."""
    stopper = process.GracefulStop()
    previous = handlers()
    for signum in stopper.signals:
        signal.signal(signum, stopper.handle)
    yield stopper
    stopper.restore()
    signal.signal(signal.SIGTERM, previous[0])
    signal.signal(signal.SIGINT, previous[1])


@pytest.mark.parametrize(("when", "setting"), [("during", "EVAL_STEPS"), ("after", "EVAL_AFTER")])
def test_a_signal_while_scoring_ends_the_scoring_at_its_next_check_and_stops_the_run(training_handlers, when, setting):
    stopper, went_on = training_handlers, []
    with stopper.evaluating(when) as scoring:
        scoring.check()  # no signal yet: scoring goes on
        os.kill(os.getpid(), signal.SIGTERM)  # recorded by the run's handler, in the middle of a generate call
        scoring.check()  # between two calls: the scoring ends here
        went_on.append("scored on")  # never
    assert (scoring.cut, went_on) == ([signal.SIGTERM], [])
    # recorded as a stop, which the caller saves for (during) or leaves unfinished (after)
    assert (stopper.signal_name, stopper.during, stopper.exit_code) == ("SIGTERM", setting, 143)


def test_a_signal_while_scoring_eval_before_unwinds_the_script(training_handlers):
    stopper = training_handlers  # nothing trained yet: run's line says the same command starts again
    with pytest.raises(process.Interrupted) as err, stopper.evaluating("before") as scoring:
        os.kill(os.getpid(), signal.SIGINT)
        scoring.check()
    assert err.value.message == (
        "stopped by SIGINT while scoring EVAL_BEFORE: no step was trained; the same command starts again"
    )
    assert stopper.signal_name is None  # not a stop at a step: nothing to save


def test_a_signal_from_the_step_before_ends_the_scoring_at_its_first_check(training_handlers):
    stopper = training_handlers
    stopper.handle(signal.SIGTERM, None)  # came during the training step the evaluation follows
    with stopper.evaluating("during") as scoring:
        scoring.check()
    assert scoring.cut == [signal.SIGTERM] and stopper.signal_name == "SIGTERM"


@pytest.mark.parametrize(
    ("during", "saved", "message"),
    [
        (
            "EVAL_STEPS",
            "checkpoint-4",
            "stopped by SIGTERM while scoring EVAL_STEPS at step 4; checkpoint saved to {saved}; rerun the same "
            "command to resume",
        ),
        (
            "EVAL_AFTER",
            None,
            "stopped by SIGTERM while scoring EVAL_AFTER at step 4; the adapter is saved, the run not marked "
            "finished; rerun the same command to score it and finish",
        ),
    ],
)
def test_a_stop_while_scoring_says_what_it_left(tmp_path, during, saved, message):
    stopper = process.GracefulStop()
    stopper.received, stopper.signal_name, stopper.during, stopper.stopped_at = signal.SIGTERM, "SIGTERM", during, 4
    stopper.saved = tmp_path / saved if saved else None  # EVAL_STEPS' step is checkpointed; EVAL_AFTER's adapter
    assert stopper.message() == message.format(saved=stopper.saved)


# ---------------------------------------------------------------------------------------------------------------
# Two real ranks (gloo), forked from this process so that neither imports torch again


def two_rank_worker(rank, store, out):
    """One of two gloo processes. Both try to lock a folder another run holds; then rank 1 gets SIGTERM during
    step 2 and each rank writes where it stopped; then, in a group with a 2 s timeout, rank 0 all-reduces and rank 1
    never answers (a stalled rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        with process.output_lock(Path(out, "held"), rank0=rank == 0):  # the test process holds it
            refusal = "not refused"
    except ConfigError as err:
        refusal = str(err)
    Path(out, f"lock{rank}.txt").write_text(refusal)
    stopper = callbacks.StopOnSignal()
    stopper.on_train_begin(None, None, None)
    for step in range(1, 6):
        if rank == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        control = step_end(stopper, step)
        if control.should_training_stop:
            break
    stopper.restore()
    Path(out, f"rank{rank}.json").write_text(
        json.dumps([stopper.stopped_at, control.should_save, stopper.signal_name])
    )
    impatient = dist.new_group(timeout=timedelta(seconds=2))
    if rank == 1:
        time.sleep(4)  # past rank 0's 2 s, so that it times out rather than sees this rank leave
        os._exit(0)
    try:
        dist.all_reduce(torch.ones(1), group=impatient)
        text = "no error"
    except Exception as err:
        known = process.stall_error(err, 2)
        text = str(known) if known else f"unrecognised {type(err).__name__}: {err}"
    Path(out, "rank0.txt").write_text(text)
    # the group is broken on purpose: tearing it down at exit may abort (SIGABRT under load), which is not tested
    os._exit(0)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run two_rank_worker on two forked processes once for the tests below; return the folder of their results."""
    out = tmp_path_factory.mktemp("two_ranks")
    lock, _ = process.take_lock(out / "held")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=two_rank_worker, args=(rank, out / "store", out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    lock.release()
    assert [p.exitcode for p in procs] == [0, 0]
    return out


def test_every_rank_of_a_second_torchrun_job_is_refused(two_ranks):
    assert f"is in use by another run (pid {os.getpid()} on " in (two_ranks / "lock0.txt").read_text()
    assert (
        two_ranks / "lock1.txt"
    ).read_text() == f"rank 0 could not lock OUTPUT_DIR {two_ranks / 'held'}; see its message."
    # nothing written
    assert sorted(p.name for p in (two_ranks / "held").iterdir()) == [process.LOCK_NAME, process.HOLDER_NAME]


def test_all_ranks_stop_at_the_step_one_rank_was_signalled(two_ranks):
    # both stop after step 2 and save; only rank 1 got the signal itself
    assert json.loads((two_ranks / "rank0.json").read_text()) == [2, True, "a signal on another rank"]
    assert json.loads((two_ranks / "rank1.json").read_text()) == [2, True, "SIGTERM"]


def test_real_gloo_stall_is_named(two_ranks):
    text = (two_ranks / "rank0.txt").read_text()
    assert text.startswith("a process waited for the others and gave up (DDP_TIMEOUT=2 s; ")
    assert "a stalled or dead rank" in text and "NCCL_DEBUG=INFO" in text


# ---------------------------------------------------------------------------------------------------------------
# stalls, full disks and NaN sampling: one message each, told by type and place, never by words


def test_store_timeout_is_a_stall():
    import torch.distributed as dist

    with pytest.raises(dist.DistStoreError) as err:  # rank 1 never joins: torch's own timeout error
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=2, timeout=timedelta(seconds=1)
        )
    assert "DDP_TIMEOUT=1 s; DistStoreError: Timed out after" in str(process.stall_error(err.value, 1))


@pytest.mark.parametrize(
    "error, is_stall",
    [
        (torch.distributed.DistBackendError("[Rank 1] Watchdog caught collective operation timeout"), True),
        (torch.distributed.DistNetworkError("Connection closed by peer [127.0.0.1]:29500"), True),
        (RuntimeError("CUDA out of memory"), False),
        (RuntimeError("LLM judge request timed out after 30 s"), False),  # a type, never the words, says stall
    ],
)
def test_stall_texts(error, is_stall):
    assert (process.stall_error(error, 600) is not None) == is_stall


@pytest.mark.parametrize("world", [1, 2])
def test_an_error_out_of_backward_is_a_stall_only_while_several_ranks_run(monkeypatch, world):
    # DDP's all-reduce runs inside the autograd engine, and gloo's lost peer comes out of it as a plain RuntimeError
    import torch.distributed as dist

    engine = {}
    exec(
        compile("def _engine_run_backward():\n    raise RuntimeError('gloo')\n", "/x/torch/autograd/graph.py", "exec"),
        engine,
    )
    with pytest.raises(RuntimeError) as err:
        engine["_engine_run_backward"]()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    assert (process.stall_error(err.value, 600) is not None) == (world > 1)
    with pytest.raises(RuntimeError) as elsewhere:  # the same error raised by the user's code is never a stall
        raise RuntimeError("gloo")
    assert process.stall_error(elsewhere.value, 600) is None


@pytest.mark.parametrize(
    "error", [torch.distributed.DistBackendError, torch.distributed.DistStoreError, torch.distributed.DistNetworkError]
)
def test_torch_distributed_errors_are_the_stall_message_whatever_they_say(error):
    with pytest.raises(ConfigError, match=r"DDP_TIMEOUT=9 s; .*\n.*NCCL_DEBUG=INFO"), process.faults("/tmp", 9):
        raise RuntimeError("collective failed") from error("no words of a timeout here")


@pytest.mark.parametrize("text", ["request timed out", "timeout", "Watchdog caught", "Connection reset by peer"])
def test_a_runtime_error_that_reads_like_a_stall_keeps_its_traceback(text):
    with pytest.raises(RuntimeError, match=text), process.faults("/tmp", 600):
        raise RuntimeError(text)


def write_state(path):
    path.write_text(json.dumps({"log_history": ["x" * 100] * 1000}))  # transformers' save_to_json, 100 kB


SAVERS = {  # how Trainer writes each kind of checkpoint file
    "torch.save": lambda path: torch.save({"exp_avg": torch.zeros(100_000)}, path),
    "safetensors": lambda path: save_file({"lora_A": torch.zeros(100_000)}, path),
    "json": write_state,
}


@pytest.mark.parametrize("saver", SAVERS)
def test_real_full_disk_is_named(tiny_disk, saver):
    with pytest.raises(Exception) as err:
        SAVERS[saver](tiny_disk / "file")  # 400 kB into 64 KiB
    message = str(process.disk_full_error(err.value, tiny_disk))
    assert message.startswith(f"No space left on device while writing to OUTPUT_DIR {tiny_disk} (")
    assert "MiB free now" in message and message.splitlines()[1].startswith("Free space there")


@pytest.mark.parametrize(
    "error, is_full",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), False),  # not a save
        (Exception("Error while serializing: I/O error: No space left on device (os error 28)"), False),  # no errno
        (OSError(errno.EACCES, "Permission denied"), False),
        (RuntimeError("shape mismatch"), False),
    ],
)
def test_full_disk_texts(tmp_path, error, is_full):
    assert (process.disk_full_error(error, tmp_path) is not None) == is_full


def test_faults_wraps_a_cause_and_passes_others(tmp_path):
    with pytest.raises(ConfigError, match="No space left on device"), process.faults(tmp_path, 600):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as err:
            raise RuntimeError("saving the checkpoint failed") from err  # found through __cause__
    with pytest.raises(RuntimeError, match="shape mismatch"), process.faults(tmp_path, 600):
        raise RuntimeError("shape mismatch")  # not ours to explain: the traceback stays


def test_disk_full_is_found_by_errno_anywhere_in_the_chain(tmp_path):
    full = f"No space left on device while writing to OUTPUT_DIR {tmp_path}"
    with pytest.raises(ConfigError, match=full), process.faults(tmp_path, 600):
        try:
            raise OSError(errno.EDQUOT, "quota")  # the words do not matter, the errno does
        except OSError:
            raise RuntimeError("saving failed")  # noqa: B904  (found through __context__)
    with pytest.raises(RuntimeError), process.faults(tmp_path, 600):
        raise RuntimeError("No space left on device")  # words alone are not a full disk


def test_disk_full_names_what_to_do_once_there_is_space(tmp_path):
    # evaluate.py and export.py start again rather than resume: their `then`
    with (
        pytest.raises(ConfigError, match="then rerun to export again"),
        process.faults(tmp_path, then="rerun to export again"),
    ):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match="Permission denied"), process.faults(tmp_path, then="rerun"):
        raise OSError(errno.EACCES, "Permission denied")


def test_a_writer_threads_full_disk_is_said_once_by_the_main_thread(tmp_path, capsys, monkeypatch):
    # TensorBoard's event writer thread meets ENOSPC first and dies; the main thread meets it at its next flush
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # as outside pytest: printed to stderr

    def main(argv):
        full = OSError(errno.ENOSPC, "No space left on device")
        writer = threading.Thread(target=lambda: (_ for _ in ()).throw(full))
        writer.start()
        writer.join()
        with process.faults(tmp_path, then="rerun the same command"):
            raise full

    code, err = run_in_process(main, capsys=capsys)
    assert code == 2 and "No space left on device while writing to OUTPUT_DIR" in err
    assert "Traceback" not in err and threading.excepthook is threading.__excepthook__  # put back after


def sample(probs):
    """torch.multinomial run from a frame that transformers' generation owns, as its _sample does."""
    code = compile("torch.multinomial(probs, num_samples=1)", transformers.generation.utils.__file__, "exec")
    exec(code, {"torch": torch, "probs": probs})


def test_nan_probabilities_in_sampling_are_one_message_naming_weights_and_learning_rate():
    nonfinite = "(?s)NaN or inf.*MODEL_NAME's weights hold NaN or inf.*lower LEARNING_RATE"
    with pytest.raises(ConfigError, match=nonfinite), process.faults("/tmp", 600):
        sample(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(RuntimeError), process.faults("/tmp", 600):  # torch's words, raised elsewhere: a bug
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
