"""Process guards for a training run, in the order grpotrainer.py uses them. Training only: imports transformers.

- `output_lock`: two runs writing into one OUTPUT_DIR (filelock's flock, which the OS releases even on kill -9).
- `StopOnSignal`: SIGTERM (a scheduler's preemption notice) and Ctrl-C: all ranks finish the step and save, or,
  past STOP_GRACE or at a second signal, end without saving it.
- `faults`: a full disk, a distributed stall or NaN sampling, told by type and where raised, as one message.
- `generation_guards`, `adapter_in_fp32`: undo TRL's casts of the adapter to bf16, and its generation that never
  compiles.
"""

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout
from transformers import TrainerCallback

from grpo import cli, hardware
from grpo.errors import ConfigError, first_line

log = logging.getLogger("grpotrainer")
LOCK_NAME = "run.lock"  # in OUTPUT_DIR, while a run holds it (filelock's)
HOLDER_NAME = "run.lock.json"  # beside it: the holding run's pid, host and start, for the refusal
TORCH_DISTRIBUTED = ("/torch/distributed/", "/torch/nn/parallel/")  # where a collective raises, in torch
AUTOGRAD_ENGINE = "/torch/autograd/graph.py"  # where backward's errors, DDP's all-reduce's included, come out
# seconds after a stop signal in which another is its copy, not a second request: torchrun forwards the terminal's
# Ctrl-C to workers that got it too, and Slurm signals torchrun and its workers alike
COPY_WINDOW = 2.0


# ---------------------------------------------------------------------------------------------------------------
# one run per folder


def any_rank(flag, device=None):
    """True when `flag` is true on any process (an all-reduce of max). Every process must call it at the same
    point."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return bool(flag)
    import torch

    if device is None:  # NCCL reduces only CUDA tensors; accelerate has set this process's GPU
        nccl = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    t = torch.tensor([int(bool(flag))], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def read_holder(path):
    """The holder file's {"pid", "host", "since"} as written by `take_lock`, or {} when absent or half-written."""
    try:
        holder = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def take_lock(output_dir):
    """Lock OUTPUT_DIR for this process: (the held FileLock, None), or (None, why it is refused). A killed run's
    lock is taken over; the holder's pid, host and time go to run.lock.json, since filelock owns the lock file."""
    output_dir = Path(output_dir)
    lock = FileLock(output_dir / LOCK_NAME, timeout=0, thread_local=False)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        return None, holder_message(output_dir, read_holder(output_dir / HOLDER_NAME))
    except OSError as err:
        return None, f"cannot lock OUTPUT_DIR {output_dir} ({err}): it must be a folder this user can write."
    previous = read_holder(output_dir / HOLDER_NAME)
    if previous.get("pid"):
        log.info("took over %s from pid %s on %s, which no longer holds it", LOCK_NAME, *holder_id(previous))
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M")}
    (output_dir / HOLDER_NAME).write_text(json.dumps(holder))
    return lock, None


def holder_id(holder):
    return holder.get("pid", "?"), holder.get("host", "an unknown host")


def holder_message(output_dir, holder):
    pid, host = holder_id(holder)
    since = f"since {holder['since']}" if holder.get("since") else f"which has not named itself in {HOLDER_NAME} yet"
    return (
        f"OUTPUT_DIR {output_dir} is in use by another run (pid {pid} on {host}, {since}); "
        "two runs in one folder overwrite each other.\nWait for it to end, stop it, or give this run another "
        "OUTPUT_DIR."
    )


@contextlib.contextmanager
def output_lock(output_dir, rank0):
    """Hold OUTPUT_DIR for one run while the block runs; refuse with ConfigError when another run has it.

    Only global rank 0 takes the lock and every rank learns the outcome (`any_rank`), so all ranks of a refused run
    stop before writing anything. That needs the process group: enter this after build_config().
    """
    lock, refusal = take_lock(output_dir) if rank0 else (None, None)
    if any_rank(refusal is not None):
        raise ConfigError(refusal or f"rank 0 could not lock OUTPUT_DIR {output_dir}; see its message.")
    try:
        yield
    finally:
        if lock is not None:
            for name in (HOLDER_NAME, LOCK_NAME):  # while still locked; filelock locks anew if a waiter opened it
                (Path(output_dir) / name).unlink(missing_ok=True)
            lock.release()


