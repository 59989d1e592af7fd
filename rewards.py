"""The GRPO reward functions that grpotrainer.py selects by name from `REWARDS`: read these to write your own.

A reward is called by TRL's GRPOTrainer once per batch as `f(prompts=..., completions=..., completion_ids=...,
answer=..., solution=..., trainer_state=..., log_extra=..., log_metric=...)` and returns one float (or None, which
TRL skips) per completion. Completions are chat messages, `[{"role": "assistant", "content": "..."}]`, for
GSM8K's conversational prompts; `grading.completion_to_text` turns either form into text.

    correctness_reward   1.0 when the final answer equals the gold by value (the reward GRPO should optimise)
    format_reward        1.0 for a last line `#### N`, 0.5 for a decorated or misplaced one
    reasoning_reward     1.0 for shown working with results, 0.5 for arithmetic without them
    math_reward          the tutorial's combined partial credit, summing to 1.0 for a right, shown answer
    overlong_reward      DAPO's soft overlong punishment, from the token counts

How answers are read (where the answer is, number forms, "no final answer, no credit" for unclosed thinking and
cut-off completions) is the answer reader's job: grpo/grading.py, whose docstring gives the rules. Your own reward
goes in a module of your own, on the Python path (the repository root, or a folder on PYTHONPATH), selected as
`--REWARD_FUNCS=correctness_reward,mymodule:my_reward`.

TRL's conventions: the gold comes as `answer` or, as TRL's and open-r1's rewards read it, `solution`; a reward that
needs the gold returns None for a row without a readable one (TRL skips it), not 0.0. In the registry, the rewards
that apply the rule are small classes that grpotrainer.py builds with max_completion_length and enable_thinking.

Run the examples in the docstrings and the tests:
    python -m pytest tests/test_rewards.py rewards.py -q
"""

import math
import numbers
from collections.abc import Callable
from pathlib import Path

from grpo.errors import ConfigError
from grpo.files import deadline, exit_as_error
from grpo.grading import (
    answer_region,
    answers_match,
    completion_to_text,
    ends_with_hash_line,
    extract_answer,
    extract_hash_answer,
    gold_value,
    working_score,
)

# ----------------------------------------------------------------------------------------------------------------
# Reward functions: TRL calls them as f(prompts=..., completions=..., completion_ids=..., answer=..., ...)


def _golds(answer, n: int) -> list[str | None]:
    """The gold answers, one per completion, normalised; a missing or unreadable gold is None."""
    if not isinstance(answer, list | tuple):  # one gold for every completion, or None
        answer = [answer] * n
    cache = {}  # a GRPO batch repeats each gold once per generation
    golds = []
    for i in range(n):
        gold = answer[i] if i < len(answer) else None
        if isinstance(gold, str):
            golds.append(cache[gold] if gold in cache else cache.setdefault(gold, gold_value(gold)))
        else:
            golds.append(gold_value(gold))
    return golds


def _truncated(completion_ids, max_completion_length: int | None, n: int) -> list[bool]:
    """Which completions were cut off: as many token ids as max_completion_length (TRL passes them unpadded, up to
    and including the EOS token). Without the ids or the limit, none is."""
    if max_completion_length is None or not isinstance(completion_ids, list | tuple) or len(completion_ids) != n:
        return [False] * n
    return [hasattr(ids, "__len__") and len(ids) >= max_completion_length for ids in completion_ids]


