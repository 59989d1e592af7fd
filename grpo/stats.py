"""How sure an evaluation is: intervals, the paired test, pass@k, and lm-eval-harness-compatible GSM8K figures.

Pure Python (math only), so every tool can import it:

    wilson(successes, n)            95 % Wilson score interval of an accuracy
    mcnemar_exact(up, down)         two-sided exact McNemar (sign test) p-value on the flips between two evaluations
    paired(before, after)           flips, p-value and accuracy change of two evaluations of the same problems
    pass_at_k(n, c, k)              unbiased pass@k of one problem (Chen et al. 2021), and its mean over problems
    lm_eval_strict / _flexible      lm-evaluation-harness's gsm8k "strict-match" and "flexible-extract" verdicts
    format_interval, describe_pair  the text for the run's last line, the eval JSON's readers and the model card

lm-eval compatibility. The two verdicts reproduce lm-evaluation-harness's `gsm8k` task (lm_eval/tasks/gsm8k/gsm8k.yaml,
version 3.0) on the text before its stop sequences ("Question:", "</s>", "<|im_end|>"): "strict-match" takes the
FIRST `#### (-?[0-9.,]+)`, "flexible-extract" the LAST match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`; a completion with no
match reads "[invalid]". Prediction and gold (the whole GSM8K solution or its bare number) are then normalised as its
`exact_match` metric does (delete `,`, `$`, everything up to the last `#### `, one trailing `.`, lower-case) and
compared as strings, so "18.00" is not "18" and "#### $5" is no answer, where this project's grader (grpo/grading.py)
reads the last `#### N`, `\\boxed{}` and answer phrases and compares by value. What still differs is the prompt:
lm-eval asks 5-shot, as plain text "Question: ...\\nAnswer:" with no chat template and no system prompt; this
project's figures come from its own chat-template prompt with a system prompt, zero-shot. The same completions are
graded both ways, so the lm-eval figures isolate the grader's part of a gap to a model card's score, not the prompt's.
"""

import math
import re

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


def wilson(successes, n, z=Z_95):
    """The Wilson score interval for a binomial proportion: (low, high), 95 % by default.

    Unlike the normal (Wald) interval it stays inside [0, 1] and is not zero-width at 0 or n successes:
        centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²),  p = successes / n.

    Args:
        successes: the number right, 0 <= successes <= n.
        n: the number of problems; n = 0 gives the uninformative (0.0, 1.0).
        z: the normal quantile of the confidence level.

    >>> [round(b, 4) for b in wilson(5, 10)]
    [0.2366, 0.7634]
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if not 0 <= successes <= n:
        raise ValueError(f"wilson: successes must be in 0..n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # At 0 or n successes the bound is exactly 0 or 1; rounding could leave it a hair outside.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(up, down):
    """Two-sided exact McNemar test on the discordant pairs of two evaluations of the same problems.

    Under "no change" each flip is up or down with probability 1/2, so the flips follow binomial(up + down, 1/2)
    (the sign test): p = min(1, 2 * P[X <= min(up, down)]). Computed with exact integers.

    Args:
        up: problems wrong before and right after.
        down: problems right before and wrong after.

    Returns:
        The p-value; 1.0 when nothing flipped.

    >>> mcnemar_exact(5, 0)
    0.0625
    >>> mcnemar_exact(1, 1)
    1.0
    """
    if up < 0 or down < 0:
        raise ValueError(f"mcnemar_exact: flip counts must be >= 0, got up={up}, down={down}")
    flips = up + down
    if flips == 0:
        return 1.0
    tail = sum(math.comb(flips, i) for i in range(min(up, down) + 1))
    return min(1.0, 2 * tail / 2**flips)


def flips(caller, before, after):
    """(n, up, down) of two evaluations' per-problem scores (verdicts or counts of right samples): up where after's
    is higher, down where lower. Different lengths are a ValueError naming `caller`."""
    if len(before) != len(after):
        raise ValueError(
            f"{caller}: the two evaluations cover {len(before)} and {len(after)} problems; "
            "a paired test needs the same problems in the same order"
        )
    up = sum(1 for b, a in zip(before, after, strict=True) if a > b)
    down = sum(1 for b, a in zip(before, after, strict=True) if a < b)
    return len(before), up, down


def paired(before, after):
    """Compare two evaluations of the same problems, problem by problem.

    Args:
        before: per-problem verdicts (True = right) of the first evaluation.
        after: the second evaluation's, for the same problems in the same order.

    Returns:
        dict with n, up (wrong -> right), down (right -> wrong), both_right, both_wrong, p_value (mcnemar_exact
        on up and down) and difference (after's accuracy minus before's).

    >>> paired([False, False, True, True], [True, True, True, False])["up"]
    2
    """
    n, up, down = flips("paired", before, after)
    both_right = sum(1 for b, a in zip(before, after, strict=True) if b and a)
    return {
        "n": n,
        "up": up,
        "down": down,
        "both_right": both_right,
        "both_wrong": n - up - down - both_right,
        "p_value": mcnemar_exact(up, down),
        "difference": (up - down) / n if n else 0.0,
    }


def paired_samples(before, after, samples):
    """Compare two evaluations' sampled answers on the same problems: the sign test on each problem's count of
    right samples (of `samples` per problem in both). A problem is up when more of its samples are right after,
    down when fewer; the rest tie. With one sample per problem this is `paired` on the samples' verdicts.

    Returns:
        dict with n, samples, up, down, ties, before and after (the sampled accuracies), p_value (mcnemar_exact on
        up and down) and difference (after minus before).

    >>> test = paired_samples([0, 1, 0, 2], [2, 1, 1, 0], 2)
    >>> test["up"], test["down"], test["before"], test["after"], test["p_value"]
    (2, 1, 0.375, 0.5, 1.0)
    """
    n, up, down = flips("paired_samples", before, after)
    acc_before, acc_after = (sum(x) / (n * samples) if n and samples else 0.0 for x in (before, after))
    return {
        "n": n,
        "samples": samples,
        "up": up,
        "down": down,
        "ties": n - up - down,
        "before": acc_before,
        "after": acc_after,
        "p_value": mcnemar_exact(up, down),
        "difference": acc_after - acc_before,
    }


def pass_at_k(n, c, k):
    """Unbiased pass@k of one problem from n samples of which c are right (Chen et al. 2021, HumanEval).

    pass@k = 1 - C(n-c, k) / C(n, k): the chance that k samples drawn without replacement from the n include a right
    one. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the large binomials.

    Args:
        n: samples drawn for the problem.
        c: how many of them were right, 0 <= c <= n.
        k: 1 <= k <= n.

    >>> pass_at_k(4, 1, 2)
    0.5
    >>> pass_at_k(4, 0, 4), pass_at_k(4, 3, 2)
    (0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        # Fewer than k wrong samples: every draw of k holds a right one.
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts, n, k):
    """pass@k of an evaluation: the mean of pass_at_k over problems.

    Args:
        counts: per problem, how many of its n samples were right.
        n: samples per problem.
        k: 1 <= k <= n.

    >>> mean_pass_at_k([0, 1, 4], n=4, k=2)
    0.5
    """
    if not counts:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(pass_at_k(n, c, k) for c in counts) / len(counts)


