"""grpo/stats.py: Wilson intervals, the exact McNemar test, pass@k and the lm-eval-harness GSM8K verdicts.

Expected values are computed by hand from the formulas (the arithmetic is in the comments) or by brute force.
Run:
    OMP_NUM_THREADS=1 python -m pytest -q tests/test_stats.py grpo/stats.py
"""

import itertools
import math

import pytest

from grpo.stats import (
    describe_pair,
    format_interval,
    lm_eval_flexible,
    lm_eval_strict,
    mcnemar_exact,
    paired,
    paired_samples,
    pass_at_k,
    pass_at_ks,
    wilson,
)

# ----------------------------------------------------------------------------------------------------------------
# Wilson


@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        # p = 0.25, z² = 3.841459, z²/n = 0.960365, 1 + z²/n = 1.960365
        # centre = (0.25 + 0.480182) / 1.960365 = 0.372473
        # half = 1.959964 / 1.960365 * sqrt(0.25 * 0.75 / 4 + 3.841459 / 64) = 0.999795 * sqrt(0.106898) = 0.326886
        (1, 4, 0.045587, 0.699359),
        # p = 0.5: centre 0.5; half = 1.959964 / 1.384146 * sqrt(0.025 + 3.841459 / 400) = 1.416010 * 0.186021
        # = 0.263407
        (5, 10, 0.236593, 0.763407),
        # p = 0: low is 0 and high = (z²/n) / (1 + z²/n) = 0.384146 / 1.384146
        (0, 10, 0.0, 0.277533),
        # p = 1 mirrors p = 0
        (10, 10, 0.722467, 1.0),
        # p = 52/128 = 0.40625, z²/n = 0.030011, 1 + z²/n = 1.030011
        # centre = (0.40625 + 0.015006) / 1.030011 = 0.408986
        # half = 1.959964 / 1.030011 * sqrt(0.40625 * 0.59375 / 128 + 3.841459 / 65536) = 1.902857 * 0.044283
        (52, 128, 0.325103, 0.492860),
    ],
)
def test_wilson_matches_the_formula_by_hand(successes, n, low, high):
    assert wilson(successes, n) == pytest.approx((low, high), abs=2e-6)


def test_wilson_is_symmetric_around_one_half():
    # p = 0.5: the same distance below and above
    assert [round(b, 4) for b in wilson(5, 10)] == [0.2366, 0.7634]


def test_wilson_without_problems_knows_nothing():
    # No data: every proportion is possible.
    assert wilson(0, 0) == (0.0, 1.0)


def test_wilson_widens_with_the_confidence_level():
    # z = 2.575829 (99 %) gives a wider interval around the same centre than z = 1.96 (95 %).
    low95, high95 = wilson(30, 100)
    low99, high99 = wilson(30, 100, z=2.575829303549)
    assert low99 < low95 < 0.3 < high95 < high99


@pytest.mark.parametrize("successes, n", [(-1, 10), (11, 10)])
def test_wilson_refuses_impossible_counts(successes, n):
    with pytest.raises(ValueError, match="0..n"):
        wilson(successes, n)


# ----------------------------------------------------------------------------------------------------------------
# McNemar / sign test


@pytest.mark.parametrize(
    "up, down, expected",
    [
        (5, 0, 0.0625),  # 2 * C(5,0) / 2^5 = 2/32
        (6, 0, 0.03125),  # 2 * 1 / 64
        (1, 1, 1.0),  # 2 * (1 + 2) / 4 = 1.5, capped at 1
        (3, 1, 0.625),  # 2 * (C(4,0) + C(4,1)) / 16 = 2 * 5/16
        (0, 0, 1.0),  # nothing flipped: no evidence either way
        (43, 14, 0.00015389),  # issue 30's strict row: 2 * sum_{i<=14} C(57,i) / 2^57
        (41, 19, 0.0062176),  # issue 30's lenient row
    ],
)
def test_mcnemar_exact_on_small_tables(up, down, expected):
    assert mcnemar_exact(up, down) == pytest.approx(expected, rel=1e-4)


