"""Tests of grpo/profiles.py: the demo task and warm start, its summary, recipes.

.venv/bin/python -m pytest tests/test_profiles.py -q -m "not slow"
"""

import json
import re

import pytest
from conftest import REPO, parse

from grpo import grading, gsm8k, profiles
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# The task


def columns_add_up(solution, a, b):
    """True when `solution` is the written column addition of a + b: the sum restated, each column's digits and the
    carry from the column before summed right, and the final '#### N' made of the column digits and the last carry."""
    first, *cols, last = solution.split("\n")
    if first != f"{a}+{b}" or len(cols) != profiles.DIGITS or not last.startswith("#### "):
        return False
    carry, digits = 0, ""
    for x, y, col in zip(str(a)[::-1], str(b)[::-1], cols, strict=True):
        total = int(x) + int(y) + carry
        if col != f"{x}+{y}+{carry}={total:02d}":
            return False
        carry, digits = total // 10, str(total % 10) + digits
    return last[5:] == (str(carry) if carry else "") + digits == str(a + b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_task_has_disjoint_splits_and_worked_golds(seed):
    train, test = profiles.make_task(seed)
    problems = profiles.make_problems(seed)
    assert (len(train), len(test)) == (profiles.TRAIN_PROBLEMS, profiles.TEST_PROBLEMS)
    assert len(test) >= 200  # the demo's evaluation needs at least 200 held-out problems
    assert not {r["question"] for r in train} & {r["question"] for r in test}  # no test question is trained on
    for row, problem in zip(train + test, problems, strict=True):
        a, b = problem["a"], problem["b"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and f" {a} " in row["question"] and f" {b} " in row["question"]
        assert grading.extract_hash_answer(row["answer"]) == str(a + b)  # GSM8K's answer format, read by our parser
        assert columns_add_up(row["answer"], a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_warm_start_target_is_a_correct_solution(seed):
    questions, worked, mixed = profiles.warm_start_targets(seed)
    problems = profiles.make_problems(seed)[: profiles.TRAIN_PROBLEMS]
    assert questions == [p["question"] for p in problems]  # the targets are the train split's, in order
    for problem, targets in zip(problems, zip(worked, mixed, strict=True), strict=True):
        a, b = problem["a"], problem["b"]
        for target in targets:
            # the project's own grader credits it, strict (a '#### N' last line) and lenient: no corrupted target
            assert grading.grade(target, str(a + b)) == {
                "extracted": str(a + b),
                "correct": True,
                "strict_correct": True,
                "formatted": True,
            }
            assert target == f"#### {a + b}" or columns_add_up(target, a, b)  # one shot, or working that adds up
    assert {profiles.style(t) for t in worked} == {"worked"}  # phase 1 teaches the working only
    one_shot = sum(profiles.style(t) == "one-shot" for t in mixed) / len(mixed)
    assert abs(one_shot - profiles.ONE_SHOT_SHARE) < 0.02  # phase 2: ~70% one-shot (8,000 draws: sd 0.005)


def test_the_task_is_a_function_of_the_seed():
    assert profiles.make_task(0) == profiles.make_task(0)  # same seed, same problems: runs and their caches agree
    assert profiles.make_task(0)[1] != profiles.make_task(1)[1]  # another seed, another test split


def test_write_task_writes_gsm8k_files_that_load(tmp_path):
    folder = profiles.write_task(tmp_path / "task", seed=0)
    train, test = profiles.make_task(0)
    lines = (tmp_path / "task" / "test.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == test
    loaded = gsm8k.load(folder, "train")  # the loader the training run uses
    assert len(loaded) == len(train) and loaded[0]["answer"] == train[0]["answer"].rsplit(" ", 1)[-1]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("#### 843", "one-shot"),
        (" #### 843", "one-shot"),
        ("457+386\n7+6+0=13\n5+8+1=14\n4+3+1=08\n#### 843", "worked"),
        ("843", "worked"),  # anything that does not open with the answer counts as working
    ],
)
def test_style_tells_a_one_shot_answer_from_working(completion, expected):
    assert profiles.style(completion) == expected


def test_summary_is_one_before_after_line(tmp_path):
    rows = {"before": ["#### 9", "#### 8"], "after": ["4+5\n#### 9", "#### 9"]}
    for when, completions in rows.items():
        correct = [c.endswith("9") for c in completions]
        metrics = {"lenient_accuracy": sum(correct) / 2, "sampled_accuracy": 0.25, "mean_completion_tokens": 3.0}
        (tmp_path / f"eval_test_{when}.json").write_text(json.dumps(metrics))
        lines = [json.dumps({"completion": c, "correct": k}) for c, k in zip(completions, correct, strict=True)]
        (tmp_path / f"eval_test_{when}_predictions.jsonl").write_text("\n".join(lines) + "\n")
    # lenient 1/2 -> 2/2, one of two answers worked after, none before
    assert profiles.summary(tmp_path) == (
        "demo, before -> after GRPO: lenient_accuracy 0.500 -> 1.000, sampled_accuracy 0.250 -> 0.250, "
        "worked_share 0.000 -> 0.500, mean_completion_tokens 3.000 -> 3.000"
    )


def test_only_a_demo_run_logs_the_summary(tmp_path, caplog):
    caplog.set_level("INFO", logger="grpotrainer.profiles")
    profiles.log_summary(tmp_path, "smoke")  # another profile: nothing, not even the missing-files note
    assert caplog.messages == []
    profiles.log_summary(tmp_path, "demo")  # no evaluations in tmp_path: the note says why there is no line
    assert caplog.messages == ["demo: no before -> after line without EVAL_BEFORE and EVAL_AFTER"]


# --- overrides ---------------------------------------------------------------------------------------------------


# --- --config recipe.yaml ---------------------------------------------------------------------------------------


def test_a_recipe_sets_constants_and_fields_and_the_command_line_wins(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("MAX_STEPS: 2\nREWARD_FUNCS: [correctness_reward]\nREWARD_WEIGHTS: [1.0]\ntop_p: 0.9\n")
    args = parse(["--smoke", "--config", str(recipe)])
    assert args.settings["MAX_STEPS"] == 2  # the file over --smoke's 4
    assert args.settings["REWARD_FUNCS"] == ["correctness_reward"] and args.settings["REWARD_WEIGHTS"] == [1.0]
    assert args.fields == {"top_p": 0.9}  # a lower-case key is a GRPOConfig field, typed by transformers
    assert "MAX_STEPS" in args.given  # a recipe's constant counts as given, as on the command line
    args = parse(["--smoke", f"--config={recipe}", "--MAX_STEPS=3", "--top_p=0.8"])
    assert (args.settings["MAX_STEPS"], args.fields["top_p"]) == (3, 0.8)  # the command line wins


@pytest.mark.parametrize(
    "text, message",
    [
        ("MAX_STEP: 2\n", "--config {path}: unknown setting --MAX_STEP. Did you mean MAX_STEPS"),
        ("top_pp: 0.9\n", "--config {path}: unknown setting --top_pp: not a constant nor a GRPOConfig field. Did you"),
        ("MAX_STEPS: many\n", "--config {path}: --MAX_STEPS=many is not a valid int"),
        ("- MAX_STEPS\n", "--config {path}: a recipe is a mapping of KEY: value lines"),
        ("MAX_STEPS: [\n", "--config {path} is not valid YAML"),
    ],
)
def test_a_bad_recipe_names_the_file_and_the_key(tmp_path, text, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message.format(path=recipe))):
        parse(["--config", str(recipe)])


def test_the_shipped_recipe_parses():
    args = parse(["--config", str(REPO / "configs" / "gsm8k-qwen3-8b.yaml")])
    assert args.settings["NUM_GENERATIONS"] == 8 and args.fields == {"warmup_steps": 10}