def correctness_reward(
    completions,
    answer=None,
    *,
    solution=None,
    completion_ids=None,
    log_extra=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float | None]:
    """1.0 when the completion's final answer equals the gold answer by value, else 0.0; None without a gold.

    No final answer, no credit: thinking that never closed scores 0.0, and a completion cut off at
    max_completion_length earns nothing from the last-number fallback (see the module docstring).

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer (`list[str]`, *optional*): the gold answers, a number ("1080") or a GSM8K solution ("... #### 1,080").
            TRL passes the dataset's `answer` column here.
        solution (`list[str]`, *optional*): the gold answers under the name TRL's and open-r1's rewards read; used
            when `answer` is not given.
        completion_ids (`list[list[int]]`, *optional*): the token ids TRL passes; with max_completion_length they
            tell a cut-off completion.
        log_extra (`Callable[[str, list], None]`, *optional*): TRL's hook for extra columns of the completions
            table; the reward logs `extracted` (its reading of each completion) and `gold`.
        max_completion_length (`int`, *optional*): GRPOConfig's limit, in tokens (set by `CorrectnessReward`).
        enable_thinking (`bool`): thinking mode is on, so an answer needs a closed `</think>` first.
        **kwargs: the other columns and trainer arguments TRL passes (prompts, trainer_state, ...); unused, and there
            so that any call from GRPOTrainer works.

    Returns:
        `list[float | None]`: one reward per completion; None where the gold is missing or unreadable, which TRL
        skips (it becomes NaN and is left out of the group's mean).

    >>> correctness_reward(["9 * 2 = 18\\n#### 18", "The answer is $18.00.", "#### 17"], answer=["18", "18", "18"])
    [1.0, 1.0, 0.0]
    >>> correctness_reward([[{"role": "assistant", "content": "#### 1080"}]], solution=["... #### 1,080"])
    [1.0]
    >>> correctness_reward(["<think>So it is 18.", "#### 18"], answer=["18", None], enable_thinking=True)
    [0.0, None]
    """
    completions = list(completions or [])
    golds = _golds(solution if answer is None else answer, len(completions))
    cut = _truncated(completion_ids, max_completion_length, len(completions))
    extracted = [
        extract_answer(completion_to_text(c), truncated=t, thinking=enable_thinking)
        for c, t in zip(completions, cut, strict=True)
    ]
    if callable(log_extra):
        log_extra("extracted", extracted)
        log_extra("gold", golds)
    return [
        None if gold is None else float(answers_match(pred, gold)) for pred, gold in zip(extracted, golds, strict=True)
    ]


def format_reward(completions, answer=None, *, enable_thinking: bool = False, **kwargs) -> list[float]:
    """How well the completion follows the asked format: a last line `#### N`.

    1.0: the last non-blank line is `#### N`, N a plain number (sign, thousands commas and decimals allowed).
    0.5: a `#### N` answer is there but decorated or not last (`#### $18`, `#### 18 pens`, text after it).
    0.0: no `#### N` (a `\\boxed{}` or "The answer is" answer gets nothing here; correctness_reward credits it),
    or thinking that never closed (a `#### N` inside it is no final answer). A cut-off completion keeps what its
    `#### N` earns: the format does not depend on the fallback.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (the format does not depend on them).
        enable_thinking (`bool`): thinking mode is on, so the answer needs a closed `</think>` first.
        **kwargs: the other arguments TRL passes (prompts, completion_ids, trainer_state, ...); unused.

    >>> format_reward(["2 + 2 = 4\\n#### 4", "#### 4 apples", "#### 4\\nDone!", "The answer is 4.", "<think>#### 4"])
    [1.0, 0.5, 0.5, 0.0, 0.0]
    """
    rewards = []
    for completion in completions or []:
        text = completion_to_text(completion)
        region = answer_region(text, enable_thinking)
        if region is None:
            rewards.append(0.0)
            continue
        if ends_with_hash_line(text):
            rewards.append(1.0)
        else:
            rewards.append(0.5 if extract_hash_answer(text, thinking=enable_thinking) is not None else 0.0)
    return rewards


def reasoning_reward(completions, answer=None, **kwargs) -> list[float]:
    """Whether the completion shows its working: arithmetic on numbers, and equations with their results.

    1.0: an equation with a result, `36 / 3 = 12`, `(3 + 4) x 2 = 14`, `12 \\times 2 = 24`, `<<36/3=12>>`.
    0.5: arithmetic without a stated result, `36 / 3`.
    0.0: neither (a bare answer). The check reads the whole completion, thinking included.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (shown working does not depend on them).
        **kwargs: the other arguments TRL passes (prompts, completion_ids, trainer_state, ...); unused.

    >>> reasoning_reward(["He sells 20 - 5 - 3 = 12 pens.", "A third of them, 36 / 3, are blue.", "#### 12"])
    [1.0, 0.5, 0.0]
    """
    rewards = []
    for completion in completions or []:
        text = completion_to_text(completion)
        rewards.append(working_score(text))
    return rewards


