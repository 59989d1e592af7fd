"""The grader on real data: every GSM8K reference solution (train and test, 8,792) graded against its own gold.

GSM8K (MIT licence) is read from ../shared/data/gsm8k/{train,test}.jsonl beside the checkout, never copied into the
repository; without it these tests are skipped, and say so. Run:
    python -m pytest tests/test_rewards_gsm8k.py -q -rs
"""

import json
from pathlib import Path

import pytest

from grpo.grading import answers_match, extract_answer, extract_hash_answer
from rewards import correctness_reward, format_reward

DATA = Path(__file__).resolve().parents[1].parent / "shared/data/gsm8k"
SPLIT_SIZES = {"train": 7473, "test": 1319}

pytestmark = pytest.mark.gsm8k


@pytest.fixture(scope="module")
def solutions():
    """The reference solutions of both splits, in file order: train then test."""
    missing = [DATA / f"{split}.jsonl" for split in SPLIT_SIZES if not (DATA / f"{split}.jsonl").is_file()]
    if missing:
        pytest.skip(f"GSM8K data not found: {', '.join(map(str, missing))} (put train.jsonl and test.jsonl there)")
    rows = {split: (DATA / f"{split}.jsonl").read_text().splitlines() for split in SPLIT_SIZES}
    assert {split: len(lines) for split, lines in rows.items()} == SPLIT_SIZES
    return [json.loads(line)["answer"] for lines in rows.values() for line in lines]


@pytest.fixture(scope="module")
def golds(solutions):
    return [extract_answer(solution) for solution in solutions]


def test_every_gold_parses(solutions, golds):
    assert len(solutions) == 8792
    unparsed = [solution[-60:] for solution, gold in zip(solutions, golds, strict=True) if gold is None]
    assert unparsed == []
    # the strict GSM8K-format extractor that evaluate.py uses reads the same golds
    assert [extract_hash_answer(solution) for solution in solutions] == golds


@pytest.mark.parametrize("form", ["plain", "chat"])
def test_each_solution_scores_one_against_its_own_gold(solutions, form):
    completions = solutions if form == "plain" else [[{"role": "assistant", "content": s}] for s in solutions]
    scores = correctness_reward(completions, answer=solutions)
    failed = [solution[-60:] for solution, score in zip(solutions, scores, strict=True) if score != 1.0]
    assert failed == []


def test_each_solution_scores_zero_against_a_different_gold(solutions, golds):
    # pair solution i with the gold of solution i+1 (rotate by one); where the two golds differ by value, 0.0
    rotated = solutions[1:] + solutions[:1]
    scores = correctness_reward(solutions, answer=rotated)
    differ = [not answers_match(a, b) for a, b in zip(golds, golds[1:] + golds[:1], strict=True)]
    assert sum(differ) > 8600  # neighbouring problems rarely share an answer
    wrong = [i for i, (score, d) in enumerate(zip(scores, differ, strict=True)) if d and score != 0.0]
    assert wrong == []


def test_each_solution_has_the_asked_format(solutions):
    # every reference ends with a "#### N" line, the format the prompt asks for
    assert set(format_reward(solutions)) == {1.0}
