"""Tests of grpo/gsm8k.py: dataset loading and its refusals, scoring, sampled metrics, reports.

.venv/bin/python -m pytest tests/test_gsm8k.py -q -m "not slow"
"""

import json
import re
from pathlib import Path

import pytest
from conftest import GSM8K_DIR, read_scalars, read_texts
from test_grading import CASES  # the same known grades, scored here as metrics

from grpo import grading, gsm8k
from grpo.errors import ConfigError

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
    assert {
        k: metrics[k] for k in ("samples", "sample_temperature", "sampled_accuracy", "sampled_strict_accuracy")
    } == {
        "samples": samples,
        "sample_temperature": 0.7,
        "sampled_accuracy": round(accuracy, 4),
        "sampled_strict_accuracy": round(strict, 4),
    }


def test_pass_at_k_and_the_sampled_interval_follow_their_formulas():
    # Problem 0 is right in 1 of 3 samples, problem 1 in all 3. pass@k = 1 - C(n-c, k) / C(n, k) per problem:
    # k=1: 1/3 and 1 -> 2/3; k=2: 1 - C(2,2)/C(3,2) = 2/3 and 1 -> 5/6; k=3: 1 and 1 -> 1.
    completions = ["#### 3", "#### 9", "#### 9", "#### 4", "#### 4", "#### 4"]
    metrics = gsm8k.sampled_metrics(["3", "4"], completions, 3, 0.7)
    assert metrics["pass_at_k"] == {"1": 0.6667, "2": 0.8333, "3": 1.0}
    # Wilson over the 2 problems with 4/3 expected right: p = 2/3, z^2 = 3.841459, 1 + z^2/n = 2.920729,
    # centre (0.666667 + 0.960365) / 2.920729 = 0.557065, half 0.671054 * sqrt(0.111111 + 0.240091) = 0.397683.
    assert metrics["sampled_accuracy_ci95"] == [0.1594, 0.9547]


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

    metrics, predictions = evaluation.evaluate(
        problems(4), StubGenerator(), 3, sampler=Sampler(), samples=4, temperature=1.0
    )
    # Problems 0..3 are right in 0, 1, 2, 3 of their 4 samples: (0 + 1/4 + 2/4 + 3/4) / 4 = 0.375, strict too.
    assert {k: metrics[k] for k in gsm8k.SAMPLED_KEYS} == {
        "samples": 4,
        "sample_temperature": 1.0,
        "sampled_accuracy": 0.375,
        "sampled_strict_accuracy": 0.375,
        # c = 0..3 of 4. k=2: 0, 1 - C(3,2)/C(4,2) = 1/2, 1 - C(2,2)/6 = 5/6, 1 -> 0.5833; k=3: 0, 3/4, 1, 1.
        "pass_at_k": {"1": 0.375, "2": 0.5833, "3": 0.6875, "4": 0.75},
    }
    assert [p["sampled_correct"] for p in predictions] == [0, 1, 2, 3]  # kept per problem
    assert metrics["strict_accuracy"] == 0.5 and len(predictions) == 4  # the greedy part as before: 0 and 2
    assert list(metrics)[-1] == "seconds"


def test_without_samples_the_metrics_are_the_greedy_ones_only():

    metrics, _ = evaluation.evaluate(problems(2), StubGenerator(), 2)
    assert tuple(metrics)[: len(gsm8k.KEYS)] == gsm8k.KEYS  # the files of earlier runs keep their keys
    assert not set(gsm8k.SAMPLED_KEYS) & set(metrics)


def test_sampling_is_seeded_and_leaves_the_global_random_state_alone():
    import torch

    from grpo.profiles import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer).eval()
    sample = generation.hf_generator(model, tokenizer, max_new_tokens=6, temperature=1.0)
    dataset = gsm8k.load(gsm8k.FIXTURE, "train", limit=2)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = generation.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    after = torch.rand(1)
    again = generation.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    assert first == again  # same seed, same samples
    assert before == after  # training's own random stream is untouched by the evaluation
    assert [r["question"] for r in first] == [q for q in dataset["question"] for _ in range(3)]  # problem-major
    assert len({r["completion"] for r in first}) > 1  # sampled, not greedy: a random model's samples differ