def math_reward(
    completions,
    answer=None,
    *,
    solution=None,
    completion_ids=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float | None]:
    """The GSM8K tutorial's combined reward, made whole: partial credit that sums to 1.0 for a right, shown answer.

    0.2 for a `#### N` answer, + 0.2 for shown arithmetic (reasoning_reward > 0), + 0.2 for a readable answer
    (`extract_answer` is not None), + 0.4 when that answer is right. None where the gold is missing (TRL skips it).
    Thinking that never closed scores 0.0 (no final answer, so no part of the credit); a cut-off completion reads
    its answer without the last-number fallback, as correctness_reward does.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer, solution (`list[str]`, *optional*): the gold answers, as for correctness_reward.
        completion_ids, max_completion_length, enable_thinking: as for correctness_reward.
        **kwargs: the other arguments TRL passes; unused.

    >>> math_reward(["36 / 3 = 12\\n#### 12", "36 / 3 = 12\\n#### 13", "The answer is 12.", "12"], answer=["12"] * 4)
    [1.0, 0.6, 0.6, 0.6]
    """
    completions = list(completions or [])
    golds = _golds(solution if answer is None else answer, len(completions))
    cut = _truncated(completion_ids, max_completion_length, len(completions))
    rewards = []
    for completion, gold, truncated in zip(completions, golds, cut, strict=True):
        text = completion_to_text(completion)
        if gold is None or answer_region(text, enable_thinking) is None:
            rewards.append(None if gold is None else 0.0)
            continue
        pred = extract_answer(text, truncated=truncated, thinking=enable_thinking)
        tenths = (
            2 * (extract_hash_answer(text, thinking=enable_thinking) is not None)
            + 2 * (working_score(text) > 0)
            + 2 * (pred is not None)
            + 4 * answers_match(pred, gold)
        )
        rewards.append(tenths / 10)
    return rewards


