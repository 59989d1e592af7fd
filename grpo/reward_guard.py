"""Loading and guarding reward functions: REWARD_FUNCS entries in, the callables given to TRL's GRPOTrainer out.

Each reward runs inside a `Guard`, in training and in preflight alike: a raise keeps its traceback with a note naming
the entry and step, a bad value is one ConfigError (`check_values`), a call that hangs ends the run (`deadline`).
"""

import asyncio
import contextlib
import copy
import faulthandler
import functools
import importlib
import inspect
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
from pathlib import Path

from grpo.errors import ConfigError
from grpo.process import Watchdog

log = logging.getLogger("grpotrainer.rewards")


# The names other tools give rewards, read as an entry here: TRL's own (trl grpo's reward_funcs) and open-r1's
# registry (its recipes' reward_funcs), each as this project's equivalent, with a line saying so when they differ.
OPEN_R1_FORMAT = "open-r1's format wants <think>...</think><answer>...</answer>; format_reward wants '#### N' last"
OTHER_NAMES = {
    "accuracy_reward": ("trl.rewards:accuracy_reward", None),
    "reasoning_accuracy_reward": ("trl.rewards:reasoning_accuracy_reward", None),
    "think_format_reward": ("trl.rewards:think_format_reward", None),
    "get_soft_overlong_punishment": ("overlong_reward", "TRL's soft overlong punishment is overlong_reward here"),
    "soft_overlong_punishment": ("overlong_reward", "open-r1's soft overlong punishment is overlong_reward here"),
    "accuracy": ("correctness_reward", "open-r1's accuracy is correctness_reward here (answers read by value)"),
    "format": ("format_reward", OPEN_R1_FORMAT),
    "reasoning_steps": ("reasoning_reward", "open-r1's reasoning_steps is reasoning_reward here (arithmetic shown)"),
}
# open-r1's rewards for other tasks: refused naming the nearest one here (preflight)
UNSUPPORTED = dict.fromkeys(("code", "code_format", "binary_code", "ioi_code", "cf_code"), "GSM8K has no code task")
UNSUPPORTED |= dict.fromkeys(("cosine", "length", "repetition_penalty", "tag_count"), "overlong_reward or math_reward")


def load(names, registry, *, max_completion_length, enable_thinking=False, timeout=0):
    """A `Guard` for each REWARD_FUNCS entry in `names` (a `registry` name, one of OTHER_NAMES, "module:function"
    or TRL's "module.function"), `timeout` seconds per plain call (REWARD_TIMEOUT; 0 = no limit). An unknown module
    or name is a ConfigError; a module or class that raises while loading keeps its traceback, with a note naming
    the entry."""
    settings = {"max_completion_length": max_completion_length, "enable_thinking": enable_thinking}
    guards = []
    for name in names:
        entry, note = OTHER_NAMES.get(name, (name, None))
        if note:
            log.info("REWARD_FUNCS entry %r: %s", name, note)
        func = registry[entry] if entry in registry else _import(entry)
        try:
            func = bind(func, **settings)
        except Exception as err:
            err.add_note(f"while building the reward class of REWARD_FUNCS entry {name!r}")
            raise
        if not callable(func):
            raise ConfigError(f"REWARD_FUNCS entry {name!r} is a {type(func).__name__}, not a function.")
        if problem := _not_a_reward(func):  # os:system and the like: never called with a batch of completions
            raise ConfigError(f"REWARD_FUNCS entry {name!r} is not a reward function: {problem}.")
        is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
        guards.append((AsyncGuard if is_async else Guard)(func, name, timeout))
    return guards


def bind(func, **settings):
    """`func` with the `settings` it names as parameters: a class is built with them; a function becomes a partial
    that keeps its name (TRL logs rewards/<name>/mean) and pickles, as open-r1 binds its rewards."""
    if not (isinstance(func, type) or inspect.isfunction(func)):
        return func  # an instance, a builtin: called as it is
    accepted = {key: value for key, value in settings.items() if key in inspect.signature(func).parameters}
    if isinstance(func, type):
        return func(**accepted)
    return functools.update_wrapper(functools.partial(func, **accepted), func) if accepted else func


