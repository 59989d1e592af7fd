"""demo/sums.py: the demo's task, warm-start targets, profile hooks and summary line, and `grpotrainer.py --demo` end
to end (the sampled accuracy it reports is tested in test_gsm8k.py); the interface every demo/ profile keeps.

    .venv/bin/python -m pytest tests/test_demo.py -q -m "not slow"     # the task, in seconds
    .venv/bin/python -m pytest tests/test_demo.py -q -m slow -s        # the whole demo: ~7-10 minutes, one thread

It is the evidence that the loop learns on the real objective: GRPO with the default rewards raises
held-out correctness (greedy lenient and sampled accuracy), measured by the same evaluation code as a real run.
"""

import json

import pytest
from conftest import event_dirs, read_scalars, train

import grpotrainer
from demo import sums
from grpo import advice, cli, grading, gsm8k

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


def test_worked_writes_each_column_with_its_carry():
    # units first, every column two digits wide; moved from the docstring of worked
    assert sums.worked(457, 386) == "457+386\n7+6+0=13\n5+8+1=14\n4+3+1=08\n#### 843"
    assert sums.style(sums.worked(457, 386)) == "worked"


def test_style_stats_counts_the_share_of_working_and_each_styles_accuracy():
    predictions = [{"completion": "#### 9", "correct": False}, {"completion": "4+5\n#### 9", "correct": True}]
    assert sums.style_stats(predictions) == {"worked_share": 0.5, "one-shot_accuracy": 0.0, "worked_accuracy": 1.0}
    # a style no completion has: no accuracy rather than a division by zero
    assert sums.style_stats(predictions[:1]) == {
        "worked_share": 0.0,
        "one-shot_accuracy": 0.0,
        "worked_accuracy": None,
    }


def test_real_solve_writes_each_step_and_the_answer():
    from demo import real

    # kind 3: buys b more, then gives c away (moved from the docstring of demo/real.py's solve)
    assert real.solve(3, {"a": 5, "b": 7, "c": 4}) == ("5 + 7 = 12\n12 - 4 = 8\n#### 8", 8)


def test_finish_is_one_before_after_line(tmp_path):
    rows = {"before": ["#### 9", "#### 8"], "after": ["4+5\n#### 9", "#### 9"]}
    for when, completions in rows.items():
        correct = [c.endswith("9") for c in completions]
        metrics = {"lenient_accuracy": sum(correct) / 2, "sampled_accuracy": 0.25, "mean_completion_tokens": 3.0}
        (tmp_path / f"eval_test_{when}.json").write_text(json.dumps(metrics))
        lines = [json.dumps({"completion": c, "correct": k}) for c, k in zip(completions, correct, strict=True)]
        (tmp_path / f"eval_test_{when}_predictions.jsonl").write_text("\n".join(lines) + "\n")
    # lenient 1/2 -> 2/2, one of two answers worked after, none before
    assert sums.finish(tmp_path) == (
        "demo, before -> after GRPO: lenient_accuracy 0.500 -> 1.000, sampled_accuracy 0.250 -> 0.250, "
        "worked_share 0.000 -> 0.500, mean_completion_tokens 3.000 -> 3.000"
    )


def test_finish_without_both_evaluations_says_why_there_is_no_line(tmp_path):
    (tmp_path / "eval_test_after.json").write_text("{}")  # EVAL_BEFORE=0: nothing to compare the after with
    assert sums.finish(tmp_path) == "demo: no before -> after line without EVAL_BEFORE and EVAL_AFTER"


def test_prepare_names_the_task_and_model_of_the_seed_and_leaves_the_warm_start_to_build(tmp_path, monkeypatch):
    monkeypatch.setattr(sums, "warm_start", lambda *args: pytest.fail("prepare must not warm-start"))
    s = {**sums.SETTINGS, "OUTPUT_DIR": str(tmp_path), "SEED": 2}
    prepared = sums.prepare(s, given=set())
    assert prepared["DATASET"] == str(tmp_path / "demo-sums-seed2")  # the task of SEED, in OUTPUT_DIR
    assert prepared["MODEL_NAME"] == str(tmp_path / "demo-sums-model-seed2")
    assert len(gsm8k.load(prepared["DATASET"], "test")) == sums.TEST_PROBLEMS  # written now, for the plan to count
    assert not (tmp_path / "demo-sums-model-seed2").exists()  # named only: build() warm-starts it
    mine = sums.prepare({**s, "DATASET": "mine", "MODEL_NAME": "m"}, given={"DATASET", "MODEL_NAME"})
    assert (mine["DATASET"], mine["MODEL_NAME"]) == ("mine", "m")  # the command line wins


def test_build_warm_starts_only_the_demos_own_missing_model(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(sums, "warm_start", lambda folder, seed, prompt: started.append((folder, seed)))
    own = tmp_path / "demo-sums-model-seed0"
    sums.build({"MODEL_NAME": str(tmp_path / "my-model"), "SEED": 0, "SYSTEM_PROMPT": "p"})  # a model given
    sums.build({"MODEL_NAME": str(own), "SEED": 1, "SYSTEM_PROMPT": "p"})  # another seed's folder name
    assert started == []
    sums.build({"MODEL_NAME": str(own), "SEED": 0, "SYSTEM_PROMPT": "p"})
    assert started == [(own, 0)]
    (own / "config.json").parent.mkdir()
    (own / "config.json").write_text("{}")
    sums.build({"MODEL_NAME": str(own), "SEED": 0, "SYSTEM_PROMPT": "p"})  # there now: cached
    assert started == [(own, 0)]


@pytest.mark.parametrize("name", sorted(grpotrainer.PROFILES))
def test_every_profile_sets_only_constants_and_ends_in_at_most_one_line(name, tmp_path):
    profile = grpotrainer.PROFILES[name]
    assert set(profile.SETTINGS) <= set(cli.constants(grpotrainer))  # parse applies them over the constants
    assert set(profile.FIXED) <= set(advice.LEVERS.values())  # only a lever some advice names can be fixed
    line = profile.finish(tmp_path)  # train() logs it last, even for a run without evaluations
    assert line is None or (line and "\n" not in line)