class ResumedSettings(TrainerCallback):
    """A resumed run takes this run's SAVE_STEPS and LOGGING_STEPS, and the learning rate of the schedule Trainer
    built for this run's length at the step reached (README: resuming).

    Trainer restores the checkpoint's trainer_state.json over the new intervals (its old SAVE_STEPS would then
    decide what a kill loses), and the optimizer's learning rate is the old schedule's: after a raised MAX_STEPS,
    the old end's 0 for the first resumed step. The new scheduler (its length, warm-up and decay) then runs from
    the next step only. On a fresh start, or a resume at the same length, both are what Trainer has already.
    """

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        state.compute_steps(args, state.max_steps)
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper, when there is one
        if optimizer is None or not hasattr(scheduler, "lr_lambdas"):  # not a LambdaLR (DeepSpeed's own)
            return
        step = scheduler.last_epoch
        rates = [base * rate(step) for base, rate in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = lr
        scheduler._last_lr = rates  # what get_last_lr(), the logged learning_rate, reads; no public setter


# ---------------------------------------------------------------------------------------------------------------
# SIGTERM and Ctrl-C


class StopOnSignal(TrainerCallback):
    """On SIGTERM or SIGINT, finish the current optimiser step, save a checkpoint and stop training.

    The handlers only record the signal; at each step end the processes agree (`any_rank`), so all stop at the same
    step. A step that does not end within `grace` seconds of the signal (STOP_GRACE; a hung reward, a generation
    that never ends), or a second signal while it runs, ends the process at once with one line, without saving:
    a cluster would otherwise burn the allocation waiting, and the newest whole checkpoint is what the same command
    resumes. Signals within COPY_WINDOW of the first are its copies, and signals during the save are ignored, so a
    launcher forwarding the terminal's Ctrl-C cannot cut the save. `exit_code` is 128 + the signal number, not 0: a
    Job, a restart policy or an `until` loop must see that the run is not done.
    """

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), resuming=None, grace=0):
        # until training begins, a signal unwinds through cli.run, whose line says what the same command does then
        again = (
            f"the same command resumes from {resuming}"
            if resuming
            else "no step was trained; the same command starts again"
        )
        cli.set_phase("loading the model", again)
        self.signals = tuple(signals)
        self.grace = grace  # STOP_GRACE: seconds the step may take after the signal; 0 = no limit
        self.received = None  # the first signal's number
        self.received_at = None  # and its time.monotonic()
        self.signal_name = None  # its name, once the processes have agreed to stop
        self.stopped_at = None  # the global step after which training stopped
        self.saved = None  # the checkpoint folder saved for the stop
        self.newest = resuming  # the newest whole checkpoint: what a rerun resumes from
        self.step = None  # the steps finished when the current one began
        self.previous = {}  # signal number -> the handler to restore
        self.timer = None  # ends the process when the step outlasts `grace`
        self.deciding = threading.RLock()  # the step end and the timer: one of them decides, save or end
        self.between = True  # from a step's end to the next one's begin: the Trainer logs, evaluates, saves

    def handle(self, signum, frame):
        """Record the first signal and start the grace timer; a later one ends a step still running at once, or is
        ignored, saying what the run is doing now: saving, or ending."""
        name = signal.Signals(signum).name
        if self.received is None:
            self.received, self.received_at = signum, time.monotonic()
            bound = f"if it ends within STOP_GRACE={self.grace:g} s" if self.grace else "when it ends"
            log.warning("%s received: saving a checkpoint after this step %s", name, bound)
            self.arm()
            return
        if self.signal_name is None and time.monotonic() - self.received_at > COPY_WINDOW:
            self.end_step(f"{name} came while it ran")
        if self.saved is not None:
            doing = "the checkpoint is saved and the run is ending"
        elif self.signal_name is not None:
            doing = "a checkpoint is being saved"
        elif self.between:
            doing = "the run is saving, logging or evaluating between steps"
        else:
            doing = "it is a copy of the first signal (a launcher forwards it); the step is still running"
        log.warning("%s ignored: %s; kill -9 stops at once, without a new checkpoint", name, doing)

    def arm(self):
        """Start the grace timer (none when STOP_GRACE is 0)."""
        if self.grace:
            self.timer = threading.Timer(
                self.grace, self.end_step, args=(f"not ended within STOP_GRACE={self.grace:g} s",)
            )
            self.timer.daemon = True
            self.timer.start()

    def end_step(self, why):
        """End the process now, with the step in progress unsaved and the newest whole checkpoint kept; unless the
        processes have agreed to save (the save goes on), or the Trainer is between steps, where it may be writing
        a checkpoint of SAVE_STEPS (the next step gets the grace anew). Written straight to file descriptor 2 and
        ended with os._exit, since the main thread may be stuck holding sys.stderr's lock or in a thread join."""
        with self.deciding:
            if self.signal_name is not None:
                return
            if self.between:
                return self.arm()
            again = f"from {self.newest}" if self.newest else "from the start"
            line = (
                f"stopped by {signal.Signals(self.received).name} in step {self.step + 1}: {why}, so it is not saved; "
            )
            os.write(2, f"\n{line}rerun the same command to resume {again}\n".encode())
            os._exit(self.exit_code)

    def on_train_begin(self, args, state, control, **kwargs):
        for signum in self.signals:
            self.previous[signum] = signal.signal(signum, self.handle)

    def on_step_begin(self, args, state, control, **kwargs):
        with self.deciding:
            self.step = state.global_step
            self.between = False

    def on_step_end(self, args, state, control, **kwargs):
        stop = any_rank(self.received is not None, args.device)  # a collective: not under the lock the timer takes
        with self.deciding:
            self.between = True
            if stop and self.signal_name is None:
                self.signal_name = signal.Signals(self.received).name if self.received else "a signal on another rank"
                self.stopped_at = state.global_step
                control.should_save = True
                control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.newest = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.signal_name is not None and self.saved is None:
            self.saved = self.newest

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()

    def restore(self):
        """Put back the handlers that were there before training (safe to call more than once): cli.run's, whose
        line for a stop from now on says that the run is not finished."""
        cli.set_phase(
            "finishing the run", "it is not marked finished; the same command finishes it from its checkpoint"
        )
        while self.previous:
            signum, handler = self.previous.popitem()
            signal.signal(signum, handler)
        if self.timer is not None:
            self.timer.cancel()

    @property
    def exit_code(self):
        return 128 + (self.received or signal.SIGTERM)

    def message(self):
        where = f"checkpoint saved to {self.saved}" if self.saved else "no checkpoint was saved"
        return f"stopped by {self.signal_name} at step {self.stopped_at}; {where}; rerun the same command to resume"


