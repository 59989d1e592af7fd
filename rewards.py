"""The GRPO reward functions that grpotrainer.py selects by name from `REWARDS`: read these to write your own.

TRL's GRPOTrainer calls a reward once per batch as `f(prompts=..., completions=..., completion_ids=..., answer=...,
trainer_state=..., log_extra=..., ...)`; it returns one float per completion, or None (which TRL skips) where a
reward that needs the gold has no readable one. Completions are chat lists for GSM8K (`completion_to_text` reads
either form); the gold comes as `answer` or, as TRL's and open-r1's rewards read it, `solution`. How answers are
read is grpo/grading.py's job. A parameter named max_completion_length or enable_thinking gets the run's value.

    correctness_reward   1.0 when the final answer equals the gold by value (the reward GRPO should optimise)
    format_reward        1.0 for a last line `#### N`, 0.5 for a decorated or misplaced one
    reasoning_reward     1.0 for shown working with results, 0.5 for arithmetic without them
    math_reward          the tutorial's combined partial credit, summing to 1.0 for a right, shown answer
    overlong_reward      DAPO's soft overlong punishment, from the token counts

A completion earns credit only where it stops at its answer. One cut off at max_completion_length, or one that pads
past it (grading.pads_answer: the answer repeated, filler, another question; not an explanation or a sign-off),
scores 0.0 on the first four, though evaluation still judges its answer: a model must not learn to pad to the limit.
They log the share of padded completions as completions/padded_ratio.

Your own reward goes in a module on the Python path (the repository root, or a folder on PYTHONPATH), selected as
`--REWARD_FUNCS=correctness_reward,mymodule:my_reward`. Run the examples and the tests:
    python -m pytest tests/test_rewards.py rewards.py -q
"""

from collections.abc import Callable

from grpo.grading import (
    answer_region,
    answers_match,
    completion_to_text,
    ends_with_hash_line,
    extract_hash_answer,
    gold_value,
    read_answer,
    working_score,
)


def _golds(answer, n: int) -> list[str | None]:
    """The gold answers, one per completion, normalised; a missing or unreadable gold is None."""
    if not isinstance(answer, list | tuple):  # one gold for every completion, or None
        answer = [answer] * n
    answer = [answer[i] if i < len(answer) else None for i in range(n)]
    texts = dict.fromkeys(gold for gold in answer if isinstance(gold, str))  # a GRPO batch repeats each gold
    cache = {gold: gold_value(gold) for gold in texts}
    return [cache[gold] if isinstance(gold, str) else gold_value(gold) for gold in answer]


def _truncated(completion_ids, max_completion_length: int | None, n: int) -> list[bool]:
    """Which completions were cut off: as many token ids as max_completion_length (TRL passes them unpadded, up to
    and including the EOS token). A reward is not told the EOS ids, so one whose EOS is its last allowed token
    counts as cut off too: it used the whole budget. Without the ids or the limit, none is."""
    if max_completion_length is None or not isinstance(completion_ids, list | tuple) or len(completion_ids) != n:
        return [False] * n
    return [hasattr(ids, "__len__") and len(ids) >= max_completion_length for ids in completion_ids]


def _read(texts, completion_ids, max_completion_length, enable_thinking, log_metric) -> tuple[list, list[bool]]:
    """Each completion's reading (grading.read_answer: its answer, whether it pads past it, the values that count as
    it), and whether it stopped at its answer: not cut off, not padded. The padded share goes to TRL's `log_metric`
    hook, so TensorBoard shows it as train/completions/padded_ratio."""
    cut = _truncated(completion_ids, max_completion_length, len(texts))
    read = [read_answer(t, truncated=c, thinking=enable_thinking) for t, c in zip(texts, cut, strict=True)]
    if callable(log_metric) and read:
        log_metric("completions/padded_ratio", sum(r[1] for r in read) / len(read))
    return read, [not (r[1] or c) for r, c in zip(read, cut, strict=True)]


