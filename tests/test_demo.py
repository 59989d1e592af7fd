"""demo/sums.py: the demo's task, warm-start targets and summary line, and `grpotrainer.py --demo` end to end (the
sampled accuracy it reports is tested in test_gsm8k.py).

    .venv/bin/python -m pytest tests/test_demo.py -q -m "not slow"     # the task, in seconds
    .venv/bin/python -m pytest tests/test_demo.py -q -m slow -s        # the whole demo: ~7-10 minutes, one thread

It is the evidence that the loop learns on the real objective: GRPO with the default rewards raises
held-out correctness (greedy lenient and sampled accuracy), measured by the same evaluation code as a real run.
"""

import json

import pytest
from conftest import event_dirs, read_scalars, train

from demo import sums
from grpo import grading, gsm8k

# ---------------------------------------------------------------------------------------------------------------
# The demo end to end


@pytest.mark.slow
def test_the_demo_raises_held_out_correctness(tmp_path):
    # no tight time limit: ~7-10 minutes on one thread, more on a loaded machine
    out = train(tmp_path, profile="--demo", timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = (json.loads((tmp_path / f"eval_test_{w}.json").read_text()) for w in ("before", "after"))
    summary = {k: (before[k], after[k]) for k in ("lenient_accuracy", "sampled_accuracy", "mean_completion_tokens")}
    print(summary)
    assert before["n"] >= 200 and after["n"] >= 200
    # GRPO paid for correctness moves the model from one-shot answers to working: measured for SEED 0 (docs/demo.md)
    # lenient +0.60 and sampled +0.49; the bar is +0.25, which leaves a margin of ~0.25 for noise
    assert after["lenient_accuracy"] >= before["lenient_accuracy"] + 0.25
    assert after["sampled_accuracy"] >= before["sampled_accuracy"] + 0.25
    assert after["mean_completion_tokens"] >= before["mean_completion_tokens"] + 5  # longer: the working is written
    assert "demo, before -> after GRPO: lenient_accuracy" in out.stderr + out.stdout  # the run's closing line
    (run,) = event_dirs(tmp_path)  # one TensorBoard run: the evaluations and the training curves together
    scalars = read_scalars(run)
    final = after["step"]
    for tag in ("eval/gsm8k_strict_accuracy", "eval/gsm8k_lenient_accuracy", "eval/gsm8k_sampled_accuracy"):
        assert [step for step, _ in scalars[tag]] == [0, final], tag
    assert len(scalars["train/reward"]) == final


def columns_add_up(solution, a, b):
    """True when `solution` is the written column addition of a + b: the sum restated, each column's digits and the
    carry from the column before summed right, and the final '#### N' made of the column digits and the last carry."""
    first, *cols, last = solution.split("\n")
    if first != f"{a}+{b}" or len(cols) != sums.DIGITS or not last.startswith("#### "):
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
    train, test = sums.make_task(seed)
    problems = sums.make_problems(seed)
    assert (len(train), len(test)) == (sums.TRAIN_PROBLEMS, sums.TEST_PROBLEMS)
    assert len(test) >= 200  # the demo's evaluation needs at least 200 held-out problems
    assert not {r["question"] for r in train} & {r["question"] for r in test}  # no test question is trained on
    for row, problem in zip(train + test, problems, strict=True):
        a, b = problem["a"], problem["b"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and f" {a} " in row["question"] and f" {b} " in row["question"]
        assert grading.extract_hash_answer(row["answer"]) == str(a + b)  # GSM8K's answer format, read by our parser
        assert columns_add_up(row["answer"], a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_warm_start_target_is_a_correct_solution(seed):
    questions, worked, mixed = sums.warm_start_targets(seed)
    problems = sums.make_problems(seed)[: sums.TRAIN_PROBLEMS]
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
                "padded": False,
            }
            assert target == f"#### {a + b}" or columns_add_up(target, a, b)  # one shot, or working that adds up
    assert {sums.style(t) for t in worked} == {"worked"}  # phase 1 teaches the working only
    one_shot = sum(sums.style(t) == "one-shot" for t in mixed) / len(mixed)
    assert abs(one_shot - sums.ONE_SHOT_SHARE) < 0.02  # phase 2: ~70% one-shot (8,000 draws: sd 0.005)


def test_the_task_is_a_function_of_the_seed():
    assert sums.make_task(0) == sums.make_task(0)  # same seed, same problems: runs and their caches agree
    assert sums.make_task(0)[1] != sums.make_task(1)[1]  # another seed, another test split


def test_write_task_writes_gsm8k_files_that_load(tmp_path):
    folder = sums.write_task(tmp_path / "task", seed=0)
    train, test = sums.make_task(0)
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
    assert sums.style(completion) == expected


def test_summary_is_one_before_after_line(tmp_path):
    rows = {"before": ["#### 9", "#### 8"], "after": ["4+5\n#### 9", "#### 9"]}
    for when, completions in rows.items():
        correct = [c.endswith("9") for c in completions]
        metrics = {"lenient_accuracy": sum(correct) / 2, "sampled_accuracy": 0.25, "mean_completion_tokens": 3.0}
        (tmp_path / f"eval_test_{when}.json").write_text(json.dumps(metrics))
        lines = [json.dumps({"completion": c, "correct": k}) for c, k in zip(completions, correct, strict=True)]
        (tmp_path / f"eval_test_{when}_predictions.jsonl").write_text("\n".join(lines) + "\n")
    # lenient 1/2 -> 2/2, one of two answers worked after, none before
    assert sums.summary(tmp_path) == (
        "demo, before -> after GRPO: lenient_accuracy 0.500 -> 1.000, sampled_accuracy 0.250 -> 0.250, "
        "worked_share 0.000 -> 0.500, mean_completion_tokens 3.000 -> 3.000"
    )


def test_only_a_demo_run_logs_the_summary(tmp_path, caplog):
    caplog.set_level("INFO", logger="grpotrainer.demo")
    sums.log_summary(tmp_path, "smoke")  # another profile: nothing, not even the missing-files note
    assert caplog.messages == []
    sums.log_summary(tmp_path, "demo")  # no evaluations in tmp_path: the note says why there is no line
    assert caplog.messages == ["demo: no before -> after line without EVAL_BEFORE and EVAL_AFTER"]
