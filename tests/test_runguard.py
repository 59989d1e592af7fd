"""Fault injection for checkpoints.py: cut checkpoints, finished reruns, a second run, SIGTERM, full disks, stalls.

    pytest tests/test_runguard.py            # ~35 s on 2 cores; no model loads

Checkpoints here are written in the real formats (safetensors, torch.save zips, JSON) but hold toy tensors, and the
faults are made the way they happen: files cut at a byte count, files missing, a process killed with SIGKILL, a
real signal sent to this process, saves onto a full 64 KiB tmpfs (as root), and a gloo collective that nobody answers.
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
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from safetensors.torch import save_file
from transformers import TrainerControl, TrainerState

from grpo import checkpoints, guards
from grpo.errors import ConfigError

LORA = {"base_model_name_or_path": "/models/Qwen3-8B", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}


def write_checkpoint(folder, step, adapter_config=LORA, log_rows=60):
    """A checkpoint-`step` folder laid out as Trainer saves a PEFT model (see tests below for the file list)."""
    folder.mkdir(parents=True)
    state = {"global_step": step, "max_steps": 100, "train_batch_size": 4}  # what Trainer reads back to resume
    state["log_history"] = [{"step": i, "loss": 0.5, "reward": 0.25} for i in range(log_rows)]
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))  # > 4,096 bytes with 60 rows
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    save_file({"lora_A": torch.zeros(4, 8), "lora_B": torch.ones(8, 4)}, folder / "adapter_model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.zeros(64)}}}, folder / "optimizer.pt")
    torch.save({"last_epoch": step}, folder / "scheduler.pt")
    torch.save({"cpu": torch.random.get_rng_state()}, folder / "rng_state.pth")
    torch.save({"learning_rate": 1e-5}, folder / "training_args.bin")
    return folder


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_whole_checkpoint_is_intact(tmp_path):
    assert checkpoints.checkpoint_problem(write_checkpoint(tmp_path / "checkpoint-2", 2)) is None


# Each fault, and the reason checkpoint_problem() gives. The 4,096-byte cut: what a full disk left.
DAMAGE = {
    "state cut at 4096": (lambda f: cut(f / "trainer_state.json", 4096), "trainer_state.json does not parse"),
    "state missing": (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    "state without step": (
        lambda f: (f / "trainer_state.json").write_text('{"epoch": 1.0}'),
        "trainer_state.json lacks global_step, max_steps, train_batch_size",
    ),
    "adapter config cut": (lambda f: cut(f / "adapter_config.json", 20), "adapter_config.json does not parse"),
    "safetensors cut in the data": (
        lambda f: cut(f / "adapter_model.safetensors", (f / "adapter_model.safetensors").stat().st_size - 10),
        "adapter_model.safetensors is cut short or damaged (",
    ),
    "safetensors cut in the header": (
        lambda f: cut(f / "adapter_model.safetensors", 20),
        "adapter_model.safetensors is cut short or damaged (",
    ),
    "safetensors empty": (lambda f: cut(f / "adapter_model.safetensors", 0), "adapter_model.safetensors is cut short"),
    "safetensors missing": (
        lambda f: (f / "adapter_model.safetensors").unlink(),
        "adapter_model.safetensors is missing",
    ),
    "optimizer missing": (lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    "optimizer cut": (lambda f: cut(f / "optimizer.pt", 500), "optimizer.pt is not a whole torch file"),
    "scheduler missing": (lambda f: (f / "scheduler.pt").unlink(), "scheduler.pt is missing"),
    "rng missing": (lambda f: (f / "rng_state.pth").unlink(), "rng_state.pth is missing"),
    "rng cut": (lambda f: cut(f / "rng_state.pth", 1000), "rng_state.pth is not a whole torch file"),
    "training args cut": (lambda f: cut(f / "training_args.bin", 100), "training_args.bin is not a whole torch file"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_intact_names_each_fault(tmp_path, damage):
    folder = write_checkpoint(tmp_path / "checkpoint-4", 4)
    harm, reason = DAMAGE[damage]
    harm(folder)
    assert checkpoints.checkpoint_problem(folder).startswith(reason)


def test_state_file_is_longer_than_the_cut():
    # the 4,096-byte cut must land inside the JSON, or the test above would test nothing
    assert (
        len(json.dumps({"log_history": [{"step": i, "loss": 0.5, "reward": 0.25} for i in range(60)]}, indent=2))
        > 4096
    )


def resume(output_dir, **changes):
    kwargs = dict(resume=True, model_name="Qwen/Qwen3-8B", lora_r=16, lora_alpha=32, target_modules="q_proj")
    return checkpoints.resume_checkpoint(output_dir, **{**kwargs, **changes}, now=lambda: 0.0)


@pytest.mark.parametrize("damage", ["state cut at 4096", "safetensors cut in the data", "optimizer missing"])
def test_cut_checkpoint_falls_back_to_older_intact_and_is_kept(tmp_path, damage, caplog):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = write_checkpoint(tmp_path / "checkpoint-4", 4)
    DAMAGE[damage][0](newest)
    files = sorted(p.name for p in newest.iterdir())
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path) == tmp_path / "checkpoint-2"
    moved = tmp_path / "broken" / f"checkpoint-4-{time.strftime('%Y%m%d-%H%M%S', time.localtime(0))}"
    assert not newest.exists()  # out of Trainer's way (rotation, later saves into the same name)
    assert sorted(p.name for p in moved.iterdir()) == files  # moved whole, nothing deleted
    assert f"{newest} cannot be resumed ({DAMAGE[damage][1]}" in caplog.text  # named in the log


def test_only_the_main_process_moves(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    (tmp_path / "checkpoint-4").mkdir()  # a save killed before any file was written
    assert resume(tmp_path, main_process=False) == tmp_path / "checkpoint-2"
    assert (tmp_path / "checkpoint-4").is_dir() and not (tmp_path / "broken").exists()  # the other ranks leave it


def test_every_broken_one_is_moved_and_two_moves_in_one_second_get_two_names(tmp_path):
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert resume(tmp_path) is None  # nothing intact: a fresh start
    assert sorted(p.name for p in (tmp_path / "broken").iterdir()) == [
        "checkpoint-2-19700101-000000",
        "checkpoint-4-19700101-000000",
    ]
    (tmp_path / "checkpoint-2").mkdir()  # the same name again, moved in the same second
    resume(tmp_path)
    assert (tmp_path / "broken" / "checkpoint-2-19700101-000000-1").is_dir()


def test_broken_older_one_is_moved_newest_intact_is_chosen(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    write_checkpoint(tmp_path / "checkpoint-10", 10)  # sorted by number, not by name ("10" < "2")
    assert resume(tmp_path) == tmp_path / "checkpoint-10"
    assert [p.name for p in (tmp_path / "broken").iterdir()] == ["checkpoint-2-19700101-000000"]


def test_no_checkpoints_is_a_fresh_start(tmp_path):
    assert resume(tmp_path) is None
    assert resume(tmp_path / "not-yet-created") is None


@pytest.mark.parametrize("leftover", ["checkpoint", "marker"])
def test_resume_false_over_an_earlier_run_is_refused(tmp_path, leftover):
    if leftover == "checkpoint":
        (tmp_path / "checkpoint-4").mkdir()  # even a broken one: starting over would rotate the rest away
    else:
        (tmp_path / checkpoints.FINISHED_NAME).write_text("{}")
    held = "1 checkpoint(s)" if leftover == "checkpoint" else "a finished adapter"
    with pytest.raises(ConfigError) as err:
        resume(tmp_path, resume=False)
    assert f"RESUME=False, but OUTPUT_DIR {tmp_path} already holds {held} of an earlier run" in str(err.value)
    assert len(str(err.value).splitlines()) == 2  # the two-line promise
    assert (tmp_path / "checkpoint-4").is_dir() or leftover == "marker"  # refused before moving anything


# A change of setting against a checkpoint trained with LORA, and the message's key phrase.
MISMATCH = [
    (dict(model_name="Qwen/Qwen3-1.7B"), "it is an adapter for /models/Qwen3-8B, and MODEL_NAME is Qwen/Qwen3-1.7B"),
    (dict(lora_r=8), "it was trained with LORA_R=16, and LORA_R is 8: set LORA_R=16"),
    (dict(lora_alpha=64), "it was trained with LORA_ALPHA=32, and LORA_ALPHA is 64: set LORA_ALPHA=32"),
    (dict(target_modules="q_proj,v_proj"), "LORA_TARGET_MODULES=q_proj, and it is q_proj,v_proj"),
    (dict(target_modules="all-linear"), "LORA_TARGET_MODULES=q_proj, and it is all-linear"),
]


@pytest.mark.parametrize("change, phrase", MISMATCH)
def test_other_model_or_lora_shape_is_refused_before_weights(tmp_path, change, phrase):
    write_checkpoint(tmp_path / "checkpoint-4", 4)
    with pytest.raises(ConfigError) as err:
        resume(tmp_path, **change)
    assert phrase in str(err.value)
    assert str(err.value).startswith(f"cannot resume {tmp_path / 'checkpoint-4'}: ")
    assert str(err.value).endswith(", or give this run a new OUTPUT_DIR.")


EXPANDED = {**LORA, "target_modules": ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"]}


@pytest.mark.parametrize(
    "saved, given, same",
    [
        (EXPANDED, "all-linear", True),  # PEFT saves all-linear expanded to full module paths
        (EXPANDED, "q_proj,up_proj", True),  # the same modules named by hand resume fine
        (EXPANDED, "q_proj", False),
        (LORA, " q_proj ", True),  # spaces tolerated, as build_peft_config does
        (LORA, ["q_proj"], True),  # a list works as well as the comma string
        ({**LORA, "base_model_name_or_path": "/local/copy/Qwen3-8B"}, "q_proj", True),  # a Hub id and its local copy
    ],
)
def test_target_modules_compare_by_module_name(tmp_path, saved, given, same):
    write_checkpoint(tmp_path / "checkpoint-4", 4, adapter_config=saved)
    if same:
        assert resume(tmp_path, target_modules=given) == tmp_path / "checkpoint-4"
    else:
        with pytest.raises(ConfigError, match="LORA_TARGET_MODULES=all-linear, and it is q_proj"):
            resume(tmp_path, target_modules=given)


def finish(output_dir, global_step=4, max_steps=4, num_train_epochs=3):
    save_file({"lora_A": torch.zeros(2, 2)}, output_dir / "adapter_model.safetensors")
    return checkpoints.mark_finished(
        output_dir, global_step=global_step, epoch=0.125, max_steps=max_steps, num_train_epochs=num_train_epochs
    )


@pytest.mark.parametrize(
    "done, asked, is_finished",
    [
        ((4, 4, 3), (4, 3), True),  # the same command again
        ((4, 4, 3), (2, 3), True),  # fewer steps than were trained
        ((4, 4, 3), (8, 3), False),  # MAX_STEPS raised: continue
        ((300, -1, 3), (-1, 3), True),  # an epoch-based run, rerun
        ((300, -1, 3), (-1, 5), False),  # NUM_TRAIN_EPOCHS raised: continue
        ((4, 4, 3), (-1, 3), False),  # a step-limited run says nothing about finishing the epochs
        ((300, -1, 3), (200, 3), True),  # a step limit below what the epoch run reached
    ],
)
def test_finished_run_rerun_is_detected(tmp_path, done, asked, is_finished):
    step, max_steps, epochs = done
    finish(tmp_path, global_step=step, max_steps=max_steps, num_train_epochs=epochs)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir())
    message = checkpoints.finished(tmp_path, *asked)
    assert (message is not None) == is_finished
    assert message is None or message.startswith(f"OUTPUT_DIR {tmp_path} holds a finished run ({step} steps")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir()) == before  # touched nothing


def test_marker_is_written_atomically(tmp_path):
    path = finish(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert json.loads(path.read_text())["global_step"] == 4


@pytest.mark.parametrize("fault", ["no marker", "marker cut", "adapter cut", "adapter missing"])
def test_unfinished_or_damaged_final_save_is_not_finished(tmp_path, fault):
    path = finish(tmp_path)
    if fault == "no marker":
        path.unlink()
    elif fault == "marker cut":
        cut(path, 10)
    elif fault == "adapter cut":
        cut(tmp_path / "adapter_model.safetensors", 30)
    else:
        (tmp_path / "adapter_model.safetensors").unlink()
    assert checkpoints.finished(tmp_path, 4, 3) is None  # the rerun resumes and saves the final adapter again


HOLDER = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from grpo import checkpoints, guards
with guards.output_lock(sys.argv[1], rank0=True):
    print("locked", flush=True)
    time.sleep(120)
"""