def correctness_reward(
    completions,
    answer=None,
    *,
    solution=None,
    completion_ids=None,
    log_extra=None,
    log_metric=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float | None]:
    """1.0 when the completion's final answer equals the gold answer by value, else 0.0; None without a gold.

    No final answer, no credit: thinking that never closed scores 0.0, and so does a completion cut off at
    max_completion_length or one that repeats or pads its answer (`#### 18\\n#### 18`; see grpo/grading.py).

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer (`list[str]`, *optional*): the gold answers, a number ("1080") or a GSM8K solution ("... #### 1,080").
        solution (`list[str]`, *optional*): the gold under the name TRL's and open-r1's rewards read, if no `answer`.
        completion_ids (`list[list[int]]`, *optional*): the token ids TRL passes; as many as max_completion_length
            (GRPOConfig's limit) tell a cut-off completion.
        log_extra (`Callable[[str, list], None]`, *optional*): TRL's hook for extra columns of the completions
            table; the reward logs `extracted` (its reading of each completion) and `gold`.
        log_metric (`Callable[[str, float], None]`, *optional*): TRL's hook for a scalar; gets the padded share.
        enable_thinking (`bool`): thinking mode is on, so an answer needs a closed `</think>` first.
        **kwargs: the other arguments TRL passes (prompts, trainer_state, ...); unused, there so any call works.

    Returns:
        `list[float | None]`: one reward per completion; None where the gold is missing or unreadable (TRL skips it).

    >>> correctness_reward(["9 * 2 = 18\\n#### 18", "The answer is $18.00.", "#### 17"], answer=["18", "18", "18"])
    [1.0, 1.0, 0.0]
    >>> ids = [[1, 2], [1, 2, 3, 4]]  # token ids: the second used all 4 allowed, so it was cut off
    >>> texts = ["#### 18\\n#### 18", "#### 18"]  # the first repeats its answer
    >>> correctness_reward(texts, answer=["18"] * 2, completion_ids=ids, max_completion_length=4)
    [0.0, 0.0]
    >>> correctness_reward([[{"role": "assistant", "content": "#### 1080"}]], solution=["... #### 1,080"])
    [1.0]
    >>> correctness_reward(["<think>So it is 18.", "#### 18"], answer=["18", None], enable_thinking=True)
    [0.0, None]
    """
    texts = [completion_to_text(c) for c in completions or []]
    golds = _golds(solution if answer is None else answer, len(texts))
    read, stopped = _read(texts, completion_ids, max_completion_length, enable_thinking, log_metric)
    if callable(log_extra):
        log_extra("extracted", [r[0] for r in read])
        log_extra("gold", golds)
    return [
        None if gold is None else float(ok and answers_match(r[2], gold))
        for r, gold, ok in zip(read, golds, stopped, strict=True)
    ]


def format_reward(
    completions,
    answer=None,
    *,
    completion_ids=None,
    log_metric=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float]:
    """How well the completion follows the asked format: a last line `#### N`, and nothing after it.

    1.0: the last non-blank line is `#### N`, N a plain number (sign, thousands commas and decimals allowed).
    0.5: a `#### N` answer is there but decorated or followed by a short sign-off (`#### $18`, `#### 18 pens`,
    `#### 18\\nDone!`).
    0.0: no `#### N` (a `\\boxed{}` or "The answer is" answer gets nothing here; correctness_reward credits it),
    thinking that never closed (a `#### N` inside it is no final answer), a completion cut off at
    max_completion_length, or one that repeats or pads its answer (`#### 18\\n#### 18`: grading.pads_answer).

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (the format does not depend on them).
        completion_ids, log_metric, max_completion_length, enable_thinking: as for correctness_reward.
        **kwargs: the other arguments TRL passes (prompts, trainer_state, ...); unused.

    >>> format_reward(["2 + 2 = 4\\n#### 4", "#### 4 apples", "#### 4\\nDone!", "The answer is 4.", "#### 4\\n#### 4"])
    [1.0, 0.5, 0.5, 0.0, 0.0]
    """
    texts = [completion_to_text(c) for c in completions or []]
    stopped = _read(texts, completion_ids, max_completion_length, enable_thinking, log_metric)[1]
    # A `#### N` inside unclosed thinking, or cut off by a next question, is none: extract_hash_answer gives None.
    rewards = []
    for text, ok in zip(texts, stopped, strict=True):
        hashed = ok and extract_hash_answer(text, thinking=enable_thinking) is not None
        rewards.append((1.0 if ends_with_hash_line(text) else 0.5) if hashed else 0.0)
    return rewards