def test_score_counts_the_known_cases():
    golds, completions = [g for _, g, _ in CASES], [c for c, _, _ in CASES]
    metrics = gsm8k.score(golds, completions, completion_tokens=[10, 20, 30, 40], truncated=[False] * 3 + [True])
    # strict: case 1 only; lenient: 1 and 2 (\boxed); format: 1 and 3 have '#### N'; tokens: the mean of 10..40;
    # one of four was cut off at the token limit.
    assert metrics == {
        "n": 4,
        "strict_accuracy": 0.25,
        "lenient_accuracy": 0.5,
        "format_rate": 0.5,
        "mean_completion_tokens": 25.0,
        "truncated_rate": 0.25,
        "padded_rate": 0.0,
        # lm-eval: the first '####' (case 1), the last number (cases 1 and 2: "18" of "\\boxed{18}").
        "lm_eval_strict_match": 0.25,
        "lm_eval_flexible_extract": 0.5,
        # Wilson, 1 of 4: centre (0.25 + 0.4802) / 1.9604 = 0.3725, half 0.9998 * sqrt(0.0469 + 0.0600) = 0.3269;
        # 2 of 4: centre 0.5, half 0.9998 * sqrt(0.0625 + 0.0600) = 0.3500.
        "strict_accuracy_ci95": [0.0456, 0.6994],
        "lenient_accuracy_ci95": [0.15, 0.85],
        "lm_eval_strict_match_ci95": [0.0456, 0.6994],
        "lm_eval_flexible_extract_ci95": [0.15, 0.85],
    }
    assert tuple(metrics)[: len(gsm8k.KEYS)] == gsm8k.KEYS  # the JSON file's keys, in this order


def test_lm_eval_strict_reads_the_first_answer_line_where_ours_gives_a_second_no_credit():
    texts = ("#### 72\n#### 73", "#### 73\n#### 72")  # a second '#### N' pads past the answer (grading.pads_answer)
    metrics = gsm8k.score(["72", "72"], list(texts))
    assert (metrics["strict_accuracy"], metrics["lm_eval_strict_match"]) == (0.0, 0.5)
    per_problem = [gsm8k.grade(c, "72") for c in texts]
    assert [(g["strict_correct"], g["lm_eval_strict"]) for g in per_problem] == [(False, True), (False, False)]


def test_score_compares_by_value_not_by_text():
    # "1,080", "1080.00" and "$1080" are all 1080 (grading.answers_match compares Decimals): three right of three.
    metrics = gsm8k.score(["1080"] * 3, ["#### 1,080", "#### 1080.00", "The answer is $1080."])
    assert (metrics["strict_accuracy"], metrics["lenient_accuracy"]) == (0.6667, 1.0)


def test_score_of_nothing_is_zero_not_an_error():
    intervals = {key + gsm8k.INTERVAL: [0.0, 1.0] for key in gsm8k.ACCURACIES}  # no problems: no information
    assert gsm8k.score([], []) == dict.fromkeys(gsm8k.KEYS, 0) | {"n": 0} | intervals


@pytest.mark.gsm8k
def test_gsm8k_test_solutions_score_full_marks_and_boxed_ones_only_lenient():
    # The trap: a model writing \boxed{} scores 0 on a '####'-only extractor. The gold solutions themselves
    # must score 100% both ways; the same solutions ending in \boxed{N} instead are 100% lenient, 0% strict.
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K is not at {GSM8K_DIR}")

    rows = [json.loads(line) for line in (GSM8K_DIR / "test.jsonl").read_text().splitlines()]
    golds = [grading.extract_hash_answer(r["answer"]) for r in rows]
    boxed = [
        r["answer"].rsplit("####", 1)[0] + f"So the answer is \\boxed{{{g}}}."
        for r, g in zip(rows, golds, strict=True)
    ]

    def shares(m):
        return m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"]

    assert shares(gsm8k.score(golds, [r["answer"] for r in rows])) == (1319, 1.0, 1.0, 1.0)
    assert shares(gsm8k.score(golds, boxed)) == (1319, 0.0, 1.0, 0.0)


