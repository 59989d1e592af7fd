"""Process safety for the scripts: clean exits saying what a stop leaves (`run`), one run per folder (`output_lock`),
SIGTERM and Ctrl-C in training (`GracefulStop`), and known faults told by their type and where raised (`faults`)."""

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
import traceback
import types
from pathlib import Path

from grpo.errors import ConfigError, first_line
from grpo.files import redact_argv
from grpo.settings import named

log = logging.getLogger("grpotrainer")
LOCK_NAME = "run.lock"  # in the output folder while a run holds it: filelock's flock, which even kill -9 releases
HOLDER_NAME = "run.lock.json"  # beside it: the holding run's pid, host and start, for the refusal
TORCH_DISTRIBUTED = ("/torch/distributed/", "/torch/nn/parallel/")  # where a collective raises, in torch
AUTOGRAD_ENGINE = "/torch/autograd/graph.py"  # where backward's errors, DDP's all-reduce's included, come out
COPY_WINDOW = 2.0  # seconds in which another signal is a copy, not a request: torchrun and Slurm signal workers too
FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk, a full quota
# the setting of each held-out evaluation, for messages
EVALUATIONS = {w: named(f"held_out.{f}") for w, f in (("before", "before"), ("during", "every"), ("after", "after"))}


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C outside training: a BaseException, so that no `except Exception` swallows it on its way."""

    def __init__(self, signum):
        # its one line, for the phase as it is when the signal comes (unwinding puts back the phases before it)
        super().__init__(signum, f"stopped by {signal.Signals(signum).name} while {_phase[0]}: {_phase[1]}")
        self.signum, self.message = self.args


NOTHING_WRITTEN = "nothing was written; the same command starts again"
_phase = ["starting", NOTHING_WRITTEN]  # what the script does now and what a stop there leaves, for `run`'s line


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


# The Interrupted a signal raised, until it is handled. Raised inside a finalizer (a __del__ the garbage collector
# runs, as regex's during tokenizer loading), Python prints it as "Exception ignored" and goes on: the stop is lost,
# and the run trained to its end. `raise_pending` raises it again where a stop can be taken.
_pending = []


def _interrupt(signum, frame):
    _pending[:] = [Interrupted(signum)]
    raise _pending[0]


def raise_pending():
    """Raise again the Interrupted of a signal that a finalizer swallowed, if one did."""
    if _pending:
        raise _pending.pop()


@contextlib.contextmanager
def interruptible():
    """SIGTERM and Ctrl-C unwind the block through `run`, whatever handlers were there before; put back after it."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _thread_error(args):
    """A thread's full disk (TensorBoard's writer's) is left to the main thread, which says it at its next write."""
    if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in FULL):
        threading.__excepthook__(args)


def run(main):
    """Call `main(argv)`: a ConfigError ends as one paragraph and exit 2; SIGTERM and Ctrl-C as one line saying
    where it stopped (`phase`), exit 128 + the signal; a closed stdout quietly, as SIGPIPE would."""
    set_phase("starting", NOTHING_WRITTEN)
    argv, sys.argv[1:] = sys.argv[1:], redact_argv(sys.argv[1:])  # W&B records sys.argv: no credential there
    _pending.clear()
    hook, threading.excepthook = threading.excepthook, _thread_error
    with interruptible():  # a caller's own handlers (pytest's) come back once main is done
        try:
            return main(argv)
        except ConfigError as err:
            print(f"\nerror: {err}\n", file=sys.stderr, flush=True)
            sys.exit(2)
        except OSError as err:
            try:
                os.getcwd()
            except FileNotFoundError:  # a relative path resolved against a folder that is gone: no fault of the code
                print("\nerror: the working folder was deleted as this ran; cd to one that exists.", file=sys.stderr)
                sys.exit(2)
            if not isinstance(err, BrokenPipeError) or not _stdout_broken():  # another pipe's: a bug, kept as it is
                raise
            # stdout's reader is gone (`--help | head -1`): end as SIGPIPE would, stdout on /dev/null for exit's flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(128 + signal.SIGPIPE)
        except (Interrupted, KeyboardInterrupt) as caught:
            err = caught if isinstance(caught, Interrupted) else Interrupted(signal.SIGINT)
            _pending.clear()
            for other in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut this line into a traceback
                signal.signal(other, signal.SIG_IGN)
            print(f"\n{err.message}", file=sys.stderr, flush=True)
            sys.exit(128 + err.signum)
        finally:
            threading.excepthook = hook


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
    if not log.handlers:
        log.addHandler(logging.StreamHandler())
    log.handlers[0].stream = sys.stderr  # today's (setStream would flush a closed one: a test's capture)
    log.handlers[0].setFormatter(logging.Formatter(f"[{prefix}] %(message)s"))
    log.setLevel(logging.INFO if rank0 else logging.WARNING)
    log.propagate = False