def _not_a_reward(func):
    """Why `func` cannot take TRL's reward call (prompts=, completions=, completion_ids=, the dataset's columns and
    trainer_state= as keywords, which vary with the dataset), or None: it must take **kwargs."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return "its signature cannot be read; write def myreward(completions, **kwargs) returning a list of floats"
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return (
        f"it takes ({', '.join(p.name for p in params)}) without **kwargs, but TRL calls it with prompts=, "
        "completions=, completion_ids=, trainer_state= and the dataset's columns; write "
        "def myreward(completions, **kwargs)"
    )


def _import(name):
    """The object a "module:function" or "module.function" entry names (preflight has refused unknown plain names)."""
    module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not all(part.isidentifier() for part in module.split(".")):  # a file path, "./x.py": not importable by name
        stem = Path(module).stem if module.endswith(".py") else "mymod"
        raise ConfigError(
            f"REWARD_FUNCS entry {name!r}: {module!r} is not a module name. Name the module as Python imports it, "
            f"without a path or .py (e.g. {stem}:{attr or 'myreward'}), and put its file beside grpotrainer.py or "
            "in a folder on PYTHONPATH."
        )
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if not err.name or not (module == err.name or module.startswith(err.name + ".")):
            raise  # the reward's module imports something missing: its traceback says what and where
        raise ConfigError(
            f"REWARD_FUNCS entry {name!r}: there is no module {module!r} on the Python path.\n"
            f"Put {module.replace('.', '/')}.py in the repository root (beside grpotrainer.py) or in a folder on "
            "PYTHONPATH, and name it as module:function."
        ) from None
    except Exception as err:
        err.add_note(f"while importing the module of REWARD_FUNCS entry {name!r}")
        raise
    if not attr or not hasattr(found, attr):
        where = getattr(found, "__file__", module)
        raise ConfigError(f"REWARD_FUNCS entry {name!r}: {where} has no {attr!r}; give module:function.")
    return getattr(found, attr)


class Guard:
    """A reward whose failures name its REWARD_FUNCS entry and the step; keeps its `__name__` (TRL's metric name).

    A raise is a bug to be seen where it is: the error goes on, traceback and all, with a note. A bad value is
    refused by `check_values` before TRL makes it a tensor or a NaN loss. Each call gets its own copy of the batch
    (`own_copy`): TRL hands every reward the same lists, so one that edits them would change what the next grades."""

    def __init__(self, func, entry, timeout=0):
        self.func = func
        self.entry = entry
        self.timeout = timeout  # REWARD_TIMEOUT: seconds one call may take, 0 = no limit
        self.__name__ = getattr(func, "__name__", entry.rpartition(":")[2])

    def __call__(self, *args, **kwargs):
        count = _count(kwargs)  # before the call: a reward may empty its own copy of the list
        args, kwargs = own_copy(args), own_copy(kwargs)
        with self.guarding(kwargs) as where:
            values = self.func(*args, **kwargs)
        return check_values(values, count, self.entry, where)

    @contextlib.contextmanager
    def guarding(self, kwargs, grace=0):
        """The deadline (`grace` seconds past REWARD_TIMEOUT) and the note around one call; yields where the call
        is, "at training step N"."""
        where = f"at training step {getattr(kwargs.get('trainer_state'), 'global_step', '?')}"
        try:
            message = timeout_message(self.timeout, self.entry, where)
            with deadline(self.timeout and self.timeout + grace, message, source=_source(self.func)):
                yield where
        except (Exception, SystemExit) as err:
            note = f"raised by the reward REWARD_FUNCS entry {self.entry!r} {where}"
            if isinstance(err, SystemExit):  # which would end the run without a word: an error, from it
                error = RuntimeError(f"the reward called sys.exit({err.code!r})")
                error.add_note(note)
                raise error from err
            err.add_note(note)  # the reward's own error goes on, its traceback and chain untouched
            raise


class AsyncGuard(Guard):
    """The `Guard` of an async reward: a coroutine function itself, so that TRL awaits it on its event loop (TRL 1.16
    tells by `async def __call__`). REWARD_TIMEOUT cancels the awaited reward there (asyncio.timeout), raising
    RewardTimeout through TRL's await, the reward's line in its context; the watchdog of `deadline` ends the run
    a little later if the reward blocks the event loop itself and cannot be cancelled."""

    async def __call__(self, *args, **kwargs):
        count = _count(kwargs)
        args, kwargs = own_copy(args), own_copy(kwargs)
        with self.guarding(kwargs, grace=min(self.timeout, UNWIND_GRACE)) as where:
            try:
                async with asyncio.timeout(self.timeout or None) as bound:
                    values = await self.func(*args, **kwargs)
            except TimeoutError as err:
                if not bound.expired():
                    raise  # the reward's own timeout (a request's): its error, with the note
                raise RewardTimeout(timeout_message(self.timeout, self.entry, where)) from err  # err: the await line
        return check_values(values, count, self.entry, where)


def _count(kwargs):
    completions = kwargs.get("completions")
    return len(completions) if isinstance(completions, list | tuple) else None


def _source(func):
    """The file defining a reward (a partial's or an instance's function), for the timeout's "stuck at" line."""
    func = getattr(func, "func", func)  # functools.partial
    try:
        return inspect.getsourcefile(func if inspect.isroutine(func) else type(func))
    except TypeError:  # a builtin
        return None


def own_copy(values):
    """`values` (a call's arguments) with each list deep-copied: the batch's prompts, completions, completion_ids
    and columns. The trainer's state, its logging hooks and TRL's environments are shared, as TRL means them."""
    if isinstance(values, dict):
        return {k: copy.deepcopy(v) if isinstance(v, list) and k != "environments" else v for k, v in values.items()}
    return tuple(copy.deepcopy(v) if isinstance(v, list) else v for v in values)


# The largest reward magnitude: TRL 1.16 keeps rewards in float32 (largest 3.4e38) and squares their spread for the
# group's standard deviation, so a group of thousands of rewards of 1e15 still stays finite there.
REWARD_LIMIT = 1e15


def check_values(values, count, entry, where):
    """`values` when it is a reward function's proper answer: a list (a tuple, a 1-D numpy array) with one finite
    number within +-REWARD_LIMIT, or None (TRL's "no reward for this one"), per completion. Anything else is a
    ConfigError naming `entry` and `where`: booleans too, which would silently count as 0/1 where `x == y` was meant
    to be float(x == y)."""
    said = f"the reward REWARD_FUNCS entry {entry!r} {where}"
    fix = "A reward function returns one float (or None for no reward) per completion, in a list."
    if not isinstance(values, list | tuple):
        import numpy  # only for what is not a list: a numpy array is a reward, a tensor or a generator is not

        if not (isinstance(values, numpy.ndarray) and values.ndim == 1):
            got = "None" if values is None else f"a {type(values).__name__}"
            raise ConfigError(f"{said} returned {got}, not a list of numbers.\n{fix}")
    if count is not None and len(values) != count:
        raise ConfigError(f"{said} returned {len(values)} values for {count} completions.\n{fix}")
    for i, value in enumerate(values):
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's scalars are Real
        if value is None:
            continue
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        if not (number and _finite(value)):
            raise ConfigError(f"{said} returned {shown} for completion {i}: not a finite number.\n{fix}")
        if abs(value) > REWARD_LIMIT:
            raise ConfigError(
                f"{said} returned {shown} for completion {i}: beyond +-{REWARD_LIMIT:g}, which TRL's float32 sums "
                f"and squares of rewards cannot hold (1e308 is inf there).\n{fix}"
            )
    return values


def _finite(value):
    """math.isfinite, and False for an int too large for a float (10**400), where math.isfinite raises."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class RewardTimeout(BaseException):
    """An async reward cancelled at REWARD_TIMEOUT. A BaseException, like KeyboardInterrupt, so that a reward's own
    `except Exception` cannot swallow it and carry on: it ends the run, the awaited line in its context."""


UNWIND_GRACE = 10  # seconds the run has to end after an async reward's timeout before the watchdog ends it


def timeout_message(seconds, entry, where):
    return (
        f"REWARD_FUNCS entry {entry!r} did not return within REWARD_TIMEOUT={seconds:g} s ({where}), so the run "
        "stops; the newest checkpoint is kept and the same command resumes from it.\n"
        "Fix the reward (the traceback shows the line it was on), or raise REWARD_TIMEOUT (0 = no limit)."
    )


@contextlib.contextmanager
def deadline(seconds, message, source=None):
    """End the process once the block has run `seconds` (0 = no limit): every thread's stack, then `message`
    (`timeout_message`: the REWARD_FUNCS entry, the step, REWARD_TIMEOUT) with the line of the reward's file
    `source` the call was on, then exit 1. Time the process spent stopped (Ctrl-Z) does not count.

    A watchdog thread with its own clock, which a reward cannot cancel, as it cancels a SIGALRM timer (math-verify
    sets and clears signal.alarm on every parse), and which fires wherever the reward waits: in a worker thread, on
    a judge's future, in C code that lets go of the GIL; in the main thread, `_cpu_clock` for C code that keeps it.
    It ends the process at once (os._exit) rather than raising: a hung worker thread would keep an unwinding Python
    from ever exiting. Nothing is written while rewards run, so the newest checkpoint is whole, and the same command
    resumes from it. A RewardTimeout leaving the block (an async reward, cancelled) leaves the watchdog armed, for
    an unwinding that would wait on the reward's threads."""
    if not seconds:
        yield
        return
    caller = threading.get_ident()
    expire = _expire  # the function now: a watchdog left armed must not find another one later
    watchdog = Watchdog(seconds, lambda: expire(message, sys._current_frames().get(caller), source))
    main = threading.current_thread() is threading.main_thread()  # where signal handlers run
    try:
        with _cpu_clock(seconds, message, source) if main else contextlib.nullcontext():
            yield
    except RewardTimeout:
        raise
    except BaseException:
        watchdog.cancel()
        raise
    watchdog.cancel()


@contextlib.contextmanager
def _cpu_clock(seconds, message, source=None):
    """The second clock, for a reward spinning in C code that holds the GIL (a regular expression backtracking),
    where the watchdog thread never gets to run: SIGPROF after `seconds` of the process's CPU time, a timer of its
    own that signal.alarm leaves alone. Its handler runs where that code checks for signals (the regex engine does)
    and ends the run once the wall clock has passed `seconds` too, or sets the timer again for what is left."""
    start = time.monotonic()

    def check(signum, frame):
        left = seconds - (time.monotonic() - start)
        if left <= 0:
            _expire(message, frame, source)
        signal.setitimer(signal.ITIMER_PROF, left)

    previous = signal.signal(signal.SIGPROF, check)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _expire(message, frame=None, source=None):
    """The watchdog's end, with where in the reward's file `source` the stuck call's `frame` was: written straight
    to file descriptor 2, since the stuck thread may hold sys.stderr's lock."""
    os.write(2, b"\nREWARD_TIMEOUT: the stack of every thread, most recent call first:\n")
    faulthandler.dump_traceback(file=2, all_threads=True)
    inner = []  # the frames of the reward's own file, innermost first
    while frame is not None:
        inner += [frame] if source and frame.f_code.co_filename == source else []
        frame = frame.f_back
    where = f"It was at {source}:{inner[0].f_lineno}, in {inner[0].f_code.co_name}. " if inner else ""
    os.write(2, f"\nerror: {message.replace('Fix the reward', where + 'Fix the reward', 1)}\n".encode())
    os._exit(1)
