"""The demo (grpo/profiles.py, `grpotrainer.py --demo`) and the sampled accuracy it reports (gsm8k.py).

    .venv/bin/python -m pytest tests/test_demo.py -q -m "not slow"     # the task generator and the estimator, seconds
    .venv/bin/python -m pytest tests/test_demo.py -q -m slow -s        # the whole demo: ~6 minutes on 2 CPU cores

The slow test is the evidence that the loop learns on the real objective: GRPO with the default rewards raises
held-out strict accuracy, measured by the same evaluation code as a real run, without losing answers. It replaces
tests/test_learning.py, whose '####'-marker reward on the random smoke model stopped rising.
"""

import json
import random

import pytest
from conftest import event_dirs, read_scalars, run_script

from grpo import grading, gsm8k, profiles

# ---------------------------------------------------------------------------------------------------------------
# The task


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_task_has_disjoint_splits_and_parseable_golds(seed):
    train, test = profiles.make_task(seed)
    assert (len(train), len(test)) == (profiles.TRAIN_PROBLEMS, profiles.TEST_PROBLEMS)
    assert len(test) >= 200  # the demo's evaluation needs at least 200 held-out problems
    assert not {r["question"] for r in train} & {r["question"] for r in test}  # no test question is trained on
    for row in train + test:
        work, gold = row["answer"].split("\n#### ")
        assert grading.extract_hash_answer(row["answer"]) == gold  # GSM8K's own answer format, read by our parser
        a, op, b, _, result = work.split()
        assert int(result) == (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(gold) >= 0
        assert 1 <= int(a) <= profiles.MAX_NUMBER + 1 and 1 <= int(b) <= profiles.MAX_NUMBER


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
    ("share", "expected"),
    [(1.0, "7 + 5 = 12\n#### 12"), (0.0, "7 + 5 = 12\nThe answer is 12.")],
)
def test_restyle_writes_one_of_the_two_answer_styles(share, expected):
    # share 1: always GSM8K's '#### N' (strict and lenient both credit it); 0: always the phrase only lenient credits
    answer = profiles.restyle("7 + 5 = 12\n#### 12", random.Random(0), hash_share=share)
    assert answer == expected
    assert grading.grade(answer, "12")["correct"] and grading.grade(answer, "12")["strict_correct"] == (share == 1.0)


# ---------------------------------------------------------------------------------------------------------------
# Sampled accuracy


@pytest.mark.parametrize(
    ("completions", "samples", "accuracy", "strict"),
    [
        (["#### 3", "#### 3", "#### 5", "#### 5"], 2, 0.5, 0.5),  # problem 0 always right, problem 1 never
        (["#### 3", "The answer is 3.", "#### 5", "#### 4"], 2, 0.75, 0.5),  # the phrase counts only lenient
        (["#### 3", "#### 9", "#### 9", "#### 4", "#### 4", "#### 4"], 3, 2 / 3, 2 / 3),  # 1/3 and 3/3 -> 2/3
    ],
)
def test_sampled_accuracy_is_the_mean_per_problem_share_of_correct_samples(completions, samples, accuracy, strict):
    golds = ["3", "4"]
    metrics = gsm8k.sampled_metrics(golds, completions, samples, 0.7)
    assert metrics == {
        "samples": samples,
        "sample_temperature": 0.7,
        "sampled_accuracy": round(accuracy, 4),
        "sampled_strict_accuracy": round(strict, 4),
    }


def test_sampled_metrics_refuse_a_wrong_number_of_completions():
    with pytest.raises(ValueError, match="3 completions for 2 problems x 2 samples"):
        gsm8k.sampled_metrics(["1", "2"], ["#### 1"] * 3, 2, 1.0)