def require(packages, script):
    """Refuse to start, with the command that fixes it, when this Python lacks a package the script needs."""
    if missing := [p for p in packages if importlib.util.find_spec(p) is None]:
        raise ConfigError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}.\n"
            f"Run `make install` once, then `.venv/bin/python {script} ...` (or `make smoke`, `make train`)."
        )


def any_rank(flag, device=None):
    """True when `flag` is true on any process (an all-reduce); every process must call it at the same point."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return bool(flag)
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
    """Lock `output_dir`: (the held FileLock, None), or (None, why it is refused). A killed run's lock is taken
    over; the holder's pid, host and time go to run.lock.json, since filelock owns the lock file."""
    from filelock import FileLock, Timeout

    output_dir = Path(output_dir)
    lock = FileLock(output_dir / LOCK_NAME, timeout=0, thread_local=False)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        holder = read_holder(output_dir / HOLDER_NAME)
        pid, host = holder.get("pid", "?"), holder.get("host", "an unknown host")
        since = holder.get("since")
        since = f"since {since}" if since else f"which has not named itself in {HOLDER_NAME} yet"
        return None, (
            f"OUTPUT_DIR {output_dir} is in use by another run (pid {pid} on {host}, {since}); "
            "two runs in one folder overwrite each other.\nWait for it to end, stop it, or give this run another "
            "OUTPUT_DIR."
        )
    except OSError as err:
        return None, f"cannot lock OUTPUT_DIR {output_dir} ({err}): it must be a folder this user can write."
    previous = read_holder(output_dir / HOLDER_NAME)
    if previous.get("pid"):
        host = previous.get("host", "an unknown host")
        log.info("took over %s from pid %s on %s, which no longer holds it", LOCK_NAME, previous["pid"], host)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M")}
    (output_dir / HOLDER_NAME).write_text(json.dumps(holder))
    return lock, None


@contextlib.contextmanager
def output_lock(output_dir, rank0):
    """Hold `output_dir` for one run while the block runs, else a ConfigError. Rank 0 takes the lock and every rank
    learns the outcome (`any_rank`: after the process group exists), so a refused run writes nothing."""
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