# ---------------------------------------------------------------------------------------------------------------
# full disks and stalls


class KeepFp32(TrainerCallback):
    """Keep what the model holds in fp32 in fp32 under USE_TRANSFORMERS_CONTINUOUS_BATCHING with BF16.

    TRL 1.16 casts the whole model to bf16 right before `generate_batch` and never back: the LoRA weights would then
    train in bf16 (an Adam step of 1e-5 rounds away above ~3e-3), and the rotary `inv_freq` drifts 0.35 rad of phase
    at position 300. Right after generation this puts back every fp32 tensor held here (torch's cast swaps `.data`
    for a new tensor, so the originals stay intact). No public hook sits between generation and the loss, so
    `generate_batch` is wrapped on the PeftModel TRL generates with.
    """

    def __init__(self, model):
        import torch

        self.model = model
        self.params = []  # (parameter, its fp32 tensor), taken at each step's start
        self.buffers = [
            (module, name, buffer)
            for module in model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and buffer.dtype == torch.float32
        ]
        generate_batch = model.generate_batch

        def generate_then_restore(*args, **kwargs):
            try:
                return generate_batch(*args, **kwargs)
            finally:
                self.restore()

        model.generate_batch = generate_then_restore

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        self.params = [(p, p.data) for p in self.model.parameters() if p.dtype == torch.float32]

    on_train_begin = on_step_begin

    def restore(self):
        for param, data in self.params:
            param.data = data
        for module, name, buffer in self.buffers:
            module._buffers[name] = buffer


def adapter_in_fp32(model):
    """Put the trainable (LoRA) weights of a 4-bit model back in fp32, before the optimizer is built: TRL 1.16 casts
    them to bf16, where at LEARNING_RATE=1e-5 75 % of q_proj's lora_A entries never move (updates round away)."""
    import torch

    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


class CompileDecode(TrainerCallback):
    """CACHE_IMPLEMENTATION=static in training: TRL 1.16 builds its GenerationConfig with disable_compile=True, so
    the decode step would never compile. This turns it back on, on trainer.generation_config (no public hook)."""

    def __init__(self, generation_config):
        self.generation_config = generation_config

    def on_train_begin(self, args, state, control, **kwargs):
        self.generation_config.disable_compile = False
        self.generation_config.compile_config = hardware.decode_options("static")["compile_config"]


def generation_guards(trainer):
    """The callbacks undoing TRL 1.16's generation choices that this run's settings meet (CompileDecode, KeepFp32)."""
    callbacks = []
    if trainer.args.cache_implementation == "static":
        callbacks.append(CompileDecode(trainer.generation_config))
    if trainer.args.use_transformers_continuous_batching and trainer.args.bf16:
        callbacks.append(KeepFp32(trainer.model))
    return callbacks


