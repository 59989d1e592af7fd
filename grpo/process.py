"""Process safety for the scripts: clean exits, what a stop leaves, one run per folder, SIGTERM and Ctrl-C in
training, and faults told by their type and where they were raised.

- `run`: a ConfigError ends as one paragraph and exit 2; SIGTERM or Ctrl-C as one line saying where it stopped
  (`phase`), exit 128 + the signal; a closed stdout quietly, as SIGPIPE would.
- `output_lock`: two runs writing into one OUTPUT_DIR (filelock's flock, which the OS releases even on kill -9).
- `StopOnSignal`: in training, all ranks finish the step and save, or, past STOP_GRACE or at a second signal, end
  without saving it.
- `faults`, `disk_full`: a full disk, a distributed stall or NaN sampling as one message.
"""

import contextlib
import errno
import importlib.util
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

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
# exits


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C outside training: unwinds the script through every `finally` (the lock, a publish_dir).
    A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum, message):
        super().__init__(signum, message)
        self.signum, self.message = signum, message  # the phase as it was when the signal came


# What the script is doing now and what an interruption there leaves, set with `phase`; read by `run`'s message.
NOTHING_WRITTEN = "nothing was written; the same command starts again"


_phase = ["starting", NOTHING_WRITTEN]


def set_phase(doing, outcome=None):
    """What the script does now and what a stop leaves (None keeps the current outcome), for `run`'s message."""
    _phase[:] = [doing, _phase[1] if outcome is None else outcome]


@contextlib.contextmanager
def phase(doing, outcome=None):
    """`set_phase` for the block only."""
    before = list(_phase)
    set_phase(doing, outcome)
    try:
        yield
    finally:
        _phase[:] = before


def stop_message(signum):
    """The one line for a signal `signum` in the current phase.
    >>> with phase("loading the model", "nothing was written"):
    ...     stop_message(signal.SIGTERM)
    'stopped by SIGTERM while loading the model: nothing was written'
    """
    return f"stopped by {signal.Signals(signum).name} while {_phase[0]}: {_phase[1]}"


# The Interrupted a signal raised, until it is handled. Raised inside a finalizer (a __del__ the garbage collector
# runs, as regex's during tokenizer loading), Python prints it as "Exception ignored" and goes on: the stop is lost,
# and the run trained to its end. `raise_pending` raises it again where a stop can be taken.
_pending = []


def _interrupt(signum, frame):
    _pending[:] = [Interrupted(signum, stop_message(signum))]
    raise _pending[0]


def raise_pending():
    """Raise again the Interrupted of a signal that a finalizer swallowed, if one did."""
    if _pending:
        raise _pending.pop()


@contextlib.contextmanager
def interruptible():
    """SIGTERM and Ctrl-C unwind the block through `run`, with its one line for the phase, whatever handlers training
    installed: for work inside train() that trains nothing (EVAL_BEFORE), where finishing "the step" would save it."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(main):
    """Call `main(argv)`: a ConfigError ends as one paragraph and exit 2; SIGTERM and Ctrl-C as one line saying
    where it stopped (`phase`), exit 128 + the signal. Training installs its own handlers meanwhile."""
    set_phase("starting", NOTHING_WRITTEN)
    _pending.clear()
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return main(sys.argv[1:])
    except ConfigError as err:
        print(f"\nerror: {err}\n", file=sys.stderr, flush=True)
        sys.exit(2)
    except BrokenPipeError:
        if not _stdout_broken():  # another pipe's: a bug, with its traceback
            raise
        # stdout's reader went away (`--help | head -1`): end quietly, as SIGPIPE ends a command-line tool, with
        # stdout pointed at /dev/null so that Python's own flush at exit finds nothing to complain about
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except (Interrupted, KeyboardInterrupt) as err:
        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        _pending.clear()
        for other in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut this line into a traceback
            signal.signal(other, signal.SIG_IGN)
        message = err.message if isinstance(err, Interrupted) else stop_message(signum)
        print(f"\n{message}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        for signum, handler in previous.items():  # a caller's own (pytest's), once main is done
            signal.signal(signum, handler)


def _stdout_broken():
    """Whether stdout is a pipe or socket whose reader has gone (poll says POLLERR or POLLHUP)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout (a test's capture)
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def setup_logging(prefix, rank0=True):
    """Log the "grpotrainer" loggers to stderr as "[prefix] message". The root logger stays unconfigured: a
    library with its own handler (huggingface_hub) would otherwise print every message twice."""

    logger = logging.getLogger("grpotrainer")
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())
    logger.handlers[0].stream = sys.stderr  # today's (setStream would flush a closed one: a test's capture)
    logger.handlers[0].setFormatter(logging.Formatter(f"[{prefix}] %(message)s"))
    logger.setLevel(logging.INFO if rank0 else logging.WARNING)
    logger.propagate = False
    return logger