def start_holder(output_dir):
    """Another run's process holding OUTPUT_DIR, once it has printed "locked"."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_run_is_refused_quickly_and_first_is_unaffected(tmp_path):
    holder = start_holder(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError) as err, guards.output_lock(tmp_path, rank0=True):
            pass
        assert time.monotonic() - start < 2
        assert f"is in use by another run (pid {holder.pid} on {socket.gethostname()}, since " in str(err.value)
        assert len(str(err.value).splitlines()) == 2
        assert holder.poll() is None  # still running
        assert json.loads((tmp_path / guards.HOLDER_NAME).read_text())["pid"] == holder.pid  # its lock untouched
        # the refused run wrote nothing
        assert sorted(p.name for p in tmp_path.iterdir()) == [guards.LOCK_NAME, guards.HOLDER_NAME]
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
    holder = start_holder(tmp_path)
    holder.kill()  # SIGKILL: no cleanup ran, run.lock still names it
    holder.wait()
    assert json.loads((tmp_path / guards.HOLDER_NAME).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.INFO), guards.output_lock(tmp_path, rank0=True):
        assert json.loads((tmp_path / guards.HOLDER_NAME).read_text())["pid"] == os.getpid()
    assert f"took over run.lock from pid {holder.pid} on {socket.gethostname()}" in caplog.text


def test_lock_is_released_after_the_block(tmp_path):
    with guards.output_lock(tmp_path / "new", rank0=True):
        assert (tmp_path / "new" / guards.LOCK_NAME).is_file()  # OUTPUT_DIR is created for it
    assert not (tmp_path / "new" / guards.LOCK_NAME).exists()
    with guards.output_lock(tmp_path / "new", rank0=True):  # and can be taken again at once
        pass


def test_lock_is_released_when_the_block_raises(tmp_path):
    with pytest.raises(ConfigError), guards.output_lock(tmp_path, rank0=True):
        raise ConfigError("a bad setting")
    assert not (tmp_path / guards.LOCK_NAME).exists()


def test_other_ranks_take_no_lock(tmp_path):
    with guards.output_lock(tmp_path / "out", rank0=False):
        assert not (tmp_path / "out").exists()  # one lock per run, held by global rank 0


def test_unwritable_output_dir_is_a_message(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    message = r"cannot lock OUTPUT_DIR .*file/sub .*: it must be a folder this user"
    with pytest.raises(ConfigError, match=message), guards.output_lock(tmp_path / "file" / "sub", rank0=True):
        pass


def step_end(stopper, step, device="cpu"):
    control = TrainerControl()
    stopper.on_step_end(SimpleNamespace(device=torch.device(device)), TrainerState(global_step=step), control)
    return control


def test_signal_stops_after_the_step_with_a_save(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stopper = guards.StopOnSignal()
    stopper.on_train_begin(None, None, None)
    try:
        control = step_end(stopper, 1)
        assert (control.should_save, control.should_training_stop) == (False, False)  # no signal: no change
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the test process survives
        os.kill(os.getpid(), signal.SIGINT)  # a second one, e.g. an impatient Ctrl-C, is ignored
        control = step_end(stopper, 2)
        assert (control.should_save, control.should_training_stop) == (True, True)
        stopper.on_save(SimpleNamespace(output_dir=str(tmp_path)), TrainerState(global_step=2), control)
    finally:
        stopper.on_train_end(None, None, None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers restored
    saved = tmp_path / "checkpoint-2"
    assert (
        stopper.message()
        == f"stopped by SIGTERM at step 2; checkpoint saved to {saved}; rerun the same command to resume"
    )
    assert stopper.exit_code == 143  # 128 + 15, the shell's code for "ended by SIGTERM"


def test_ctrl_c_exit_code_is_130():
    stopper = guards.StopOnSignal()
    stopper.on_train_begin(None, None, None)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt without the handler
        step_end(stopper, 7)
    finally:
        stopper.restore()
    assert (stopper.signal_name, stopper.stopped_at, stopper.exit_code) == ("SIGINT", 7, 130)


def toy_trainer(output_dir, callbacks, max_steps=10):
    """A transformers Trainer on a two-weight linear model: the real training loop and checkpoint code, on CPU."""
    from transformers import Trainer, TrainingArguments

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}

    data = [{"x": torch.tensor([1.0, float(i)]), "labels": torch.tensor(0.5)} for i in range(64)]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        save_steps=100,  # only the signal makes a checkpoint
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        logging_steps=100,
        disable_tqdm=True,
    )
    return Trainer(model=Toy(), args=args, train_dataset=data, callbacks=callbacks)


def test_sigterm_in_a_real_training_loop_saves_and_stops(tmp_path):
    from transformers import TrainerCallback

    class SendDuringStep3(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:  # step 3 is starting
                os.kill(os.getpid(), signal.SIGTERM)

    stopper = guards.StopOnSignal()
    trainer = toy_trainer(tmp_path, [SendDuringStep3(), stopper])
    trainer.train()
    assert trainer.state.global_step == 3  # step 3 finished, step 4 never started (max_steps was 10)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3"]
    assert json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert stopper.saved == tmp_path / "checkpoint-3"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored at train end


def two_rank_worker(rank, store, out):
    """One of two gloo processes. Both try to lock a folder another run holds; then rank 1 gets SIGTERM during
    step 2 and each rank writes where it stopped; then, in a group with a 2 s timeout, rank 0 all-reduces and rank 1
    never answers (a stalled rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        with guards.output_lock(Path(out, "held"), rank0=rank == 0):  # the test process holds it
            refusal = "not refused"
    except ConfigError as err:
        refusal = str(err)
    Path(out, f"lock{rank}.txt").write_text(refusal)
    stopper = guards.StopOnSignal()
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
        time.sleep(6)
        return
    try:
        dist.all_reduce(torch.ones(1), group=impatient)
        text = "no error"
    except Exception as err:
        known = guards.stall_error(err, 2)
        text = str(known) if known else f"unrecognised {type(err).__name__}: {err}"
    Path(out, "rank0.txt").write_text(text)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run two_rank_worker on two spawned processes once for the tests below; return the folder of their results."""
    out = tmp_path_factory.mktemp("two_ranks")
    lock, _ = guards.take_lock(out / "held")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=two_rank_worker, args=(rank, out / "store", out)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    lock.release()
    assert [p.exitcode for p in procs] == [0, 0]
    return out


@pytest.mark.slow  # a torchrun job of two Pythons importing torch
def test_every_rank_of_a_second_torchrun_job_is_refused(two_ranks):
    assert f"is in use by another run (pid {os.getpid()} on " in (two_ranks / "lock0.txt").read_text()
    assert (
        two_ranks / "lock1.txt"
    ).read_text() == f"rank 0 could not lock OUTPUT_DIR {two_ranks / 'held'}; see its message."
    # nothing written
    assert sorted(p.name for p in (two_ranks / "held").iterdir()) == [guards.LOCK_NAME, guards.HOLDER_NAME]


@pytest.mark.slow  # shares the torchrun job above
def test_all_ranks_stop_at_the_step_one_rank_was_signalled(two_ranks):
    # both stop after step 2 and save; only rank 1 got the signal itself
    assert json.loads((two_ranks / "rank0.json").read_text()) == [2, True, "a signal on another rank"]
    assert json.loads((two_ranks / "rank1.json").read_text()) == [2, True, "SIGTERM"]


def test_real_gloo_stall_is_named(two_ranks):
    text = (two_ranks / "rank0.txt").read_text()
    assert text.startswith("a process waited for the others and gave up (DDP_TIMEOUT=2 s; ")
    assert "a stalled or dead rank" in text and "NCCL_DEBUG=INFO" in text


def test_any_rank_without_a_process_group_is_the_flag():
    assert (guards.any_rank(True), guards.any_rank(False)) == (True, False)


def test_store_timeout_is_a_stall():
    import torch.distributed as dist

    with pytest.raises(dist.DistStoreError) as err:  # rank 1 never joins: torch's own timeout error
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=2, timeout=timedelta(seconds=1)
        )
    assert "DDP_TIMEOUT=1 s; DistStoreError: Timed out after" in str(guards.stall_error(err.value, 1))


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
    assert (guards.stall_error(error, 600) is not None) == is_stall


def write_state(path):
    path.write_text(json.dumps({"log_history": ["x" * 100] * 1000}))  # transformers' save_to_json, 100 kB


SAVERS = {  # how Trainer writes each kind of checkpoint file
    "torch.save": lambda path: torch.save({"exp_avg": torch.zeros(100_000)}, path),
    "safetensors": lambda path: save_file({"lora_A": torch.zeros(100_000)}, path),
    "json": write_state,
}


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a real full disk. Needs root (mount); skipped elsewhere, e.g. on CI runners."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "--lazy", disk], check=True)  # lazy: a failed writer may still hold a file open


@pytest.mark.parametrize("saver", SAVERS)
def test_real_full_disk_is_named(tiny_disk, saver):
    with pytest.raises(Exception) as err:
        SAVERS[saver](tiny_disk / "file")  # 400 kB into 64 KiB
    message = str(guards.disk_full_error(err.value, tiny_disk))
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
    assert (guards.disk_full_error(error, tmp_path) is not None) == is_full


def test_faults_wraps_a_cause_and_passes_others(tmp_path):
    with pytest.raises(ConfigError, match="No space left on device"), guards.faults(tmp_path, 600):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as err:
            raise RuntimeError("saving the checkpoint failed") from err  # found through __cause__
    with pytest.raises(RuntimeError, match="shape mismatch"), guards.faults(tmp_path, 600):
        raise RuntimeError("shape mismatch")  # not ours to explain: the traceback stays


def test_checkpoint_cut_by_a_full_disk_is_skipped(tmp_path):
    # a full disk mid-save: the optimizer write fails and trainer_state.json is never written (Trainer writes it last)
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = write_checkpoint(tmp_path / "checkpoint-4", 4)
    cut(newest / "optimizer.pt", 4096)
    (newest / "trainer_state.json").unlink()
    assert resume(tmp_path) == tmp_path / "checkpoint-2"
    assert (tmp_path / "broken" / "checkpoint-4-19700101-000000" / "optimizer.pt").stat().st_size == 4096


# peft saves all-linear over 20+ modules (every real model) as short names: the run's record tells it apart
MINIMISED = {**LORA, "target_modules": ["o_proj", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]}


@pytest.mark.parametrize("recorded, same", [("all-linear", True), (None, False), ("q_proj", False)])
def test_all_linear_resumes_by_the_runs_recorded_target_modules(tmp_path, recorded, same):
    write_checkpoint(tmp_path / "checkpoint-4", 4, adapter_config=MINIMISED)
    if recorded:
        (tmp_path / "run_settings.json").write_text(json.dumps({"LORA_TARGET_MODULES": recorded}))
    if same:
        assert resume(tmp_path, target_modules="all-linear") == tmp_path / "checkpoint-4"
    else:  # no record (or another one): short names could be a hand-written list, so the user is asked
        with pytest.raises(ConfigError, match="LORA_TARGET_MODULES=o_proj,q_proj,k_proj,v_proj,gate_proj"):
            resume(tmp_path, target_modules="all-linear")