def problems(n):
    """A dataset like gsm8k.load's: question i has gold answer str(i)."""
    import datasets

    questions = [f"What is {i} plus zero?" for i in range(n)]
    return datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q in questions],
            "answer": [str(i) for i in range(n)],
            "question": questions,
        }
    )


class StubGenerator:
    """Fixed outputs: right in '####' format for even i, right but boxed for i % 3 == 1, wrong otherwise."""

    def __init__(self):
        self.batches = []

    def __call__(self, prompts):
        self.batches.append(len(prompts))
        out = []
        for prompt in prompts:
            i = int(prompt[-1]["content"].split()[2])
            text = f"#### {i}" if i % 2 == 0 else f"\\boxed{{{i}}}" if i % 3 == 1 else "#### -1"
            out.append((text, i + 1, i == 6))  # the last one was cut off at the token limit
        return out


def test_evaluate_with_a_stub_generator():
    stub = StubGenerator()
    metrics, predictions = evaluation.evaluate(problems(7), stub, batch_size=3)
    assert stub.batches == [3, 3, 1]  # 7 problems in batches of at most 3
    # i = 0..6. Strict (the even i): 0, 2, 4 -> 3/7 (6 was cut off: no credit). Lenient adds the boxed i = 1 -> 4/7.
    # Format ('####'): 0, 2, 4 plus the wrong "#### -1" for i = 3 and 5 -> 5/7. Tokens: mean of 1..7 = 4.
    assert {k: metrics[k] for k in gsm8k.KEYS} == {
        "n": 7,
        "strict_accuracy": 0.4286,
        "lenient_accuracy": 0.5714,
        "format_rate": 0.7143,
        "mean_completion_tokens": 4.0,
        "truncated_rate": 0.1429,
        "padded_rate": 0.0,
        "lm_eval_strict_match": 0.5714,  # the same four '#### i'
        "lm_eval_flexible_extract": 0.7143,  # and the last number of "\\boxed{1}"
    }
    assert predictions[3] == {
        "question": "What is 3 plus zero?",
        "gold": "3",
        "completion": "#### -1",
        "completion_tokens": 4,
        "truncated": False,
        "extracted": "-1",
        "correct": False,
        "strict_correct": False,
        "formatted": True,
        "padded": False,
        "lm_eval_strict": False,
        "lm_eval_flexible": False,
    }
    assert [p["gold"] for p in predictions] == [str(i) for i in range(7)]  # in dataset order


def test_a_generator_that_drops_completions_is_an_error():
    with pytest.raises(RuntimeError, match="returned 1 completions for 2"):
        generation.generate_all(problems(2), lambda prompts: [("#### 0", 1, False)], batch_size=2)