class Watchdog(threading.Thread):
    """A daemon thread calling `fire(*args)` once `seconds` of running time have passed, unless cancelled first.
    Time stopped (Ctrl-Z, a scheduler's suspend) stops every thread, so a tick far longer than asked counts as one."""

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
    """On SIGTERM or SIGINT, finish the step on every rank (they agree at its end), save a checkpoint and stop.
    A step outlasting `grace` seconds after the signal, or a second signal while it runs, ends the process at once
    without saving it (the newest whole checkpoint resumes); copies of the signal (COPY_WINDOW) and signals during
    the save are ignored. `exit_code` is 128 + the signal: a restart loop must see that the run is not done."""

    signals = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, resuming=None, grace=0):
        # until training begins, a signal unwinds through run, whose line says what the same command does then
        again = "no step was trained; the same command starts again"
        set_phase("loading the model", f"the same command resumes from {resuming}" if resuming else again)
        self.grace = grace  # seconds the step may take after the signal; 0 = no limit
        self.received = self.received_at = None  # the first signal's number and its time.monotonic()
        self.signal_name = self.stopped_at = None  # its name and the step trained, once the processes agreed to stop
        self.saved = None  # the checkpoint folder saved for the stop
        self.newest = resuming  # the newest whole checkpoint: what a rerun resumes from
        self.step = None  # the steps finished when the current one began
        self.previous = {}  # signal number -> the handler to restore
        self.timer = None  # ends the process when the step outlasts `grace`
        self.deciding = threading.RLock()  # the step end and the timer: one of them decides, save or end
        self.between = True  # from a step's end to the next one's begin: the Trainer logs, evaluates, saves
        self.during = None  # the setting of the evaluation a signal cut short (EVALUATIONS)

    def handle(self, signum, frame):
        """Record the first signal, start the grace timer; a later one ends a running step or is ignored (says why)."""
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
        if self.grace:
            self.timer = Watchdog(self.grace, self.end_step, f"not ended within STOP_GRACE={self.grace:g} s")

    def end_step(self, why):
        """End the process, the step unsaved, unless the processes agreed to save or the Trainer is between steps (the
        next step gets the grace anew); on fd 2, by os._exit: the main thread may hold stderr's lock, or be joining."""
        with self.deciding:
            if self.signal_name is not None:
                return
            if self.between:
                return self.arm()
            again = f"from {self.newest}" if self.newest else "from the start"
            name = signal.Signals(self.received).name
            line = f"stopped by {name} in step {self.step + 1}: {why}, so it is not saved; rerun the same command"
            os.write(2, f"\n{line} to resume {again}\n".encode())
            os._exit(self.exit_code)

    def restore(self):
        """Put back the handlers from before training (run's, saying now that the run is unfinished); repeatable."""
        set_phase("finishing the run", "it is not marked finished; the same command finishes it from its checkpoint")
        while self.previous:
            signum, handler = self.previous.popitem()
            signal.signal(signum, handler)
        if self.timer is not None:
            self.timer.cancel()

    @contextlib.contextmanager
    def evaluating(self, when, device=None):
        """A held-out evaluation (`when`: before, during or after) that a signal ends at its next `scoring.check()`,
        on every rank at once; `scoring.cut` then holds the signal. Before training, the signal unwinds the script."""

        def check():
            if any_rank(self.received is not None, device):
                raise Interrupted(self.received or signal.SIGTERM)  # SIGTERM: another rank's

        scoring = types.SimpleNamespace(cut=[], check=check)
        try:
            with phase(f"scoring {EVALUATIONS[when]}"):
                yield scoring
        except Interrupted as err:
            if when == "before":
                raise
            scoring.cut.append(err.signum)
            self.received = self.received or err.signum  # its received_at is never read: signal_name is set
            self.signal_name, self.during = signal.Signals(self.received).name, EVALUATIONS[when]

    @property
    def exit_code(self):
        return 128 + (self.received or signal.SIGTERM)

    def message(self):
        during = f" while scoring {self.during}" if self.during else ""
        then = f"checkpoint saved to {self.saved}" if self.saved else "no checkpoint was saved"
        then += "; rerun the same command to resume"
        if self.during == EVALUATIONS["after"]:
            then = "the adapter is saved, the run not marked finished; rerun the same command to score it and finish"
        return f"stopped by {self.signal_name}{during} at step {self.stopped_at}; {then}"


def chain(err):
    """`err` and the exceptions it was raised from or during, outermost first."""
    seen = []
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def frames(err):
    """The (file, function, frame) of each Python frame `err` passed through, outermost first."""
    walk = traceback.walk_tb(err.__traceback__)
    return [(frame.f_code.co_filename.replace(os.sep, "/"), frame.f_code.co_name, frame) for frame, _ in walk]


