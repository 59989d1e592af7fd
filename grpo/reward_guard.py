"""Reward functions loaded from REWARD_FUNCS, each called in a `Guard` (in training and preflight alike): a raise
keeps its traceback with a note naming the entry and step, a bad value is one ConfigError, a hung call ends the run."""

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

from grpo.errors import ConfigError
from grpo.process import Watchdog

log = logging.getLogger("grpotrainer.rewards")
# TRL 1.16 keeps rewards in float32 (largest 3.4e38) and squares their spread: thousands of 1e15 stay finite there
REWARD_LIMIT = 1e15
UNWIND_GRACE = 10  # seconds the run has to end after an async reward's timeout before the watchdog ends it

# The names TRL and open-r1 give rewards, read as this project's equivalent, with a line saying so when they differ.
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
    """A `Guard` for each entry in `names` (a `registry` name, one of OTHER_NAMES, "module:function" or TRL's
    "module.function"), `timeout` seconds per call (0 = no limit). A module or class raising keeps its traceback."""
    guards = []
    for name in names:
        entry, note = OTHER_NAMES.get(name, (name, None))
        if note:
            log.info("REWARD_FUNCS entry %r: %s", name, note)
        func = registry[entry] if entry in registry else _import(entry)
        try:
            func = bind(func, max_completion_length=max_completion_length, enable_thinking=enable_thinking)
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
    """Why `func` cannot take TRL's reward call, or None: it must take **kwargs (the keywords vary with the data)."""
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
        stem = module.rpartition("/")[2].removesuffix(".py") if module.endswith(".py") else "mymod"
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
    """A reward whose errors keep their traceback with a note naming its entry and step, whose values are checked
    before TRL makes them a tensor, and whose calls each get their own copy of the batch; keeps its `__name__`."""

    def __init__(self, func, entry, timeout=0):
        self.func, self.entry, self.timeout = func, entry, timeout  # timeout: seconds per call, 0 = no limit
        self.source = _source(func)  # the reward's file, whose line a timeout names
        self.__name__ = getattr(func, "__name__", entry.rpartition(":")[2])

    def __call__(self, *args, **kwargs):
        with self.guarding(kwargs) as (where, batch):
            values = self.func(*args, **batch)
        return check_values(values, kwargs.get("completions"), self.entry, where)

    @contextlib.contextmanager
    def guarding(self, kwargs, grace=0):
        """The `deadline` (`grace` seconds late) and the note around one call; yields "at training step N" and the
        call's own copy of the batch (its lists): TRL passes every reward the same lists, so one that edited them
        would change what the next grades. TRL's environments are shared, as it means them."""
        where = f"at training step {getattr(kwargs.get('trainer_state'), 'global_step', '?')}"
        try:
            message = timeout_message(self.timeout, self.entry, where)
            with deadline(self.timeout and self.timeout + grace, message, source=self.source):
                lists = {k: copy.deepcopy(v) for k, v in kwargs.items() if isinstance(v, list) and k != "environments"}
                yield where, {**kwargs, **lists}
        except (Exception, SystemExit) as err:
            # sys.exit would end the run without a word: an error, from it; any other keeps its traceback and chain
            error = RuntimeError(f"the reward called sys.exit({err.code!r})") if isinstance(err, SystemExit) else err
            error.add_note(f"raised by the reward REWARD_FUNCS entry {self.entry!r} {where}")
            if error is err:
                raise
            raise error from err


class AsyncGuard(Guard):
    """An async reward's `Guard`, awaited by TRL on its loop: the timeout cancels the reward, raising RewardTimeout
    with its line in the context; the watchdog ends the run a little later if the reward blocks the loop itself."""

    async def __call__(self, *args, **kwargs):
        with self.guarding(kwargs, grace=min(self.timeout, UNWIND_GRACE)) as (where, batch):
            try:
                async with asyncio.timeout(self.timeout or None) as bound:
                    values = await self.func(*args, **batch)
            except TimeoutError as err:
                if not bound.expired():
                    raise  # the reward's own timeout (a request's): its error, with the note
                raise RewardTimeout(timeout_message(self.timeout, self.entry, where)) from err  # err: the await line
        return check_values(values, kwargs.get("completions"), self.entry, where)


def _source(func):
    """The file defining a reward (a partial's or an instance's function), for the timeout's "stuck at" line."""
    func = getattr(func, "func", func)  # functools.partial
    try:
        return inspect.getsourcefile(func if inspect.isroutine(func) else type(func))
    except TypeError:  # a builtin
        return None