class Sampler:
    """A stub sampling generator: the k-th call for a question answers right when k % 4 < i % 4 (i its gold), so
    problem i is right in exactly (i % 4) of every 4 samples."""

    def __init__(self):
        self.calls = {}

    def __call__(self, prompts):
        out = []
        for prompt in prompts:
            i = int(prompt[-1]["content"].split()[2])
            k = self.calls.get(i, 0)
            self.calls[i] = k + 1
            out.append((f"#### {i if k % 4 < i % 4 else -1}", 2, False))
        return out


def test_evaluate_reports_sampled_accuracy_beside_the_greedy_one():
    from test_evaluate import StubGenerator, problems

    metrics, predictions = gsm8k.evaluate(
        problems(4), StubGenerator(), 3, sampler=Sampler(), samples=4, temperature=1.0
    )
    # Problems 0..3 are right in 0, 1, 2, 3 of their 4 samples: (0 + 1/4 + 2/4 + 3/4) / 4 = 0.375, strict too.
    assert {k: metrics[k] for k in gsm8k.SAMPLED_KEYS} == {
        "samples": 4,
        "sample_temperature": 1.0,
        "sampled_accuracy": 0.375,
        "sampled_strict_accuracy": 0.375,
    }
    assert metrics["strict_accuracy"] == 0.5 and len(predictions) == 4  # the greedy part as before: 0 and 2
    assert list(metrics)[-1] == "seconds"


def test_without_samples_the_metrics_are_the_greedy_ones_only():
    from test_evaluate import StubGenerator, problems

    metrics, _ = gsm8k.evaluate(problems(2), StubGenerator(), 2)
    assert tuple(metrics) == (*gsm8k.KEYS, "seconds")  # the files of earlier runs keep their keys


def test_sampling_is_seeded_and_leaves_the_global_random_state_alone():
    import torch

    from grpo.profiles import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer).eval()
    sample = gsm8k.hf_generator(model, tokenizer, max_new_tokens=6, temperature=1.0)
    dataset = gsm8k.load(gsm8k.FIXTURE, "train", limit=2)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = gsm8k.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    after = torch.rand(1)
    again = gsm8k.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    assert first == again  # same seed, same samples
    assert before == after  # training's own random stream is untouched by the evaluation
    assert [r["question"] for r in first] == [q for q in dataset["question"] for _ in range(3)]  # problem-major
    assert len({r["completion"] for r in first}) > 1  # sampled, not greedy: a random model's samples differ


# ---------------------------------------------------------------------------------------------------------------
# The demo end to end


@pytest.mark.slow
def test_the_demo_raises_held_out_strict_accuracy(tmp_path):
    out = run_script("grpotrainer.py", "--demo", f"--OUTPUT_DIR={tmp_path}", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = (json.loads((tmp_path / f"eval_test_{w}.json").read_text()) for w in ("before", "after"))
    summary = {k: (before[k], after[k]) for k in ("strict_accuracy", "lenient_accuracy", "sampled_accuracy")}
    print(summary)
    assert before["n"] >= 200 and after["n"] >= 200
    assert after["strict_accuracy"] >= before["strict_accuracy"] + 0.10  # GRPO taught the asked '#### N' format
    assert after["lenient_accuracy"] >= before["lenient_accuracy"]  # ... without losing answers
    # ... and the sampled answers stay as good, up to noise: -0.008, -0.001 and -0.005 measured for SEED 0, 1, 2
    # (one standard error of 256 x 8 samples is ~0.006); 50 GRPO steps do not sharpen the sums (docs/demo.md)
    assert after["sampled_accuracy"] >= before["sampled_accuracy"] - 0.02
    (run,) = event_dirs(tmp_path)  # one TensorBoard run: the evaluations and the training curves together
    scalars = read_scalars(run)
    final = after["step"]
    for tag in ("eval/gsm8k_strict_accuracy", "eval/gsm8k_lenient_accuracy", "eval/gsm8k_sampled_accuracy"):
        assert [step for step, _ in scalars[tag]] == [0, final], tag
    assert len(scalars["train/reward"]) == final