class OverlongReward:
    """DAPO's soft overlong punishment: 0 up to `max - soft_cache` tokens, then down linearly to -1 at `max`.

    A thin, picklable wrapper around TRL's `get_soft_overlong_punishment` (imported when first called, so that
    `import rewards` stays light). It reads the token counts from the `completion_ids` TRL passes; called without
    them it returns 0.0 for every completion.

    R(y) = 0 for |y| <= L - C;  (L - C - |y|) / C for L - C < |y| <= L;  -1 for |y| > L,
    with L = max_completion_length and C = soft_cache.

    Args:
        max_completion_length (`int`): GRPOConfig's max_completion_length, in tokens.
        soft_cache (`int`, *optional*): the length of the penalised band; defaults to a quarter of
            max_completion_length.

    >>> reward = OverlongReward(max_completion_length=100)  # soft_cache = 25: the penalty starts after 75 tokens
    >>> reward(completions=["a", "b", "c"], completion_ids=[[1] * 50, [1] * 90, [1] * 100])
    [0.0, -0.6, -1.0]
    >>> reward.__name__
    'overlong_reward'
    """

    __name__ = "overlong_reward"  # TRL logs it as rewards/overlong_reward/mean
    answer_blind = True  # token counts only

    def __init__(self, max_completion_length: int, soft_cache: int | None = None):
        if not _is_int(max_completion_length) or max_completion_length < 1:
            raise ValueError(f"max_completion_length must be a positive int, got {max_completion_length!r}")
        soft_cache = max_completion_length // 4 if soft_cache is None else soft_cache
        if not _is_int(soft_cache) or not 0 <= soft_cache <= max_completion_length:
            raise ValueError(f"soft_cache must be an int in [0, {max_completion_length}], got {soft_cache!r}")
        self.max_completion_length = max_completion_length
        self.soft_cache = soft_cache

    def __call__(self, completions=None, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            return [0.0] * len(completions or [])
        from trl.rewards import get_soft_overlong_punishment

        punish = get_soft_overlong_punishment(self.max_completion_length, self.soft_cache)
        return [float(r) for r in punish(list(completion_ids))]

    def __repr__(self) -> str:
        return f"OverlongReward(max_completion_length={self.max_completion_length}, soft_cache={self.soft_cache})"


def load(names, max_completion_length, enable_thinking=False, timeout=0) -> list[Callable]:
    """Reward callables for REWARD_FUNCS entries: registry names, "module:function" or TRL's "module.function".

    A class (a registry entry or a user's) is built with the run's `max_completion_length` and `enable_thinking`,
    where its __init__ takes them. A module that is not on the Python path, or lacks the name, is a ConfigError
    naming the entry and where the module must live; a module or class that raises while loading is a bug and keeps
    its traceback, with a note naming the entry. Each callable is returned inside `Guarded` (`AsyncGuarded`), so
    that one that raises or returns no rewards during training names its entry and step, and one plain call that
    takes more than `timeout` seconds (REWARD_TIMEOUT; 0 = no limit) ends the run naming its entry.
    """
    import inspect

    funcs = []
    for name in names:
        func = REWARDS[name] if name in REWARDS else _import(name)
        if isinstance(func, type):
            run = {"max_completion_length": max_completion_length, "enable_thinking": enable_thinking}
            accepted = inspect.signature(func).parameters
            try:
                func = func(**{key: value for key, value in run.items() if key in accepted})
            except Exception as err:
                err.add_note(f"while building the reward class of REWARD_FUNCS entry {name!r}")
                raise
        if not callable(func):
            raise ConfigError(f"REWARD_FUNCS entry {name!r} is a {type(func).__name__}, not a function.")
        if problem := _not_a_reward(func):  # os:system and the like: never called with a batch of completions
            raise ConfigError(f"REWARD_FUNCS entry {name!r} is not a reward function: {problem}.")
        async_ = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
        funcs.append(AsyncGuarded(func, name) if async_ else Guarded(func, name, timeout))
    return funcs


def _not_a_reward(func):
    """Why `func` cannot take TRL's reward call (prompts=, completions=, completion_ids=, the dataset's columns and
    trainer_state= as keywords, which vary with the dataset), or None: it must take **kwargs."""
    import inspect

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
    import importlib

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


class Guarded:
    """A reward function whose failures name its REWARD_FUNCS entry and the training step; one plain call that runs
    past `timeout` seconds (REWARD_TIMEOUT) is stopped with `files.RewardTimeout`, which ends the run.

    One that raises is a bug to be seen where it is: the error goes on, traceback and all, in the reward's own file
    and line, with a note naming the entry and step. One that returns what is not a reward (`check_values`: not a
    list of one number or None per completion, or NaN/inf) is refused as one ConfigError naming both, before TRL
    turns it into a tensor or a NaN loss. Keeps the function's `__name__`, which TRL turns into the metric name
    rewards/<name>/mean. Picklable.
    """

    def __init__(self, func, entry, timeout=0):
        self.func = func
        self.entry = entry
        self.timeout = timeout  # REWARD_TIMEOUT: seconds one call may take, 0 = no limit
        self.__name__ = getattr(func, "__name__", entry.rpartition(":")[2])

    def __call__(self, *args, **kwargs):
        step = getattr(kwargs.get("trainer_state"), "global_step", "?")
        try:
            with deadline(self.timeout, self.entry, f"at training step {step}"):
                values = self.func(*args, **kwargs)
        except (Exception, SystemExit) as err:
            note = self.note(kwargs)
            if isinstance(err, SystemExit):
                raise exit_as_error(err, note) from err
            err.add_note(note)  # the reward's own error goes on, its traceback and chain untouched
            raise
        return check_values(values, kwargs.get("completions"), self.entry, self.step(kwargs))

    @staticmethod
    def step(kwargs):
        return getattr(kwargs.get("trainer_state"), "global_step", "?")

    def note(self, kwargs):
        return f"raised by the reward REWARD_FUNCS entry {self.entry!r} at training step {self.step(kwargs)}"

    def __repr__(self):
        return f"{type(self).__name__}({self.func!r})"


class AsyncGuarded(Guarded):
    """`Guarded` for an async reward function: TRL awaits it on its event loop, beside the other async ones."""

    async def __call__(self, *args, **kwargs):
        try:
            values = await self.func(*args, **kwargs)
        except (Exception, SystemExit) as err:
            note = self.note(kwargs)
            if isinstance(err, SystemExit):
                raise exit_as_error(err, note) from err
            err.add_note(note)
            raise
        return check_values(values, kwargs.get("completions"), self.entry, self.step(kwargs))


def check_values(values, completions, entry, step):
    """`values` when it is a reward function's proper answer: a list (tuple, array) with one finite number, or None
    (TRL's "no reward for this one"), per completion. Anything else is a ConfigError naming `entry` and `step`:
    booleans too, which would silently count as 0/1 where `x == y` was meant to be float(x == y).

    >>> check_values([1.0, None, 0], ["a", "b", "c"], "m:f", 3)
    [1.0, None, 0]
    """
    where = f"the reward REWARD_FUNCS entry {entry!r} at training step {step}"
    fix = "A reward function returns one float (or None for no reward) per completion, in a list."
    if isinstance(values, (str, bytes, dict, set)) or not hasattr(values, "__len__"):
        raise ConfigError(f"{where} returned a {type(values).__name__}, not a list of numbers.\n{fix}")
    if completions is not None and len(values) != len(completions):
        raise ConfigError(f"{where} returned {len(values)} values for {len(completions)} completions.\n{fix}")
    for i, value in enumerate(values):
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's scalars are Real
        if value is not None and not (number and math.isfinite(value)):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ConfigError(f"{where} returned {shown} for completion {i}: not a finite number.\n{fix}")
    return values


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Configured:
    """A reward function with the run's settings bound: picklable, and named as TRL should log it.

    grpotrainer.py builds each class entry of `REWARDS` with the keyword arguments its __init__ accepts among
    max_completion_length and enable_thinking; calling the instance calls the function with them.
    """

    __name__ = ""  # the registry name, set by each subclass; TRL logs rewards/<name>/mean
    _reward: Callable

    def __init__(self, max_completion_length: int | None = None, enable_thinking: bool = False):
        if max_completion_length is not None and (not _is_int(max_completion_length) or max_completion_length < 1):
            raise ValueError(f"max_completion_length must be a positive int or None, got {max_completion_length!r}")
        self.max_completion_length = max_completion_length
        self.enable_thinking = bool(enable_thinking)

    def __call__(self, completions=None, answer=None, **kwargs) -> list[float | None]:
        kwargs.pop("max_completion_length", None)  # the bound settings win over a column of the same name
        kwargs.pop("enable_thinking", None)
        settings = {"max_completion_length": self.max_completion_length, "enable_thinking": self.enable_thinking}
        return type(self)._reward(completions, answer, **settings, **kwargs)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_completion_length={self.max_completion_length}, "
            f"enable_thinking={self.enable_thinking})"
        )