def test_report_writes_the_files_and_the_tensorboard_scalars(tmp_path, capsys):
    metrics = gsm8k.score(["18"] * 4, [c for c, _, _ in CASES], [1, 2, 3, 4])
    predictions = [{"question": "q", "gold": "18", "completion": c} for c, _, _ in CASES]
    settings = {"SYSTEM_PROMPT": "Be exact.", "MAX_COMPLETION_LENGTH": 24}
    evaluation.report(metrics, predictions, tmp_path, "eval_test", tmp_path / "runs" / "x", 7, settings=settings)

    assert json.loads((tmp_path / "eval_test.json").read_text()) == {**metrics, "step": 7, "settings": settings}
    lines = (tmp_path / "eval_test_predictions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == predictions
    # 0.25 and 0.5 are exact in float32, the scalars' storage type.
    assert read_scalars(tmp_path / "runs" / "x") == {
        "eval/gsm8k_strict_accuracy": [(7, 0.25)],
        "eval/gsm8k_lenient_accuracy": [(7, 0.5)],
        "eval/gsm8k_format_rate": [(7, 0.5)],
    }
    assert "strict_accuracy" in capsys.readouterr().out  # the table is printed


# ---------------------------------------------------------------------------------------------------------------
# Two evaluations of the same problems


def verdicts(questions, lenient, strict=None):
    """Prediction records as `results` writes them, with only what the paired test reads."""
    strict = lenient if strict is None else strict
    return [
        {"question": q, "correct": bool(c), "strict_correct": bool(s)}
        for q, c, s in zip(questions, lenient, strict, strict=True)
    ]


QUESTIONS = [f"Problem {i}: how many?" for i in range(8)]


def test_compare_counts_the_flips_and_tests_them_exactly():
    # Lenient: 5 up (0..4), 0 down: p = 2 * (1/2)^5 = 0.0625. Strict: 1 up (5), 2 down (6, 7): p = 2 * P[X <= 1]
    # of binomial(3, 1/2) = 2 * 4/8 = 1.
    before = verdicts(QUESTIONS, [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1])
    after = verdicts(QUESTIONS, [1, 1, 1, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1, 0, 0])
    paired = evaluation.compare(before, after, "eval_test_before.json")
    assert paired["baseline"] == "eval_test_before.json"
    assert {k: paired["lenient"][k] for k in ("n", "up", "down", "both_right", "both_wrong")} == {
        "n": 8,
        "up": 5,
        "down": 0,
        "both_right": 2,
        "both_wrong": 1,
    }
    assert paired["lenient"]["p_value"] == 0.0625
    assert (paired["strict"]["up"], paired["strict"]["down"], paired["strict"]["p_value"]) == (1, 2, 1.0)


def with_samples(records, counts):
    return [{**r, "sampled_correct": c} for r, c in zip(records, counts, strict=True)]


def test_compare_pairs_sampled_accuracy_when_both_drew_as_many_samples():
    # 2 samples per problem. Up: 0 (0 -> 2), 1 (0 -> 1), 2 (1 -> 2), 3 (0 -> 2), 4 (0 -> 1); down: none. p = 2/32
    before = with_samples(verdicts(QUESTIONS, [0] * 8), [0, 0, 1, 0, 0, 2, 1, 0])
    after = with_samples(verdicts(QUESTIONS, [0] * 8), [2, 1, 2, 2, 1, 2, 1, 0])
    sampled = evaluation.compare(before, after, "b.json", samples=(2, 2))["sampled"]
    assert (sampled["up"], sampled["down"], sampled["p_value"]) == (5, 0, 0.0625)
    assert (sampled["before"], sampled["after"]) == (4 / 16, 11 / 16)
    assert "sampled: 0.250 -> 0.688 (+0.438; 5 up / 0 down, p = 0.062)" in evaluation.paired_lines(
        evaluation.compare(before, after, "b.json", samples=(2, 2))
    )
    # other sample counts, none drawn, or records without counts: greedy verdicts only
    for samples in ((2, 4), (0, 0)):
        assert "sampled" not in evaluation.compare(before, after, "b.json", samples=samples)
    assert "sampled" not in evaluation.compare(verdicts(QUESTIONS, [0] * 8), after, "b.json", samples=(2, 2))


def test_a_held_out_point_pairs_with_the_first_problems_of_a_longer_before():
    before = verdicts(QUESTIONS, [0] * 8)
    paired = evaluation.compare(before, verdicts(QUESTIONS[:4], [1] * 4))
    assert paired["lenient"]["n"] == 4 and paired["lenient"]["up"] == 4  # 4 up: p = 2 / 16
    assert paired["lenient"]["p_value"] == 0.125


@pytest.mark.parametrize(
    "after",
    [
        verdicts(QUESTIONS[1:5], [1] * 4),  # other problems
        verdicts(QUESTIONS[::-1], [1] * 8),  # the same ones in another order
        verdicts([*QUESTIONS, "one more"], [1] * 9),  # more problems than the baseline scored
        [],
    ],
)
def test_evaluations_of_other_problems_are_not_paired(after):
    assert evaluation.compare(verdicts(QUESTIONS, [0] * 8), after) is None


def test_flip_lines_name_each_flipped_problem_and_only_those():
    before = verdicts(QUESTIONS[:3], [0, 1, 1], [0, 1, 0])
    after = verdicts(QUESTIONS[:3], [1, 1, 0], [0, 1, 0])
    assert evaluation.flip_lines(before, after) == [
        "#0   strict -     lenient up    Problem 0: how many?",
        "#2   strict -     lenient down  Problem 2: how many?",
    ]


def test_report_writes_the_paired_test_to_the_json_table_and_tensorboard_text(tmp_path, capsys):
    before = verdicts(QUESTIONS, [0] * 8)
    predictions = verdicts(QUESTIONS, [1] * 6 + [0] * 2, [1] * 2 + [0] * 6)
    metrics = {"n": 8, "strict_accuracy": 0.25, "lenient_accuracy": 0.75}
    metrics["paired"] = evaluation.compare(before, predictions, "eval_test_before.json")
    evaluation.report(metrics, predictions, tmp_path, "eval_test_after", tmp_path / "runs" / "x", 5)

    written = json.loads((tmp_path / "eval_test_after.json").read_text())
    assert (written["paired"]["lenient"]["up"], written["paired"]["lenient"]["p_value"]) == (6, 0.03125)  # 2/2^6
    # both tests, as the table prints them and the Text tab shows them
    lines = [
        "paired with eval_test_before.json on 8 problems (exact McNemar test):",
        "strict: 0.000 -> 0.250 (+0.250; 2 up / 0 down, p = 0.5)",
        "lenient: 0.000 -> 0.750 (+0.750; 6 up / 0 down, p = 0.031)",
    ]
    assert capsys.readouterr().out.splitlines()[-3:] == [f"  {line}" for line in lines]
    assert read_texts(tmp_path / "runs" / "x") == {"eval/paired": [(5, "  \n".join(lines))]}


def test_an_evaluation_reads_back_from_its_file_or_folder(tmp_path):
    metrics = gsm8k.score(["1", "2"], ["#### 1", "#### 3"])
    predictions = verdicts(QUESTIONS[:2], [1, 0])
    evaluation.report(metrics, predictions, tmp_path / "run", "eval_test_after")
    for given in (tmp_path / "run", tmp_path / "run" / "eval_test_after.json"):  # a run folder: its EVAL_AFTER
        read, back, path = evaluation.load_evaluation(given)
        assert (read["strict_accuracy"], back, path.name) == (0.5, predictions, "eval_test_after.json")
    evaluation.report(metrics, predictions, tmp_path / "run", "eval_test")
    assert evaluation.load_evaluation(tmp_path / "run")[2].name == "eval_test.json"  # evaluate.py's own comes first


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "no eval_test.json or eval_test_after.json there"),
        ({"eval_test.json": '{"n": 1}'}, "eval_test_predictions.jsonl there"),
        ({"eval_test.json": "not json", "eval_test_predictions.jsonl": ""}, "JSONDecodeError"),
        ({"eval_test.json": '{"n": 1}', "eval_test_predictions.jsonl": ""}, "lacks the metrics"),
        (
            {
                "eval_test.json": '{"n": 2, "strict_accuracy": 0, "lenient_accuracy": 0}',
                "eval_test_predictions.jsonl": '{"question": "q", "correct": false, "strict_correct": false}\n',
            },
            "lacks the metrics or the per-problem verdicts",  # 1 verdict for n = 2
        ),
    ],
)
def test_what_is_not_an_evaluation_is_refused_naming_the_setting(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=f"BASELINE={re.escape(str(tmp_path))}.*{re.escape(message)}"):
        evaluation.load_evaluation(tmp_path)