def check_values(values, completions, entry, where):
    """`values` when it is a list (a tuple, a 1-D numpy array) of one number within +-REWARD_LIMIT or None per
    completion, else a ConfigError: booleans too, which would count as 0/1 where float(x == y) was meant."""
    said = f"the reward REWARD_FUNCS entry {entry!r} {where}"
    fix = "A reward function returns one float (or None for no reward) per completion, in a list."
    import numpy  # a 1-D numpy array is a reward, a tensor or a generator is not

    if not (isinstance(values, list | tuple) or isinstance(values, numpy.ndarray) and values.ndim == 1):
        got = "None" if values is None else f"a {type(values).__name__}"
        raise ConfigError(f"{said} returned {got}, not a list of numbers.\n{fix}")
    if isinstance(completions, list | tuple) and len(values) != len(completions):
        raise ConfigError(f"{said} returned {len(values)} values for {len(completions)} completions.\n{fix}")
    for i, value in enumerate(values):
        if value is None:
            continue
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        try:  # numpy's scalars are Real; an int too large for a float (10**400) makes math.isfinite raise
            finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            raise ConfigError(f"{said} returned {shown} for completion {i}: not a finite number.\n{fix}")
        if abs(value) > REWARD_LIMIT:
            raise ConfigError(
                f"{said} returned {shown} for completion {i}: beyond +-{REWARD_LIMIT:g}, which TRL's float32 sums "
                f"and squares of rewards cannot hold (1e308 is inf there).\n{fix}"
            )
    return values


class RewardTimeout(BaseException):
    """An async reward cancelled at its timeout: a BaseException, so that no `except Exception` swallows it."""


def timeout_message(seconds, entry, where):
    return (
        f"REWARD_FUNCS entry {entry!r} did not return within REWARD_TIMEOUT={seconds:g} s ({where}), so the run "
        "stops; the newest checkpoint is kept and the same command resumes from it.\n"
        "Fix the reward (the traceback shows the line it was on), or raise REWARD_TIMEOUT (0 = no limit)."
    )


@contextlib.contextmanager
def deadline(seconds, message, source=None):
    """End the process once the block has run `seconds` (0 = no limit; time stopped by Ctrl-Z not counted): every
    thread's stack, then `message` with the line of `source` (the reward's file) the call was on, exit 1. Its clocks
    are its own, which a reward cannot cancel as it cancels signal.alarm (math-verify sets and clears it on every
    parse); os._exit, as a hung thread would keep an unwinding Python alive (so a RewardTimeout leaves it armed)."""
    if not seconds:
        yield
        return
    caller = threading.get_ident()
    expire = _expire  # the function now: a watchdog left armed must not find another one later
    # a thread, for a reward waiting anywhere: on a worker thread, a judge's future, in C code letting go of the GIL
    watchdog = Watchdog(seconds, lambda: expire(message, sys._current_frames().get(caller), source))
    # SIGPROF after `seconds` of CPU time, for C code keeping the GIL (a regex backtracking), where the thread never
    # runs: handled where that code checks for signals, it ends the run once the wall clock has passed `seconds` too
    main = threading.current_thread() is threading.main_thread()  # where signal handlers run
    start = time.monotonic()

    def check(signum, frame):
        left = seconds - (time.monotonic() - start)
        if left > 0:
            signal.setitimer(signal.ITIMER_PROF, left)
        else:  # expire ends the process; were it to return, a negative timer would raise inside the reward
            expire(message, frame, source)

    if main:
        previous = signal.signal(signal.SIGPROF, check)
        signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    except BaseException as err:
        if not isinstance(err, RewardTimeout):
            watchdog.cancel()
        raise
    finally:
        if main:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)
    watchdog.cancel()


def _expire(message, frame=None, source=None):
    """The end, naming the innermost line of `source` in `frame`, on fd 2: a stuck thread may hold stderr's lock."""
    os.write(2, b"\nREWARD_TIMEOUT: the stack of every thread, most recent call first:\n")
    faulthandler.dump_traceback(file=2, all_threads=True)
    while frame is not None and frame.f_code.co_filename != source:
        frame = frame.f_back
    where = f"It was at {source}:{frame.f_lineno}, in {frame.f_code.co_name}. " if frame else ""
    os.write(2, f"\nerror: {message.replace('Fix the reward', where + 'Fix the reward', 1)}\n".encode())
    os._exit(1)