def chain(err):
    """`err` and the exceptions it was raised from or during, outermost first."""
    seen = []
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def frames(err):
    """The (file, function) of each Python frame `err` passed through, outermost first."""
    tb, out = err.__traceback__, []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename.replace(os.sep, "/"), tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


def writer_failed(e):
    """A checkpoint writer's error that keeps no errno: safetensors' SafetensorError raised while serialising a
    file, or the RuntimeError of torch.save's C++ writer (raised inside torch/serialization.py's save)."""
    from safetensors import SafetensorError

    where = frames(e)
    if isinstance(e, SafetensorError):
        return any(name in ("save_file", "serialize_file") for _, name in where)
    return type(e) is RuntimeError and any(f.endswith("torch/serialization.py") and n == "save" for f, n in where)


def disk_full_error(err, output_dir, then="rerun the same command to resume"):
    """A ConfigError naming the full disk and OUTPUT_DIR when `err` (or its cause) is ENOSPC/EDQUOT, or a checkpoint
    writer's error without errno (`writer_failed`) under 64 MiB free; the next run sets the cut checkpoint aside.
    `then`: what to do once there is space (evaluate.py and export.py start again rather than resume)."""
    free = free_bytes(output_dir)
    for e in chain(err):
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or (writer_failed(e) and free is not None and free < 64 * 2**20):
            free_text = f", {free / 2**20:.0f} MiB free now" if free is not None else ""
            return ConfigError(
                f"No space left on device while writing to OUTPUT_DIR {output_dir} ({first_line(e)}{free_text}).\n"
                f"Free space there (or set OUTPUT_DIR to a larger disk), then {then}."
            )
    return None


def stall_error(err, ddp_timeout):
    """A ConfigError naming DDP_TIMEOUT when `err` is torch's DistError, a RuntimeError raised inside
    torch.distributed (gloo's timeout), or one raised by the autograd engine while more than one rank runs (DDP's
    gradient all-reduce runs inside backward, and gloo's lost-peer and timeout errors come out of it as plain
    RuntimeErrors), else None. Any other error, whatever its text, is not a stall."""
    import torch.distributed as dist

    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    for e in chain(err):
        where = frames(e)
        # gloo's own timeout is a plain RuntimeError, raised by a collective in torch/distributed (or DDP's sync)
        inner = where[-1] if where else ("", "")
        in_torch_distributed = type(e) is RuntimeError and any(d in inner[0] for d in TORCH_DISTRIBUTED)
        in_backward = type(e) is RuntimeError and several and inner[0].endswith(AUTOGRAD_ENGINE)
        if isinstance(e, dist.DistError) or in_torch_distributed or in_backward:
            return ConfigError(
                f"a process waited for the others and gave up (DDP_TIMEOUT={ddp_timeout} s; {first_line(e)}).\n"
                "Check every rank's log for the first error (a stalled or dead rank), then NCCL and the network "
                "(NCCL_DEBUG=INFO); raise DDP_TIMEOUT only if a rank legitimately works alone that long."
            )
    return None


@contextlib.contextmanager
def faults(output_dir, ddp_timeout):
    """Turn a full disk, a distributed stall or NaN probabilities raised in the block into a ConfigError (exit 2)."""
    try:
        yield
    except Exception as err:
        known = disk_full_error(err, output_dir) or stall_error(err, ddp_timeout) or nonfinite_error(err)
        if known is None:
            raise
        raise known from None


@contextlib.contextmanager
def disk_full(output_dir, then):
    """A full disk raised in the block as `disk_full_error`'s one message (exit 2); any other error goes on."""
    try:
        yield
    except Exception as err:
        if (known := disk_full_error(err, output_dir, then)) is None:
            raise
        raise known from None


def nonfinite_error(err):
    """A ConfigError when sampling met NaN or inf probabilities (damaged weights, or a diverged run): a RuntimeError
    from transformers' generation whose innermost frame holds a `probs` tensor torch.multinomial refuses."""
    import torch

    for e in chain(err):
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if type(e) is not RuntimeError or tb is None or "transformers/generation/" not in frames(e)[-1][0]:
            continue
        probs = tb.tb_frame.f_locals.get("probs")
        if isinstance(probs, torch.Tensor) and not (probs.isfinite().all() and (probs >= 0).all()):
            return ConfigError(
                f"the model's next-token probabilities are NaN or inf ({first_line(e)}).\n"
                "Before the first step, MODEL_NAME's weights hold NaN or inf: re-download or re-convert them. "
                "After steps, the run diverged: lower LEARNING_RATE and rerun to resume from the newest checkpoint."
            )
    return None


def free_bytes(path):
    """Free bytes on the filesystem holding `path` (or its nearest existing parent); None if unknown."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
