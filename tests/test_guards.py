"""Tests of grpo/guards.py: the run lock, signals with all ranks agreeing, stall and full-disk naming.

.venv/bin/python -m pytest tests/test_guards.py -q -m "not slow"
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
from conftest import REPO
from safetensors.torch import save_file
from transformers import TrainerControl, TrainerState

from grpo import guards
from grpo.errors import ConfigError


def test_nan_probabilities_in_sampling_are_one_message_naming_weights_and_learning_rate():
    import torch
    import transformers.generation.utils

    from grpo import guards

    # torch.multinomial refusing NaN probabilities, raised from a frame of transformers' generation, as in _sample
    code = compile("torch.multinomial(probs, 1)", transformers.generation.utils.__file__, "exec")
    nonfinite = "(?s)NaN or inf.*MODEL_NAME's weights hold NaN or inf.*lower LEARNING_RATE"
    with pytest.raises(ConfigError, match=nonfinite), process.faults("/tmp", 600):
        exec(code, {"torch": torch, "probs": torch.tensor([[float("nan"), 1.0]])})
    # any other error keeps its traceback
    with pytest.raises(RuntimeError, match="another error"), process.faults("/tmp", 600):
        raise RuntimeError("another error")


HOLDER = f"""
import sys, time
sys.path.insert(0, {str(REPO)!r})
from grpo import checkpoints, guards
with process.output_lock(sys.argv[1], rank0=True):
    print("locked", flush=True)
    time.sleep(120)
"""


def start_holder(output_dir):
    """Another run's process holding OUTPUT_DIR, once it has printed "locked"."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


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
        assert len(str(err.value).splitlines()) == 2
        assert holder.poll() is None  # still running
        assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == holder.pid  # its lock untouched
        # the refused run wrote nothing
        assert sorted(p.name for p in tmp_path.iterdir()) == [process.LOCK_NAME, process.HOLDER_NAME]
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
    holder = start_holder(tmp_path)
    holder.kill()  # SIGKILL: no cleanup ran, run.lock still names it
    holder.wait()
    assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.INFO), process.output_lock(tmp_path, rank0=True):
        assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == os.getpid()
    assert f"took over run.lock from pid {holder.pid} on {socket.gethostname()}" in caplog.text


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
        with process.output_lock(Path(out, "held"), rank0=rank == 0):  # the test process holds it
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
    """Run two_rank_worker on two spawned processes once for the tests below; return the folder of their results."""
    out = tmp_path_factory.mktemp("two_ranks")
    lock, _ = process.take_lock(out / "held")
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
    assert sorted(p.name for p in (two_ranks / "held").iterdir()) == [process.LOCK_NAME, process.HOLDER_NAME]


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
    assert (process.any_rank(True), process.any_rank(False)) == (True, False)


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


def test_a_second_signal_says_what_the_run_is_doing(caplog, tmp_path, monkeypatch):
    monkeypatch.setattr(guards.os, "_exit", lambda code: pytest.fail(f"exited {code}: no signal here ends the run"))
    stopper = guards.StopOnSignal()
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
    assert said[1] == "SIGINT ignored: it is a copy of the first signal (a launcher forwards it)"
    assert said[2:] == [
        "SIGINT ignored: a checkpoint is being saved",
        "SIGINT ignored: the checkpoint is saved and the run is ending",
    ]


def stop_exits(monkeypatch):
    """os._exit, as StopOnSignal calls it, recording the code and waking the "hung step" (an Event) instead."""
    codes, ended = [], threading.Event()
    monkeypatch.setattr(guards.os, "_exit", lambda code: (codes.append(code), ended.set()))
    return codes, ended


def test_a_step_that_outlasts_the_grace_ends_the_run_unsaved(monkeypatch, capfd, tmp_path):
    codes, ended = stop_exits(monkeypatch)
    stopper = guards.StopOnSignal(resuming=tmp_path / "checkpoint-2", grace=0.2)
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
    stopper = guards.StopOnSignal(grace=0)  # no grace: only the second signal ends the step
    stopper.on_train_begin(None, None, None)
    try:
        stopper.on_step_begin(None, TrainerState(global_step=0), None)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        assert ended.wait(60)
    finally:
        stopper.restore()
    assert codes == [130]
    lines = capfd.readouterr().err.strip().splitlines()  # the stand-in os._exit returns: a warning may follow
    assert (
        "stopped by SIGINT in step 1: SIGINT came while it ran, so it is not saved; rerun the same command to resume "
        "from the start"
    ) in lines


def test_the_grace_never_cuts_a_save_between_steps(monkeypatch):
    codes, ended = stop_exits(monkeypatch)
    stopper = guards.StopOnSignal(grace=0.1)
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