def test_the_runs_last_line_carries_the_paired_test():
    before = verdicts(QUESTIONS, [0] * 8)
    after = {
        "strict_accuracy": 0.25,
        "n": 8,
        "paired": evaluation.compare(before, verdicts(QUESTIONS, [1] * 8, [1, 1] + [0] * 6)),
    }
    line = evaluation.summary_line(3, 0.0, ({"strict_accuracy": 0.0, "n": 8}, after), now=lambda: 61.0)
    assert line == (
        "finished: 3 steps in 1m01s; GSM8K strict accuracy 0.000 -> 0.250 (+0.250; 2 up / 0 down, p = 0.5), "
        "lenient 0.000 -> 1.000 (+1.000; 8 up / 0 down, p = 0.0078), paired exact test (8 test problems)"
    )


def test_hf_generator_pads_on_the_left_so_batching_does_not_change_greedy_output(tmp_path):
    # Left padding puts every prompt's last token right before the first generated one; with right padding a
    # shorter prompt would continue from pad tokens and its greedy completion would change with its batch.
    from grpo.profiles import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer).eval()
    generate = generation.hf_generator(model, tokenizer, max_new_tokens=8)
    prompts = [[{"role": "user", "content": q}] for q in ("Hi", "What is 12 plus 7 pencils in all, Mia?")]
    together = generate(prompts)
    alone = [generate([p])[0] for p in prompts]
    assert together == alone
    assert all(1 <= n <= 8 and cut == (n == 8) for _, n, cut in together)  # no end-of-turn within 8: cut off


