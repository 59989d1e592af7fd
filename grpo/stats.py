"""How sure an evaluation is: intervals, the paired test, pass@k, and lm-eval-harness-compatible GSM8K verdicts.

Pure Python (math only), so every tool can import it. lm_eval_strict and lm_eval_flexible reproduce the `gsm8k`
task of lm-evaluation-harness (version 3.0), which compares strings ("18.00" is not "18", "#### $5" is no answer) where
grpo/grading.py compares values: on the same completions they isolate the grader's part of a gap to a model card's
score (lm-eval also prompts differently: 5-shot plain text, no chat template).
"""

import math
import re

Z_95 = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


def wilson(successes, n, z=Z_95):
    """The Wilson score interval (low, high) of `successes` right of n, 95 % by default; (0.0, 1.0) for n = 0.

    Unlike the normal (Wald) interval it stays inside [0, 1] and is not zero-width at 0 or n successes:
        centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²),  p = successes / n.
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
    """Two-sided exact McNemar test (the sign test) on the flips of two evaluations of the same problems, `up`
    wrong -> right and `down` right -> wrong: p = min(1, 2 * P[X <= min(up, down)]), X ~ binomial(up + down, 1/2),
    in exact integers; 1.0 when nothing flipped."""
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
    pairs = list(zip(before, after, strict=True))
    return len(pairs), sum(a > b for b, a in pairs), sum(a < b for b, a in pairs)


def paired(before, after):
    """Two evaluations' per-problem verdicts (True = right), problem by problem: n, up (wrong -> right), down,
    both_right, both_wrong, p_value (mcnemar_exact) and difference (after's accuracy minus before's).

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
    """The sign test on each problem's count of right samples (of `samples` in both), `paired` for one sample: n,
    samples, up, down, ties, before and after (sampled accuracies), p_value and difference."""
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
    """Unbiased pass@k of one problem from n samples, c of them right (Chen et al. 2021): 1 - C(n-c, k) / C(n, k),
    the chance that k of the n, drawn without replacement, include a right one; 0 <= c <= n, 1 <= k <= n.

    >>> pass_at_k(4, 1, 2)
    0.5
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # fewer than k wrong samples: every draw of k holds a right one
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the same, without forming the large binomials
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_ks(counts, n):
    """{k: pass@k} for every k in 1..n, each the mean of pass_at_k over problems, `counts` right of n samples each;
    pass@1 is the plain sampled accuracy."""
    if not counts:
        raise ValueError("pass_at_ks: no problems")
    return {k: sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in range(1, n + 1)}


# lm-evaluation-harness gsm8k.yaml: the two filters, the fallback for no match, and exact_match's regexes_to_ignore.
_LM_EVAL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_LM_EVAL_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_LM_EVAL_FALLBACK = "[invalid]"
_LM_EVAL_UNTIL = ("Question:", "</s>", "<|im_end|>")  # generation_kwargs' until: lm-eval never sees what follows
_LM_EVAL_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def _lm_eval_pick(pattern, text, index):
    """lm-eval's RegexFilter, on the text before a stop: match `index` of findall, its first group, or the fallback."""
    matches = pattern.findall(min((text.split(stop, 1)[0] for stop in _LM_EVAL_UNTIL), key=len))
    match = matches[index] if matches else _LM_EVAL_FALLBACK
    if isinstance(match, tuple):  # the flexible pattern's two groups
        match = next((group for group in match if group), _LM_EVAL_FALLBACK)
    return match.strip()


def _lm_eval_normalise(text):
    """lm-eval's exact_match normalisation for gsm8k: the ignored regexes in order, then lower case."""
    for pattern in _LM_EVAL_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower().strip()


def lm_eval_strict(completion, gold):
    """lm-evaluation-harness gsm8k "strict-match": the completion's FIRST `#### N` equals the gold (a GSM8K solution
    or its number) as a string.

    >>> lm_eval_strict("#### 72\\n#### 73", "72"), lm_eval_strict("The answer is 72", "72")
    (True, False)
    """
    predicted = _lm_eval_pick(_LM_EVAL_STRICT, completion, 0)
    return _lm_eval_normalise(predicted) == _lm_eval_normalise(gold)


def lm_eval_flexible(completion, gold):
    """lm-evaluation-harness gsm8k "flexible-extract": the completion's LAST number-like run equals the gold.

    >>> lm_eval_flexible("She pays $1,000.", "1000"), lm_eval_flexible("18.00", "18")
    (True, False)
    """
    predicted = _lm_eval_pick(_LM_EVAL_FLEXIBLE, completion, -1)
    return _lm_eval_normalise(predicted) == _lm_eval_normalise(gold)


def format_interval(p, low, high):
    """An accuracy with its interval, for logs and cards: '0.406 [0.325, 0.493]'."""
    return f"{p:.3f} [{low:.3f}, {high:.3f}]"


def describe_pair(before_acc, after_acc, paired):
    """One line for a before/after pair: both accuracies, the change, and the flips and p-value of `paired`'s dict.

    >>> describe_pair(0.180, 0.406, {"up": 43, "down": 14, "p_value": mcnemar_exact(43, 14)})
    '0.180 -> 0.406 (+0.226; 43 up / 14 down, p = 0.00015)'
    """
    return (
        f"{before_acc:.3f} -> {after_acc:.3f} ({after_acc - before_acc:+.3f}; "
        f"{paired['up']} up / {paired['down']} down, p = {paired['p_value']:.2g})"
    )