def pass_at_ks(counts, n):
    """pass@k for every k in 1..n: {k: mean_pass_at_k(counts, n, k)}; pass@1 is the plain sampled accuracy.

    >>> {k: round(v, 4) for k, v in pass_at_ks([0, 1, 4], n=4).items()}
    {1: 0.4167, 2: 0.5, 3: 0.5833, 4: 0.6667}
    """
    return {k: mean_pass_at_k(counts, n, k) for k in range(1, n + 1)}


# lm-evaluation-harness gsm8k.yaml: the two filters, the fallback for no match, and exact_match's regexes_to_ignore.
_LM_EVAL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_LM_EVAL_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_LM_EVAL_FALLBACK = "[invalid]"
_LM_EVAL_UNTIL = ("Question:", "</s>", "<|im_end|>")  # generation_kwargs' until: lm-eval never sees what follows
_LM_EVAL_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def _lm_eval_pick(pattern, text, index):
    """lm-eval's RegexFilter, on the text before a stop: match `index` of findall, its first group, or the fallback."""
    matches = pattern.findall(min((text.split(stop, 1)[0] for stop in _LM_EVAL_UNTIL), key=len))
    if not matches:
        return _LM_EVAL_FALLBACK
    match = matches[index]
    if isinstance(match, tuple):
        match = next((group for group in match if group), _LM_EVAL_FALLBACK)
    return match.strip()


def _lm_eval_normalise(text):
    """lm-eval's exact_match normalisation for gsm8k: the ignored regexes in order, then lower case."""
    for pattern in _LM_EVAL_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower().strip()


def lm_eval_strict(completion, gold):
    """lm-evaluation-harness gsm8k "strict-match": the FIRST `#### N` of the completion equals the gold as a string.

    Args:
        completion: the model's text.
        gold: the GSM8K solution ("... #### 72") or its bare number.

    >>> lm_eval_strict("#### 72\\n#### 73", "72"), lm_eval_strict("The answer is 72", "72")
    (True, False)
    """
    predicted = _lm_eval_pick(_LM_EVAL_STRICT, completion, 0)
    return _lm_eval_normalise(predicted) == _lm_eval_normalise(gold)


def lm_eval_flexible(completion, gold):
    """lm-evaluation-harness gsm8k "flexible-extract": the LAST number-like run of the completion equals the gold.

    Args:
        completion: the model's text.
        gold: the GSM8K solution ("... #### 72") or its bare number.

    >>> lm_eval_flexible("She pays $1,000.", "1000"), lm_eval_flexible("18.00", "18")
    (True, False)
    >>> lm_eval_flexible("So 72.\\n\\nQuestion: Sam has 5 pens.", "72")  # lm-eval stops at "Question:"
    True
    """
    predicted = _lm_eval_pick(_LM_EVAL_FLEXIBLE, completion, -1)
    return _lm_eval_normalise(predicted) == _lm_eval_normalise(gold)


def format_interval(p, low, high):
    """An accuracy with its interval, for logs and cards.

    >>> format_interval(0.40625, *wilson(52, 128))
    '0.406 [0.325, 0.493]'
    """
    return f"{p:.3f} [{low:.3f}, {high:.3f}]"


def describe_pair(before_acc, after_acc, paired):
    """One line for a before/after pair: both accuracies, the change, the flips and the exact test's p-value.

    Args:
        before_acc: accuracy before.
        after_acc: accuracy after.
        paired: the dict paired() returns for the same two evaluations.

    >>> describe_pair(0.180, 0.406, {"up": 43, "down": 14, "p_value": mcnemar_exact(43, 14)})
    '0.180 -> 0.406 (+0.226; 43 up / 14 down, p = 0.00015)'
    """
    change = after_acc - before_acc
    return (
        f"{before_acc:.3f} -> {after_acc:.3f} ({change:+.3f}; "
        f"{paired['up']} up / {paired['down']} down, p = {paired['p_value']:.2g})"
    )