class CorrectnessReward(_Configured):
    """correctness_reward with the run's max_completion_length and enable_thinking bound.

    >>> reward = CorrectnessReward(max_completion_length=4, enable_thinking=False)
    >>> reward(["3 * 6 = 18", "3 * 6 = 18"], answer=["18", "18"], completion_ids=[[1] * 4, [1] * 3])
    [0.0, 1.0]
    >>> reward.__name__
    'correctness_reward'
    """

    __name__ = "correctness_reward"
    _reward = staticmethod(correctness_reward)


class FormatReward(_Configured):
    """format_reward with enable_thinking bound (a `#### N` inside unclosed thinking earns nothing)."""

    __name__ = "format_reward"
    _reward = staticmethod(format_reward)
    answer_blind = True  # the format, not the value: preflight does not expect it to tell answers apart


class MathReward(_Configured):
    """math_reward with the run's max_completion_length and enable_thinking bound."""

    __name__ = "math_reward"
    _reward = staticmethod(math_reward)


reasoning_reward.answer_blind = True  # shown working, not the value
format_reward.answer_blind = True

# Name -> reward. grpotrainer.py builds the classes with the keyword arguments their __init__ accepts among
# max_completion_length and enable_thinking (its MAX_COMPLETION_LENGTH and ENABLE_THINKING).
REWARDS: dict[str, Callable] = {
    "correctness_reward": CorrectnessReward,
    "format_reward": FormatReward,
    "reasoning_reward": reasoning_reward,
    "math_reward": MathReward,
    "overlong_reward": OverlongReward,
}