def require(packages, script):
    """Refuse to start, with the command that fixes it, when this Python lacks a package the script needs."""
    if missing := [p for p in packages if importlib.util.find_spec(p) is None]:
        raise ConfigError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}.\n"
            f"Run `make install` once, then `.venv/bin/python {script} ...` (or `make smoke`, `make train`)."
        )


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
    from filelock import FileLock, Timeout

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


# ---------------------------------------------------------------------------------------------------------------
# SIGTERM and Ctrl-C in training


class Watchdog(threading.Thread):
    """Calls `fire(*args)` once `seconds` of the process's running time have passed, unless cancelled first. Time
    the process spent stopped (Ctrl-Z, SIGSTOP, a scheduler's suspend) does not count: every thread stops with it,
    so a tick that took far longer than asked is counted as one tick. A daemon thread: it never holds the exit."""

    TICK = 0.25  # seconds per tick; a tick counts at most TICK + SLACK (a busy machine delays threads a little)
    SLACK = 1.0

    def __init__(self, seconds, fire, *args):
        super().__init__(name=f"watchdog-{seconds:g}s", daemon=True)
        self.seconds, self.fire, self.args = seconds, fire, args
        self.cancelled = threading.Event()
        self.start()

    def run(self):
        left = self.seconds
        while left > 0:
            start = time.monotonic()
            if self.cancelled.wait(min(self.TICK, left)):
                return
            left -= min(time.monotonic() - start, self.TICK + self.SLACK)
        self.fire(*self.args)

    def cancel(self):
        self.cancelled.set()


class GracefulStop:
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
        # until training begins, a signal unwinds through run, whose line says what the same command does then
        again = (
            f"the same command resumes from {resuming}"
            if resuming
            else "no step was trained; the same command starts again"
        )
        set_phase("loading the model", again)
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
        self.during = None  # "EVAL_AFTER", ...: the evaluation a signal cut short

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
            self.timer = Watchdog(self.grace, self.end_step, f"not ended within STOP_GRACE={self.grace:g} s")

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

    def restore(self):
        """Put back the handlers that were there before training (safe to call more than once): run's, whose
        line for a stop from now on says that the run is not finished."""
        set_phase("finishing the run", "it is not marked finished; the same command finishes it from its checkpoint")
        while self.previous:
            signum, handler = self.previous.popitem()
            signal.signal(signum, handler)
        if self.timer is not None:
            self.timer.cancel()

    @contextlib.contextmanager
    def evaluating(self, when):
        """A held-out evaluation (`when`: before, during or after) that a SIGTERM or Ctrl-C ends at once, rather than
        after it has scored every problem: yields a list that holds the signal once one came (or had come before).
        Before training nothing is saved, so there the signal unwinds the script (`run` says what it left)."""
        cut = [self.received] if self.received is not None else []
        previous = {signum: signal.signal(signum, _interrupt) for signum in self.signals} if not cut else {}
        try:
            with phase(f"scoring EVAL_{when.upper()}"):
                yield cut  # the caller scores only while it is empty
                raise_pending()
        except Interrupted as err:
            if when == "before":
                raise
            _pending.clear()
            cut.append(err.signum)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if cut:
            self.received = self.received or cut[0]
            self.received_at = self.received_at or time.monotonic()
            self.signal_name, self.during = signal.Signals(self.received).name, f"EVAL_{when.upper()}"

    @property
    def exit_code(self):
        return 128 + (self.received or signal.SIGTERM)

    def message(self):
        where = f"checkpoint saved to {self.saved}" if self.saved else "no checkpoint was saved"
        if self.during == "EVAL_AFTER":
            where = "the adapter is saved, the run not marked finished; rerun the same command to score it and finish"
            return f"stopped by {self.signal_name} while scoring EVAL_AFTER at step {self.stopped_at}; {where}"
        during = f" while scoring {self.during}" if self.during else ""
        return f"stopped by {self.signal_name}{during} at step {self.stopped_at}; {where}; rerun the same command to resume"


# ---------------------------------------------------------------------------------------------------------------
# full disks, stalls and NaN sampling


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
