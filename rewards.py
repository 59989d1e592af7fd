"""The GRPO reward functions that grpotrainer.py selects by name from `REWARDS`: read these to write your own.

TRL calls each with keyword arguments (completions, completion_ids, dataset columns such as `answer`, ...) and takes
one float per completion, or None, which it skips; a parameter named max_completion_length or enable_thinking gets
the run's value (docs/rewards.md). The rewards that pay give 0.0 to a completion cut off at max_completion_length or
padded past its answer (the answer repeated, filler, another question): a model must not learn to pad to the limit.
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
    """The gold answers, one per completion, normalised; None where missing or unreadable."""
    if not isinstance(answer, list | tuple):  # one gold for every completion, or None
        answer = [answer] * n
    answer = [answer[i] if i < len(answer) else None for i in range(n)]
    cache = {gold: gold_value(gold) for gold in {g for g in answer if isinstance(g, str)}}  # a batch repeats each
    return [cache[gold] if isinstance(gold, str) else gold_value(gold) for gold in answer]


def _truncated(completion_ids, max_completion_length: int | None, n: int) -> list[bool]:
    """Which completions were cut off: as many token ids (unpadded, EOS included) as max_completion_length. A reward
    is not told the EOS ids, so an EOS as the last allowed token counts as cut off too: it used the whole budget."""
    if max_completion_length is None or not isinstance(completion_ids, list | tuple) or len(completion_ids) != n:
        return [False] * n
    return [hasattr(ids, "__len__") and len(ids) >= max_completion_length for ids in completion_ids]


def _read(completions, completion_ids, max_completion_length, enable_thinking, log_metric) -> tuple[list, list, list]:
    """Texts, their read_answer, whether each stopped (not cut off nor padded); the padded share to `log_metric`."""
    texts = [completion_to_text(c) for c in completions or []]
    cut = _truncated(completion_ids, max_completion_length, len(texts))
    read = [read_answer(t, truncated=c, thinking=enable_thinking) for t, c in zip(texts, cut, strict=True)]
    if callable(log_metric) and read:
        log_metric("completions/padded_ratio", sum(r[1] for r in read) / len(read))
    return texts, read, [not (r[1] or c) for r, c in zip(read, cut, strict=True)]


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

    No final answer, no credit: unclosed thinking, a cut-off completion and a padded one score 0.0.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer (`list[str]`, *optional*): the gold answers, a number ("1080") or a GSM8K solution ("... #### 1,080").
        solution (`list[str]`, *optional*): the gold under the name TRL's and open-r1's rewards read, if no `answer`.
        completion_ids (`list[list[int]]`, *optional*): the token ids; as many as max_completion_length: cut off.
        log_extra, log_metric (*optional*): TRL's logging hooks: the `extracted` and `gold` columns, the padded share.
        enable_thinking (`bool`): thinking mode is on, so an answer needs a closed `</think>` first.
        **kwargs: the other arguments TRL passes (prompts, trainer_state, ...); unused, there so any call works.

    Returns:
        `list[float | None]`: one reward per completion; None where the gold is missing or unreadable (TRL skips it).

    >>> correctness_reward(["9 * 2 = 18\\n#### 18", "The answer is $18.00.", "#### 17"], answer=["18", "18", "18"])
    [1.0, 1.0, 0.0]
    >>> correctness_reward([[{"role": "assistant", "content": "#### 1080"}]], solution=["... #### 1,080"])
    [1.0]
    """
    texts, read, stopped = _read(completions, completion_ids, max_completion_length, enable_thinking, log_metric)
    golds = _golds(solution if answer is None else answer, len(texts))
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

    1.0: the last non-blank line is `#### N`, N a plain number. 0.5: a `#### N` decorated or followed by a sign-off
    (`#### 18 pens`, `#### 18\\nDone!`). 0.0: no `#### N` (a `\\boxed{}` answer gets nothing here), or unclosed
    thinking, cut off or padded as for correctness_reward, whose arguments it takes (`answer` unused).

    >>> format_reward(["2 + 2 = 4\\n#### 4", "#### 4 apples", "#### 4\\nDone!", "The answer is 4.", "#### 4\\n#### 4"])
    [1.0, 0.5, 0.5, 0.0, 0.0]
    """
    texts, _, stopped = _read(completions, completion_ids, max_completion_length, enable_thinking, log_metric)
    rewards = []
    for text, ok in zip(texts, stopped, strict=True):
        # extract_hash_answer finds no `#### N` inside unclosed thinking or after a next question
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
    """Whether the completion shows its working, thinking included: arithmetic, and equations with their results.

    1.0: an equation with a result (`36 / 3 = 12`, `<<36/3=12>>`). 0.5: arithmetic alone (`36 / 3`). 0.0: neither,
    or cut off or padded as for correctness_reward, whose arguments it takes (`answer` unused).

    >>> reasoning_reward(["He sells 20 - 5 - 3 = 12 pens.", "A third of them, 36 / 3, are blue.", "#### 12"])
    [1.0, 0.5, 0.0]
    """
    texts, _, stopped = _read(completions, completion_ids, max_completion_length, enable_thinking, log_metric)
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

    0.2 for a `#### N` answer, + 0.2 for shown arithmetic, + 0.2 for a readable answer, + 0.4 when it is right.
    None without a gold; 0.0 for unclosed thinking, cut off or padded; arguments as for correctness_reward.

    >>> math_reward(["36 / 3 = 12\\n#### 12", "36 / 3 = 12\\n#### 13", "The answer is 12.", "12"], answer=["12"] * 4)
    [1.0, 0.6, 0.6, 0.6]
    """
    texts, read, stopped = _read(completions, completion_ids, max_completion_length, enable_thinking, log_metric)
    golds = _golds(solution if answer is None else answer, len(texts))
    rewards = []
    for text, gold, (pred, _, accepted), ok in zip(texts, golds, read, stopped, strict=True):
        scored = gold is not None and ok and answer_region(text, enable_thinking) is not None
        tenths = scored and (
            2 * (extract_hash_answer(text, thinking=enable_thinking) is not None)
            + 2 * (working_score(text) > 0)
            + 2 * (pred is not None)
            + 4 * answers_match(accepted, gold)
        )
        rewards.append(None if gold is None else tenths / 10)
    return rewards


def overlong_reward(completions=None, completion_ids=None, *, max_completion_length: int, **kwargs) -> list[float]:
    """DAPO's soft overlong punishment (TRL's `get_soft_overlong_punishment`, imported when called): 0 up to L - C
    tokens, then down linearly to -1 at L = max_completion_length, C = L // 4; 0.0 for all without `completion_ids`.

    >>> overlong_reward(["a", "b", "c"], completion_ids=[[1] * 50, [1] * 90, [1] * 100], max_completion_length=100)
    [0.0, -0.6, -1.0]
    """
    if completion_ids is None:
        return [0.0] * len(completions or [])
    from trl.rewards import get_soft_overlong_punishment

    punish = get_soft_overlong_punishment(max_completion_length, max_completion_length // 4)
    return [float(r) for r in punish(list(completion_ids))]


# Name -> reward, as the run's reward list names them; TRL logs each as rewards/<name>/mean.
REWARDS: dict[str, Callable] = {
    "correctness_reward": correctness_reward,
    "format_reward": format_reward,
    "reasoning_reward": reasoning_reward,
    "math_reward": math_reward,
    "overlong_reward": overlong_reward,
}

# Rewards that score the form, not the value: preflight does not warn when they score right and wrong alike.
ANSWER_BLIND = ("format_reward", "reasoning_reward", "overlong_reward")