def reasoning_reward(
    completions,
    answer=None,
    *,
    completion_ids=None,
    log_metric=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float]:
    """Whether the completion shows its working: arithmetic on numbers, and equations with their results.

    1.0: an equation with a result, `36 / 3 = 12`, `(3 + 4) x 2 = 14`, `12 \\times 2 = 24`, `<<36/3=12>>`.
    0.5: arithmetic without a stated result, `36 / 3`.
    0.0: neither (a bare answer), or a completion cut off or padded past its answer, as for correctness_reward
    (sums appended after the answer earn nothing). The check reads the whole completion, thinking included.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (shown working does not depend on them).
        completion_ids, log_metric, max_completion_length, enable_thinking: as for correctness_reward.
        **kwargs: the other arguments TRL passes (prompts, trainer_state, ...); unused.

    >>> reasoning_reward(["He sells 20 - 5 - 3 = 12 pens.", "A third of them, 36 / 3, are blue.", "#### 12"])
    [1.0, 0.5, 0.0]
    """
    texts = [completion_to_text(c) for c in completions or []]
    stopped = _read(texts, completion_ids, max_completion_length, enable_thinking, log_metric)[1]
    return [working_score(text) if ok else 0.0 for text, ok in zip(texts, stopped, strict=True)]


def math_reward(
    completions,
    answer=None,
    *,
    solution=None,
    completion_ids=None,
    log_metric=None,
    max_completion_length: int | None = None,
    enable_thinking: bool = False,
    **kwargs,
) -> list[float | None]:
    """The GSM8K tutorial's combined reward, made whole: partial credit that sums to 1.0 for a right, shown answer.

    0.2 for a `#### N` answer, + 0.2 for shown arithmetic (reasoning_reward > 0), + 0.2 for a readable answer
    (`extract_answer` is not None), + 0.4 when that answer is right. None where the gold is missing (TRL skips it).
    Thinking that never closed, a cut-off completion and one padded past its answer score 0.0 (no final answer, so
    no part of the credit), as for correctness_reward.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer, solution (`list[str]`, *optional*): the gold answers, as for correctness_reward.
        completion_ids, log_metric, max_completion_length, enable_thinking: as for correctness_reward.
        **kwargs: the other arguments TRL passes; unused.

    >>> math_reward(["36 / 3 = 12\\n#### 12", "36 / 3 = 12\\n#### 13", "The answer is 12.", "12"], answer=["12"] * 4)
    [1.0, 0.6, 0.6, 0.6]
    """
    texts = [completion_to_text(c) for c in completions or []]
    golds = _golds(solution if answer is None else answer, len(texts))
    read, stopped = _read(texts, completion_ids, max_completion_length, enable_thinking, log_metric)
    rewards = []
    for text, gold, (pred, _, accepted), ok in zip(texts, golds, read, stopped, strict=True):
        if gold is None or not ok or answer_region(text, enable_thinking) is None:
            rewards.append(None if gold is None else 0.0)
            continue
        tenths = (
            2 * (extract_hash_answer(text, thinking=enable_thinking) is not None)
            + 2 * (working_score(text) > 0)
            + 2 * (pred is not None)
            + 4 * answers_match(accepted, gold)
        )
        rewards.append(tenths / 10)
    return rewards


def overlong_reward(completions=None, completion_ids=None, *, max_completion_length: int, **kwargs) -> list[float]:
    """DAPO's soft overlong punishment, TRL's own `get_soft_overlong_punishment` (imported when first called, so
    that `import rewards` stays light): 0 up to L - C tokens, then down linearly to -1 at L, with
    L = max_completion_length and C = L // 4. Without `completion_ids` (their lengths) every completion scores 0.0.

    >>> overlong_reward(["a", "b", "c"], completion_ids=[[1] * 50, [1] * 90, [1] * 100], max_completion_length=100)
    [0.0, -0.6, -1.0]
    """
    if completion_ids is None:
        return [0.0] * len(completions or [])
    from trl.rewards import get_soft_overlong_punishment

    punish = get_soft_overlong_punishment(max_completion_length, max_completion_length // 4)
    return [float(r) for r in punish(list(completion_ids))]


# Name -> reward, for REWARD_FUNCS; TRL logs each as rewards/<name>/mean.
REWARDS: dict[str, Callable] = {
    "correctness_reward": correctness_reward,
    "format_reward": format_reward,
    "reasoning_reward": reasoning_reward,
    "math_reward": math_reward,
    "overlong_reward": overlong_reward,
}

# The rewards above that score the form (format, working, length), not the value: preflight does not warn when
# they score a right and a wrong answer alike.
ANSWER_BLIND = ("format_reward", "reasoning_reward", "overlong_reward")