ROW = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


def test_a_hub_dataset_that_cannot_be_reached_stops_before_datasets_tries(monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets must not be asked"))
    with pytest.raises(
        ConfigError, match="DATASET=nobody-here/no-such-data is a Hub id that is not in the local cache"
    ):
        gsm8k.load("nobody-here/no-such-data", "train")


# ---------------------------------------------------------------------------------------------------------------
# huge or odd data


def write_lines(path, lines, newline="\n"):
    path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return str(path)


def test_a_row_far_larger_than_any_gsm8k_problem_is_refused_with_its_line(tmp_path):
    huge = {"question": "x" * (gsm8k.MAX_ROW_CHARS + 1), "answer": "#### 1"}
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW), json.dumps(huge), json.dumps(ROW)])
    # the line's own length: its question plus 36 characters of keys, quotes and answer
    with pytest.raises(ConfigError, match=f"line 2: {gsm8k.MAX_ROW_CHARS + 37} characters, above the bound of 65536"):
        gsm8k.load(path)


def test_every_real_gsm8k_row_is_within_the_bound():
    for split in ("train", "test"):
        lines = Path(f"/work/shared/data/gsm8k/{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert max(map(len, lines)) < gsm8k.MAX_ROW_CHARS / 30  # GSM8K's longest row is 1,744 characters


def test_a_file_that_is_not_utf8_names_dataset(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + '{"question": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(
        ConfigError, match=rf"^DATASET={path} \(train split\): {path} is not UTF-8 text \(line 2, byte"
    ):
        gsm8k.load(str(path))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([json.dumps([ROW, ROW])], "line 1: a list, not an object"),  # a JSON array instead of lines
        (["[", json.dumps(ROW) + ",", "]"], "line 1: not JSON"),  # the same array, pretty-printed
        ([json.dumps({"question": "q", "answer": ["#### 1"]})], "line 1: 'answer' is a list, not text"),
    ],
)
def test_dataset_forms_that_are_not_gsm8k_lines_are_refused_with_the_line(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        gsm8k.load(write_lines(tmp_path / "train.jsonl", lines))


def test_crlf_lines_read_as_lines(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW)] * 3, newline="\r\n")
    assert gsm8k.load(path)["answer"] == ["2", "2", "2"]  # Windows line ends are only line ends


def test_dev_null_holds_no_problems():
    with pytest.raises(ConfigError, match="DATASET=/dev/null points at /dev/null, which is not a regular file"):
        gsm8k.load("/dev/null")  # not a regular file: refused as no dataset, never read forever


FIXTURE = str(gsm8k.FIXTURE)


# --- data ----------------------------------------------------------------------------------------------------------