def test_mcnemar_is_two_sided():
    # A fall is as significant as the same rise.
    assert mcnemar_exact(14, 43) == mcnemar_exact(43, 14)


def test_mcnemar_caps_at_one():
    # 2 * (1 + 2) / 4 = 1.5 is no probability
    assert mcnemar_exact(1, 1) == 1.0


def test_mcnemar_matches_the_binomial_sum():
    # 2 * P[X <= 2] for X ~ binomial(10, 1/2) = 2 * (1 + 10 + 45) / 1024
    assert mcnemar_exact(8, 2) == pytest.approx(2 * 56 / 1024)


def test_paired_counts_flips_and_difference():
    before = [False, False, False, True, True, True]
    after = [True, True, False, True, False, True]
    result = paired(before, after)
    # Problems 0, 1 went up, 4 went down, 3 and 5 stayed right, 2 stayed wrong.
    assert result == {
        "n": 6,
        "up": 2,
        "down": 1,
        "both_right": 2,
        "both_wrong": 1,
        "p_value": 1.0,  # 2 * (1 + 3) / 8 = 1, capped
        "difference": pytest.approx(1 / 6),
    }


def test_paired_samples_is_the_sign_test_on_each_problems_count():
    # 3 samples each. Problem 0: 0 -> 3 up, 1: 1 -> 2 up, 2: 2 -> 2 tie, 3: 3 -> 1 down, 4: 0 -> 1 up, 5: 0 -> 0 tie.
    # 3 up, 1 down: p = 2 * P[X <= 1] for X ~ binomial(4, 1/2) = 2 * 5/16. Accuracy 6/18 -> 9/18.
    result = paired_samples([0, 1, 2, 3, 0, 0], [3, 2, 2, 1, 1, 0], 3)
    assert (result["up"], result["down"], result["ties"], result["n"]) == (3, 1, 2, 6)
    assert result["p_value"] == pytest.approx(10 / 16)
    assert (result["before"], result["after"]) == (pytest.approx(6 / 18), pytest.approx(9 / 18))
    assert result["difference"] == pytest.approx(3 / 18)


def test_paired_samples_on_two_samples_each():
    # problem 0: 0 -> 2 up, 1: tie, 2: 0 -> 1 up, 3: 2 -> 0 down; accuracy 3/8 -> 4/8; p = 2 * (1 + 3) / 8, capped
    test = paired_samples([0, 1, 0, 2], [2, 1, 1, 0], 2)
    assert (test["up"], test["down"], test["before"], test["after"], test["p_value"]) == (2, 1, 0.375, 0.5, 1.0)


def test_paired_samples_with_one_sample_is_mcnemar():
    before, after = [0, 0, 0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 1, 1, 1]
    one = paired_samples(before, after, 1)
    two = paired([bool(x) for x in before], [bool(x) for x in after])
    assert (one["up"], one["down"], one["p_value"]) == (two["up"], two["down"], two["p_value"]) == (6, 1, 0.125)


def test_paired_refuses_different_problem_counts():
    with pytest.raises(ValueError, match="same problems"):
        paired([True, False], [True])


# ----------------------------------------------------------------------------------------------------------------
# pass@k


