"""Tests of grpo/evaluation.py: scoring a generator's completions (evaluate, results), the result files (report),
the trackers of REPORT_TO (to_trackers), the paired comparison of two evaluations (compare, flip_lines), reading an
evaluation back (load_evaluation), the run's last line (summary_line) and the held-out points' record.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_evaluation.py -q -m "not slow"
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_evaluation.py -q -m slow   # W&B offline, trackio local
"""

import json
import re
from types import SimpleNamespace

import pytest
from conftest import read_scalars, read_texts, run_script
from test_grading import CASES  # the same known grades, scored here as metrics
from test_gsm8k import score

from grpo import evaluation, gsm8k, process, stats
from grpo.errors import ConfigError

TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7"  # shaped like a Hugging Face access token; no real one


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


# ---------------------------------------------------------------------------------------------------------------
# evaluate


def test_evaluate_with_a_stub_generator():
    stub = StubGenerator()
    metrics, predictions = evaluation.evaluate(problems(7), stub, batch_size=3)
    assert stub.batches == [3, 3, 1]  # 7 problems in batches of at most 3
    # i = 0..6. Strict (the even i): 0, 2, 4, 6 -> 4/7 (6 was cut off after its answer: judged by it). Lenient adds
    # the boxed i = 1 -> 5/7. Format ('####'): 0, 2, 4, 6 plus the wrong "#### -1" for i = 3 and 5 -> 6/7. Tokens: 4.
    assert {k: metrics[k] for k in gsm8k.KEYS} == {
        "n": 7,
        "strict_accuracy": 0.5714,
        "lenient_accuracy": 0.7143,
        "format_rate": 0.8571,
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


# ---------------------------------------------------------------------------------------------------------------
# report and to_trackers


def test_report_writes_the_files_and_prints_the_table(tmp_path, capsys):
    metrics = score(["18"] * 4, [c for c, _, _ in CASES], [1, 2, 3, 4])
    predictions = [{"question": "q", "gold": "18", "completion": c} for c, _, _ in CASES]
    settings = {"SYSTEM_PROMPT": "Be exact.", "MAX_COMPLETION_LENGTH": 24}
    evaluation.report(metrics, predictions, tmp_path, "eval_test", 7, settings=settings)

    assert json.loads((tmp_path / "eval_test.json").read_text()) == {**metrics, "step": 7, "settings": settings}
    lines = (tmp_path / "eval_test_predictions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == predictions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_test.json", "eval_test_predictions.jsonl"]  # no run
    assert "strict_accuracy" in capsys.readouterr().out  # the table is printed


def test_the_table_aligns_each_accuracy_with_its_interval():
    # moved from format_table's docstring
    table = evaluation.format_table({"n": 10, "strict_accuracy": 0.5, "strict_accuracy_ci95": [0.2366, 0.7634]}, "T")
    assert table.splitlines() == [
        "T",
        "  n                                             10",
        "  strict_accuracy             0.500 [0.237, 0.763]",
    ]


def test_report_writes_no_credential(tmp_path):
    # a run's settings may carry a token (a GRPOConfig field given on the command line, a URL with a login)
    settings = {
        "grpo_config": {"model_init_kwargs": {"token": "a-private-token", "revision": "main"}},
        "VLLM_SERVER_BASE_URL": "http://me:secret@host:8000",
        "SYSTEM_PROMPT": f"my key is {TOKEN}",
    }
    evaluation.report({"n": 0}, [], tmp_path, "eval_test", settings=settings)
    written = json.loads((tmp_path / "eval_test.json").read_text())["settings"]
    assert written == {
        "grpo_config": {"model_init_kwargs": {"token": "<redacted>", "revision": "main"}},  # the rest kept
        "VLLM_SERVER_BASE_URL": "http://<redacted>@host:8000",
        "SYSTEM_PROMPT": "my key is <redacted>",
    }


def test_report_writes_the_paired_test_to_the_json_and_the_table(tmp_path, capsys):
    before = verdicts(QUESTIONS, [0] * 8)
    predictions = verdicts(QUESTIONS, [1] * 6 + [0] * 2, [1] * 2 + [0] * 6)
    metrics = {"n": 8, "strict_accuracy": 0.25, "lenient_accuracy": 0.75}
    metrics["paired"] = evaluation.compare(before, predictions, "eval_test_before.json")
    evaluation.report(metrics, predictions, tmp_path, "eval_test_after", 5)

    written = json.loads((tmp_path / "eval_test_after.json").read_text())
    assert (written["paired"]["lenient"]["up"], written["paired"]["lenient"]["p_value"]) == (6, 0.03125)  # 2/2^6
    assert capsys.readouterr().out.splitlines()[-3:] == [f"  {line}" for line in PAIRED_LINES]


# the paired test of report's test above, as the table prints it and the Text tab shows it
PAIRED_LINES = [
    "paired with eval_test_before.json on 8 problems (exact McNemar test):",
    "strict: 0.000 -> 0.250 (+0.250; 2 up / 0 down, p = 0.5)",
    "lenient: 0.000 -> 0.750 (+0.750; 6 up / 0 down, p = 0.031)",
]


def tracker_settings(tmp_path, report_to):
    return {"REPORT_TO": report_to, "OUTPUT_DIR": str(tmp_path / "out"), "SYSTEM_PROMPT": "Be exact."}


def to_trackers(metrics, s, *args):
    """As evaluate.py calls it: its REPORT_TO and OUTPUT_DIR."""
    evaluation.to_trackers(metrics, s, *args, report_to=s["REPORT_TO"], out=s["OUTPUT_DIR"])


def paired_metrics():
    predictions = verdicts(QUESTIONS, [1] * 6 + [0] * 2, [1] * 2 + [0] * 6)
    metrics = {**gsm8k.summarize(predictions, [1] * 8), "format_rate": 0.75}
    return metrics | {"paired": evaluation.compare(verdicts(QUESTIONS, [0] * 8), predictions, "eval_test_before.json")}


def test_tensorboard_gets_a_run_of_its_own_with_the_scalars_and_the_paired_test(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    to_trackers(paired_metrics(), tracker_settings(tmp_path, "tensorboard"), "eval_test", 7, "m + a")
    (run,) = (tmp_path / "out" / "runs").iterdir()
    assert run.name.endswith("_eval-test")  # beside training's runs, told apart by its name
    # 0.25, 0.75 are exact in float32, the scalars' storage type; no sampled accuracy was measured
    assert read_scalars(run) == {
        "eval/gsm8k_strict_accuracy": [(7, 0.25)],
        "eval/gsm8k_lenient_accuracy": [(7, 0.75)],
        "eval/gsm8k_format_rate": [(7, 0.75)],
        "eval/gsm8k_padded_rate": [(7, 0.0)],
    }
    assert read_texts(run) == {"eval/paired": [(7, "  \n".join(PAIRED_LINES))]}  # markdown: two spaces end a line


def test_a_second_evaluation_is_a_second_tensorboard_run_in_the_chosen_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # where a training run's events went
    s = tracker_settings(tmp_path, "tensorboard")
    to_trackers({"strict_accuracy": 0.5}, s, "eval_test", 0, "m")
    to_trackers({"strict_accuracy": 0.25}, s, "eval_gsm8k-94056f14_test", 0, "m")
    runs = sorted((tmp_path / "tb" / "runs").iterdir(), key=lambda run: run.stat().st_mtime)
    assert len(runs) == 2  # <date>_<host>_eval-<stem>: one run per result stem
    assert runs[0].name.endswith("_eval-test") and runs[1].name.endswith("_eval-gsm8k-94056f14_test")
    assert [read_scalars(r)["eval/gsm8k_strict_accuracy"] for r in runs] == [[(0, 0.5)], [(0, 0.25)]]  # its own
    assert not (tmp_path / "out").exists()  # nothing under OUTPUT_DIR/runs


def test_report_to_none_writes_no_tracker_run(tmp_path):
    to_trackers(paired_metrics(), tracker_settings(tmp_path, "none"), "eval_test", 7, "m")
    assert not (tmp_path / "out").exists()


TO_TRACKERS = """
import json, sys
from grpo import evaluation

metrics, s = json.loads(open(sys.argv[1]).read())  # from a file: W&B records the command line itself
evaluation.to_trackers(metrics, s, "eval_test", 7, "tiny + run", report_to=s["REPORT_TO"], out=s["OUTPUT_DIR"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["wandb", "trackio"])
def test_wandb_and_trackio_get_the_scalars_and_no_credential(tmp_path, tracker):
    # W&B offline and trackio local, in a Python of their own (each reads its folders once, at import); their files
    # hold the settings as the run's config: its prompt, and never the token in it
    pytest.importorskip(tracker, reason=f"{tracker} is optional: pip install -r requirements-trackers.txt")
    folders = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "TRACKIO_DIR")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **{name: str(tmp_path) for name in folders}}
    s = {**tracker_settings(tmp_path, tracker), "SYSTEM_PROMPT": f"Answer plainly; key {TOKEN}"}
    given = tmp_path / "given.json"
    given.write_text(json.dumps([paired_metrics(), s]))
    out = run_script("-c", TO_TRACKERS, str(given), env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != given)
    assert b"Answer plainly" in written  # the settings were recorded ...
    assert TOKEN.encode() not in written  # ... without the credential
    if tracker == "wandb":
        from test_e2e_train import wandb_records

        (run_file,) = tmp_path.glob("out/wandb/offline-run-*/run-*.wandb")  # in OUTPUT_DIR, as evaluate.py asks
        items = [
            {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            for record in wandb_records(run_file)
            if record.HasField("history")
        ]
        assert [json.loads(i["eval/gsm8k_lenient_accuracy"]) for i in items if "eval/gsm8k_lenient_accuracy" in i] == [
            0.75
        ]
    else:
        code = (
            "import json; from trackio.sqlite_storage import SQLiteStorage as S; (run,) = S.get_runs('huggingface'); "
            "print(json.dumps([run, S.get_logs('huggingface', run)], default=str))"
        )
        read = run_script("-c", code, env={"TRACKIO_DIR": str(tmp_path)})
        assert read.returncode == 0, read.stderr[-2000:]
        run, logs = json.loads(read.stdout)
        assert run == "eval-test tiny + run"
        assert [(row["step"], row["eval/gsm8k_lenient_accuracy"]) for row in logs] == [(7, 0.75)]  # at the step


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


def test_compare_pairs_the_first_problems_and_refuses_a_reordering():
    # moved from compare's docstring
    before = [{"question": q, "correct": c, "strict_correct": c} for q, c in zip("abc", (0, 0, 1), strict=True)]
    after = [{"question": q, "correct": c, "strict_correct": 0} for q, c in zip("ab", (1, 1), strict=True)]
    paired = evaluation.compare(before, after, "before.json")
    assert (paired["lenient"]["up"], paired["lenient"]["p_value"], paired["strict"]["up"]) == (2, 0.5, 0)
    assert evaluation.compare(before, after[::-1]) is None


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


def test_paired_lines_name_the_baseline_and_each_accuracy():
    # moved from paired_lines's docstring
    lines = evaluation.paired_lines({"baseline": "b.json", "strict": stats.paired([0, 0, 1, 1], [1, 1, 1, 0])})
    assert lines == [
        "paired with b.json on 4 problems (exact McNemar test):",
        "strict: 0.500 -> 0.750 (+0.250; 2 up / 1 down, p = 1)",
    ]


def test_flip_lines_of_one_problem_flipped_up():
    # moved from flip_lines's docstring
    before = [{"question": "How many apples?", "correct": 0, "strict_correct": 0}]
    after = [{"question": "How many apples?", "correct": 1, "strict_correct": 0}]
    assert evaluation.flip_lines(before, after) == ["#0   strict -     lenient up    How many apples?"]


def test_paired_with_before_reads_the_runs_eval_before(tmp_path, capsys):
    process.setup_logging("grpotrainer")  # its warning to this test's stderr, as a run logs it
    before = verdicts(QUESTIONS, [0] * 8)
    assert evaluation.paired_with_before(tmp_path, before) is None  # no EVAL_BEFORE in this run
    evaluation.report(gsm8k.summarize(before, [1] * 8), before, tmp_path, "eval_test_before")
    paired = evaluation.paired_with_before(tmp_path, verdicts(QUESTIONS[:4], [1] * 4))
    assert (paired["baseline"], paired["lenient"]["up"]) == ("eval_test_before.json", 4)
    (tmp_path / "eval_test_before.json").write_text("[]")  # damaged: warned about, and the run goes on
    assert evaluation.paired_with_before(tmp_path, before) is None
    warning = capsys.readouterr().err.splitlines()[-1]
    path = tmp_path / "eval_test_before.json"
    assert warning.startswith(f"[grpotrainer] no paired test: ConfigError: the run's EVAL_BEFORE={path} is not an")


# ---------------------------------------------------------------------------------------------------------------
# reading an evaluation back


def test_an_evaluation_reads_back_from_its_file_or_folder(tmp_path):
    metrics = score(["1", "2"], ["#### 1", "#### 3"])
    predictions = verdicts(QUESTIONS[:2], [1, 0])
    evaluation.report(metrics, predictions, tmp_path / "run", "eval_test_after")
    for given in (tmp_path / "run", tmp_path / "run" / "eval_test_after.json"):  # a run folder: its EVAL_AFTER
        read, back, path = evaluation.load_evaluation(given)
        assert (read["strict_accuracy"], back, path.name) == (0.5, predictions, "eval_test_after.json")
    evaluation.report(metrics, predictions, tmp_path / "run", "eval_test")
    assert evaluation.load_evaluation(tmp_path / "run")[2].name == "eval_test.json"  # evaluate.py's own comes first
    # a folder scored on another DATASET holds eval_<name>-<hash>_<split>.json: evaluate.py asks for that stem first
    evaluation.report(metrics, predictions, tmp_path / "run", "eval_mine-0123abcd_test")
    found = evaluation.load_evaluation(tmp_path / "run", stem="eval_mine-0123abcd_test")[2]
    assert found.name == "eval_mine-0123abcd_test.json"
    assert evaluation.load_evaluation(tmp_path / "run", stem="eval_other-ffffffff_test")[2].name == "eval_test.json"


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


def test_a_baseline_of_other_problems_names_the_first_that_differs(tmp_path):
    predictions = verdicts(QUESTIONS[:3], [1, 0, 1])
    evaluation.report(gsm8k.summarize(predictions, [1] * 3), predictions, tmp_path, "eval_test")
    assert evaluation.load_baseline(tmp_path, "test", QUESTIONS[:3])[1] == predictions  # the same problems
    with pytest.raises(ConfigError) as err:
        evaluation.load_baseline(tmp_path, "test", [*QUESTIONS[:2], "Another one?"])
    assert str(err.value).startswith(
        f"BASELINE={tmp_path / 'eval_test.json'} scored other problems (3 there, 3 here; the first that differs: "
        "#2, 'Problem 2: how many?')."
    )


# ---------------------------------------------------------------------------------------------------------------
# the run's last line, and its held-out points


def test_the_runs_last_line_gives_its_time_and_both_accuracies():
    # moved from summary_line's docstring
    scored = ({"strict_accuracy": 0.25, "n": 64}, {"strict_accuracy": 0.5, "n": 64})
    line = evaluation.summary_line(50, 0.0, scored, now=lambda: 754.0)
    assert line == "finished: 50 steps in 12m34s; GSM8K strict accuracy 0.250 -> 0.500 (64 test problems)"


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


@pytest.mark.parametrize(
    ("dataset", "name"),
    [
        ("openai/gsm8k", "GSM8K"),
        ("data/smoke_gsm8k.jsonl", "smoke_gsm8k.jsonl test"),  # a local file is named as itself, not as GSM8K
        ("/data/my-sums", "my-sums test"),
        ("someone/gsm8k-copy", "gsm8k-copy test"),
    ],
)
def test_the_runs_last_line_names_its_dataset(dataset, name):
    scored = ({"strict_accuracy": 0.25, "n": 4}, {"strict_accuracy": 0.5, "n": 4})
    line = evaluation.summary_line(2, 0.0, scored, dataset=dataset, now=lambda: 5.0)
    assert line == f"finished: 2 steps in 0m05s; {name} strict accuracy 0.250 -> 0.500 (4 test problems)"


def test_the_runs_last_line_without_a_before():
    after = {"strict_accuracy": 0.5, "n": 4}
    assert evaluation.summary_line(2, 0.0, (None, after), now=lambda: 5.0) == (
        "finished: 2 steps in 0m05s; GSM8K strict accuracy after 0.500 (4 test problems)"
    )
    assert evaluation.summary_line(2, 0.0, now=lambda: 5.0) == "finished: 2 steps in 0m05s"


def test_each_held_out_point_is_kept_and_found_by_its_step(tmp_path):
    assert not evaluation.scored(tmp_path, 0)  # no eval_test.jsonl yet
    evaluation.append_eval_point(tmp_path, "before", 0, {"strict_accuracy": 0.25})
    evaluation.append_eval_point(tmp_path, "during", 2, {"strict_accuracy": 0.5})
    rows = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(r["step"], r["when"], r["metrics"]) for r in rows] == [
        (0, "before", {"strict_accuracy": 0.25}),
        (2, "during", {"strict_accuracy": 0.5}),
    ]
    assert [evaluation.scored(tmp_path, step) for step in (0, 1, 2)] == [True, False, True]  # a rerun scores step 1


# held-out points during training: every point kept, which a rerun finds scored, each rank's shard


def test_every_eval_point_is_kept(tmp_path):
    for step in (2, 4, 6):
        evaluation.append_eval_point(tmp_path, "during", step, {"n": 8, "lenient_accuracy": step / 10})
    evaluation.append_eval_point(tmp_path, "after", 6, {"n": 32})
    rows = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(r["step"], r["when"]) for r in rows] == [(2, "during"), (4, "during"), (6, "during"), (6, "after")]
    assert rows[1]["metrics"]["lenient_accuracy"] == 0.4


def test_a_rerun_finds_the_points_already_scored(tmp_path):
    assert not evaluation.scored(tmp_path, 2)  # no file yet: a fresh run
    evaluation.append_eval_point(tmp_path, "before", 0, {"n": 8})
    evaluation.append_eval_point(tmp_path, "during", 2, {"n": 8})
    with open(tmp_path / "eval_test.jsonl", "a") as f:
        f.write("\n")  # a blank line (an editor's, a cut write's) is no point
    assert [step for step in range(5) if evaluation.scored(tmp_path, step)] == [0, 2]


@pytest.mark.parametrize("engine", ["is_deepspeed_enabled", "is_fsdp_enabled"])
def test_outside_training_a_sharded_model_is_not_scored_and_the_adapter_is_named(tmp_path, capsys, engine):
    # a resumed run cut after its last checkpoint scores EVAL_AFTER with no training step: a sharded model cannot
    process.setup_logging("grpotrainer")
    flags = {"is_deepspeed_enabled": False, "is_fsdp_enabled": False, engine: True}
    trainer = SimpleNamespace(**flags, is_in_train=False, args=SimpleNamespace(output_dir=str(tmp_path)))
    assert evaluation.evaluate_trainer(trainer, "after", limit=8, dataset=problems(8), batch_size=4) is None
    assert capsys.readouterr().err.splitlines()[-1] == (
        "[grpotrainer] EVAL_AFTER is skipped: under DeepSpeed/FSDP the model is scored inside training only; "
        f"evaluate the saved adapter: python evaluate.py --ADAPTER={tmp_path}"
    )


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 8, 9])
def test_every_rank_scores_a_shard_of_the_same_length(n, world):
    shards = [evaluation.shard_indices(n, rank, world) for rank in range(world)]
    assert len({len(shard) for shard in shards}) == 1  # the same generate calls on every rank (ZeRO-3, FSDP)
    gathered = [i for shard in shards for i in shard]  # gather_object's order: rank 0's first
    assert gathered[:n] == list(range(n)) and set(gathered[n:]) <= {n - 1}  # each problem once, then padding


def test_five_problems_on_two_ranks():
    # moved from shard_indices's docstring: three in a row each, rank 1's padded with the last problem
    assert [evaluation.shard_indices(5, rank, 2) for rank in range(2)] == [[0, 1, 2], [3, 4, 4]]