def writer_failed(e):
    """A checkpoint writer's error without errno: safetensors' while serialising a file, torch.save's C++ writer's."""
    from safetensors import SafetensorError

    where = frames(e)
    if isinstance(e, SafetensorError):
        return any(name in ("save_file", "serialize_file") for _, name, _ in where)
    return type(e) is RuntimeError and any(f.endswith("torch/serialization.py") and n == "save" for f, n, _ in where)


def disk_full_error(err, output_dir, then="rerun the same command to resume"):
    """A ConfigError naming the full disk when `err` (or its cause) is ENOSPC/EDQUOT, or a checkpoint writer's
    error without errno under 64 MiB free; `then`: what to do once there is space."""
    path = Path(output_dir).resolve()
    while not path.exists() and path != path.parent:  # the free space where it would be
        path = path.parent
    free = None
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(path).free
    for e in chain(err):
        full = isinstance(e, OSError) and e.errno in FULL
        if full or (writer_failed(e) and free is not None and free < 64 * 2**20):
            free_text = f", {free / 2**20:.0f} MiB free now" if free is not None else ""
            return ConfigError(
                f"No space left on device while writing to OUTPUT_DIR {output_dir} ({first_line(e)}{free_text}).\n"
                f"Free space there (or set OUTPUT_DIR to a larger disk), then {then}."
            )
    return None


def stall_error(err, ddp_timeout):
    """A ConfigError when `err` is torch's DistError, or a plain RuntimeError raised inside torch.distributed or,
    with several ranks, by the autograd engine (DDP's all-reduce runs in backward); else None, whatever its text."""
    import torch.distributed as dist

    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    for e in chain(err):
        file = frames(e)[-1][0] if e.__traceback__ else ""  # where it was raised
        in_torch_distributed = type(e) is RuntimeError and any(d in file for d in TORCH_DISTRIBUTED)
        in_backward = type(e) is RuntimeError and several and file.endswith(AUTOGRAD_ENGINE)
        if isinstance(e, dist.DistError) or in_torch_distributed or in_backward:
            return ConfigError(
                f"a process waited for the others and gave up (DDP_TIMEOUT={ddp_timeout} s; {first_line(e)}).\n"
                "Check every rank's log for the first error (a stalled or dead rank), then NCCL and the network "
                "(NCCL_DEBUG=INFO); raise DDP_TIMEOUT only if a rank legitimately works alone that long."
            )
    return None


@contextlib.contextmanager
def faults(output_dir, ddp_timeout=None, then="rerun the same command to resume"):
    """A full disk, and in training (`ddp_timeout` given) a distributed stall or NaN probabilities, raised in the
    block as one ConfigError (exit 2); any other error goes on."""
    try:
        yield
    except Exception as err:
        known = disk_full_error(err, output_dir, then)
        if ddp_timeout is not None:
            known = known or stall_error(err, ddp_timeout) or nonfinite_error(err)
        if known is None:
            raise
        raise known from None


def nonfinite_error(err):
    """A ConfigError when sampling met NaN or inf probabilities: a RuntimeError from transformers' generation whose
    innermost frame holds a `probs` tensor torch.multinomial refuses."""
    import torch

    for e in chain(err):
        file, _, frame = frames(e)[-1] if e.__traceback__ else ("", "", None)  # where it was raised
        probs = frame.f_locals.get("probs") if type(e) is RuntimeError and "transformers/generation/" in file else None
        if isinstance(probs, torch.Tensor) and not (probs.isfinite().all() and (probs >= 0).all()):
            return ConfigError(
                f"the model's next-token probabilities are NaN or inf ({first_line(e)}).\n"
                "Before the first step, MODEL_NAME's weights hold NaN or inf: re-download or re-convert them. "
                "After steps, the run diverged: lower LEARNING_RATE and rerun to resume from the newest checkpoint."
            )
    return None