def _pass_at_k_by_enumeration(n, c, k):
    """The share of all k-subsets of n samples (the first c right) that hold a right sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_pass_at_k_matches_enumeration_of_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_pass_at_k_matches_the_binomial_form_for_large_n():
    # 1 - C(150, 10) / C(200, 10), with exact integers
    expected = 1 - math.comb(150, 10) / math.comb(200, 10)
    assert pass_at_k(200, 50, 10) == pytest.approx(expected, rel=1e-12)


def test_pass_at_k_is_exact_at_the_ends():
    # no right sample: never; fewer wrong samples than k: always
    assert (pass_at_k(4, 0, 4), pass_at_k(4, 3, 2)) == (0.0, 1.0)


def test_pass_at_1_is_the_share_right():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_pass_at_ks_is_the_mean_over_problems_for_every_k():
    counts = [0, 1, 4]
    every = pass_at_ks(counts, n=4)
    # per problem at k = 2 of n = 4: 0, 1 - C(3,2)/C(4,2) = 0.5, 1 -> mean 0.5
    assert every[2] == pytest.approx(0.5)
    assert list(every) == [1, 2, 3, 4]
    # k = 1 is the sampled accuracy, 5/12; k = n is the share of problems solved at least once, 2/3
    assert every[1] == pytest.approx(5 / 12)
    assert every[4] == pytest.approx(2 / 3)
    assert {k: round(v, 4) for k, v in every.items()} == {1: 0.4167, 2: 0.5, 3: 0.5833, 4: 0.6667}


def test_pass_at_ks_refuses_no_problems():
    with pytest.raises(ValueError, match="no problems"):
        pass_at_ks([], n=4)


# ----------------------------------------------------------------------------------------------------------------
# lm-eval-harness gsm8k: the shapes where it differs from this project's grader

GOLD_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    "completion, gold, strict, flexible",
    [
        # two #### lines: strict takes the first, flexible the last number (this project reads the last ####)
        ("#### 72\n#### 73", "72", True, False),
        ("#### 72\n#### 73", "73", False, True),
        # a trailing "." is dropped by the metric's `\.$`
        ("So the total is 72 clips.\n#### 72.", "72", True, True),
        # "$1,000": flexible reads it, strict's #### must be followed by a digit or "-"
        ("She pays $1,000.", "1000", False, True),
        ("#### $1,000", "1000", False, True),
        ("#### 1,000", "1000", True, True),
        # no ####: strict has no answer, flexible takes the last number
        ("48 + 24 = 72", "72", False, True),
        ("72 clips, not 70", "72", False, False),
        # one-digit answers are read by flexible's second group
        ("She has 7", "7", False, True),
        # strings, not values: "18.00" is not "18" (this project compares by value)
        ("#### 18.00", "18", False, False),
        # a negative answer
        ("#### -5", "-5", True, True),
        # the gold may be the whole GSM8K solution: everything up to its last "#### " is dropped
        ("#### 72", GOLD_SOLUTION, True, True),
        # no number at all
        ("I cannot tell.", "72", False, False),
        # lm-eval stops at "Question:", so the next question's numbers are never read
        ("So 72.\n\nQuestion: Sam has 5 pens.", "72", False, True),
    ],
)
def test_lm_eval_verdicts(completion, gold, strict, flexible):
    assert lm_eval_strict(completion, gold) is strict
    assert lm_eval_flexible(completion, gold) is flexible


# ----------------------------------------------------------------------------------------------------------------
# Text


def test_format_interval():
    assert format_interval(0.40625, 0.325103, 0.492860) == "0.406 [0.325, 0.493]"
    assert format_interval(0.40625, *wilson(52, 128)) == "0.406 [0.325, 0.493]"


def test_describe_pair_from_paired():
    before = [True] * 2 + [False] * 5 + [True] * 1
    after = [True] * 2 + [True] * 5 + [False] * 1
    result = paired(before, after)
    # 3/8 -> 7/8, 5 up / 1 down, p = 2 * (1 + 6) / 64 = 0.21875
    assert describe_pair(3 / 8, 7 / 8, result) == "0.375 -> 0.875 (+0.500; 5 up / 1 down, p = 0.22)"


def test_describe_pair_shows_a_fall():
    line = describe_pair(0.5, 0.25, {"up": 0, "down": 2, "p_value": 0.5})
    assert line == "0.500 -> 0.250 (-0.250; 0 up / 2 down, p = 0.5)"