def test_disk_full_is_found_by_errno_anywhere_in_the_chain(tmp_path):
    full = f"No space left on device while writing to OUTPUT_DIR {tmp_path}"
    with pytest.raises(ConfigError, match=full), process.faults(tmp_path, 600):
        try:
            raise OSError(errno.EDQUOT, "quota")  # the words do not matter, the errno does
        except OSError:
            raise RuntimeError("saving failed")  # noqa: B904  (found through __context__)
    with pytest.raises(RuntimeError), process.faults(tmp_path, 600):
        raise RuntimeError("No space left on device")  # words alone are not a full disk


def sample(probs):
    """torch.multinomial run from a frame that transformers' generation owns, as its _sample does."""
    code = compile("torch.multinomial(probs, num_samples=1)", transformers.generation.utils.__file__, "exec")
    exec(code, {"torch": torch, "probs": probs})


def test_nan_probabilities_are_found_where_sampling_raised():
    with pytest.raises(ConfigError, match="(?s)NaN or inf.*lower LEARNING_RATE"), process.faults("/tmp", 600):
        sample(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(RuntimeError), process.faults("/tmp", 600):  # torch's words, raised elsewhere: a bug
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")


def test_filelock_refusal_names_the_holder_and_a_killed_holder_is_taken_over(tmp_path):
    holder = start_holder(tmp_path)
    try:
        refusal = f"in use by another run \\(pid {holder.pid} on {socket.gethostname()}, since "
        with pytest.raises(ConfigError, match=refusal), process.output_lock(tmp_path, rank0=True):
            pass
    finally:
        holder.kill()  # SIGKILL: its files stay, naming it, but the OS released its flock
        holder.wait()
    with process.output_lock(tmp_path, rank0=True):
        assert json.loads((tmp_path / process.HOLDER_NAME).read_text())["pid"] == os.getpid()
    assert not (tmp_path / process.LOCK_NAME).exists() and not (tmp_path / process.HOLDER_NAME).exists()


def tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():  # lora_B is zero at init, which would leave lora_A without a gradient: a trained adapter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    model.generate_batch = lambda *args, **kwargs: {}  # stands in for transformers' continuous batching
    return model


def inv_freqs(model):
    return {n: b for n, b in model.named_buffers() if n.endswith("inv_freq")}


def adam_step(model, lr=1e-5):
    """One AdamW step of `lr` on a loss that gives every LoRA weight a gradient; the share of lora_A entries moved."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    lora_a = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}
    ids = torch.randint(0, 64, (2, 12))
    logits = model(input_ids=ids).logits
    (logits.float() ** 2).mean().backward()
    optimizer.step()
    moved = [(p.detach() != lora_a[n]).float().mean().item() for n, p in model.named_parameters() if "lora_A" in n]
    return sum(moved) / len(moved)


def generate_as_trl_does(model):
    # GRPOTrainer._generate_single_turn, continuous batching with bf16: cast the whole model, then generate_batch
    model.to(torch.bfloat16)
    model.generate_batch([[1, 2, 3]])


def test_continuous_batching_keeps_the_adapter_and_rope_fp32():
    model = tiny_lora_model()
    rope = {n: b.clone() for n, b in inv_freqs(model).items()}
    guard = patches.KeepFp32(model)
    guard.on_step_begin(None, None, None)
    generate_as_trl_does(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    assert rope and all(torch.equal(inv_freqs(model)[n], b) for n, b in rope.items())  # the fp32 original itself
    assert {b.dtype for b in inv_freqs(model).values()} == {torch.float32}
    model.to(torch.float32)  # the frozen base was bf16 in a real run; here the step itself runs in fp32
    assert adam_step(model) == 1.0  # every lora_A entry moved


def test_control_without_the_guard_trl_leaves_rope_and_adapter_bf16():
    model = tiny_lora_model()
    rope = {n: b.clone() for n, b in inv_freqs(model).items()}
    generate_as_trl_does(model)
    assert {b.dtype for b in inv_freqs(model).values()} == {torch.bfloat16}
    assert any(not torch.equal(inv_freqs(model)[n].float(), b) for n, b in rope.items())  # rounded
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}


def quantized_style(model):
    # GRPOTrainer.__init__ for a quantized model: every trainable weight but DoRA's magnitude to bf16
    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)


@pytest.mark.parametrize("guarded", [True, False])
def test_a_4bit_run_trains_all_of_lora_a_only_with_the_adapter_in_fp32(guarded):
    model = tiny_lora_model()
    quantized_style(model)
    if guarded:
        patches.adapter_in_fp32(model)
    moved = adam_step(model)
    if guarded:
        assert moved == 1.0
    else:
        assert moved < 0.5  # the control: most 1e-5 updates round away in bf16


KILLED_AFTER_LOCKING = f"""
import os, signal, sys
sys.path.insert(0, {str(REPO)!r})
from filelock import FileLock
from grpo import guards
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