def test_fixture_maps_to_prompt_and_gold():
    ds = gsm8k.load(FIXTURE, "train", system_prompt="Be exact.")
    assert len(ds) == 32 and set(ds.column_names) == {"prompt", "answer", "solution", "question"}
    first = ds[0]
    assert first["prompt"][0] == {"role": "system", "content": "Be exact."}
    assert first["prompt"][1] == {"role": "user", "content": first["question"]}
    assert first["answer"] == first["solution"] == "19"  # the number after "#### ", under both names
    golds = set(ds["answer"])
    assert "2575" in golds  # "#### 2575" in a row whose working writes 2,575
    assert "-6" in golds  # a negative answer keeps its sign
    assert len(gsm8k.load(FIXTURE, "train", limit=5)) == 5


def test_folder_dataset_reads_split_files(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    assert gsm8k.load(str(tmp_path), "test")["answer"] == ["2"]
    with pytest.raises(ConfigError, match="train.jsonl, which does not exist"):
        gsm8k.load(str(tmp_path), "train")


def test_missing_dataset_file(tmp_path):
    with pytest.raises(ConfigError, match="points at .*nope.jsonl, which does not exist"):
        gsm8k.load(str(tmp_path / "nope.jsonl"))


def test_rows_without_answers_are_counted_and_shown(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"so {i}\n#### {i}"} for i in range(5)]
    rows[1]["answer"] = "forgot the marker, 7"
    rows[3]["answer"] = "#### seven"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"(?s)2 of 5 rows .* e.g. line 2: .*forgot.*; line 4: .*SKIP_BAD_ROWS=True"):
        gsm8k.load(str(bad))
    # the two bad rows are dropped, the rest kept in order
    assert gsm8k.load(str(bad), skip_bad_rows=True)["answer"] == ["0", "2", "4"]


def test_hub_dataset_errors_are_explained(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(gsm8k.hub, "hub_unreachable", lambda *args, **kwargs: None)  # the Hub answers; the load fails
    with pytest.raises(ConfigError, match="(?s)DATASET 'openai/gsm8k' could not be loaded.*local GSM8K-format"):
        gsm8k.load("openai/gsm8k")


def test_limit_counts_usable_rows(tmp_path):
    rows = [{"question": "q0", "answer": "no marker"}] + [{"question": f"q{i}", "answer": f"#### {i}"} for i in (1, 2)]
    path = tmp_path / "some_bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # MAX_SAMPLES=2 gives 2 rows, after dropping the bad one
    assert gsm8k.load(str(path), limit=2, skip_bad_rows=True)["answer"] == ["1", "2"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no problems"),
        (b"\n\n  \n", "holds no problems"),
        (b'{"question": "1+1?", "answer": \n', "line 1: not JSON"),
        (b'{"problem": "1+1?", "solution": "2"}\n', "line 1: 'question' is missing, not text"),
        (b'{"question": null, "answer": "#### 2"}\n', "line 1: 'question' is a NoneType, not text"),
        (b'{"question": "1+1?", "answer": 2}\n', "line 1: 'answer' is a int, not text"),
        (b'{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n', "line 2: a list, not an object"),
        (b'{"question": "caf\xe9", "answer": "#### 2"}\n', "is not UTF-8 text (line 1"),
    ],
)
def test_bad_dataset_content_names_the_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        gsm8k.load(str(path))


def test_a_bom_and_blank_lines_are_tolerated(tmp_path):
    path = tmp_path / "data.jsonl"
    row = json.dumps({"question": "1+1?", "answer": "#### 2"})
    path.write_bytes(("\ufeff" + row + "\n\n  \n" + row + "\n").encode("utf-8"))
    assert gsm8k.load(str(path))["answer"] == ["2", "2"]


@pytest.mark.parametrize("gold", ["#### 1e3", "#### 1 000", "#### 2^10", "#### 1.5.2"])
def test_a_gold_that_does_not_read_as_one_number_is_refused_with_its_line(gold, tmp_path):
    import json

    from grpo import gsm8k
    from grpo.errors import ConfigError

    path = tmp_path / "train.jsonl"
    rows = [{"question": "q", "answer": "#### 5"}, {"question": "q", "answer": f"so\n{gold}"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match="line 2: "):
        gsm8k.load(str(path))
    assert gsm8k.load(str(path), skip_bad_rows=True)["answer"] == ["5"]  # never read as a different number
