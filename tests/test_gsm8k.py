"""Tests of grpo/gsm8k.py: the task's data (load and its refusals, the gold number of an answer, GSM8K's known sizes)
and its scoring (grade, summarize, sampled accuracy).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_gsm8k.py -q -m "not slow"

The gsm8k-marked tests read ../shared/data/gsm8k beside the checkout and skip when it is not there.
"""

import json
import re

import pytest
from conftest import GSM8K_DIR
from test_grading import CASES  # the same known grades, scored here as metrics

from grpo import grading, gsm8k
from grpo.errors import ConfigError

FIXTURE = str(gsm8k.FIXTURE)
ROW = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


def write_lines(path, lines, newline="\n"):
    """`lines` as a UTF-8 file, each ended by `newline`; the path as a str (DATASET's form)."""
    path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return str(path)


def needs_gsm8k(split):
    if not (GSM8K_DIR / f"{split}.jsonl").is_file():
        pytest.skip(f"GSM8K is not at {GSM8K_DIR}")
    return GSM8K_DIR / f"{split}.jsonl"


def test_make_prompt_puts_the_system_prompt_first_or_folds_it_into_the_user_turn():
    # moved from make_prompt's docstring
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}
    assert gsm8k.make_prompt("1+1?", "Be brief.") == [system, user]
    assert gsm8k.make_prompt("1+1?", "Be brief.", fold=True) == [{"role": "user", "content": "Be brief.\n\n1+1?"}]


# ---------------------------------------------------------------------------------------------------------------
# load: a local file


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


def test_dev_null_holds_no_problems():
    with pytest.raises(ConfigError, match="DATASET=/dev/null points at /dev/null, which is not a regular file"):
        gsm8k.load("/dev/null")  # not a regular file: refused as no dataset, never read forever


def test_rows_without_answers_are_counted_and_shown(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"so {i}\n#### {i}"} for i in range(5)]
    rows[1]["answer"] = "forgot the marker, 7"
    rows[3]["answer"] = "#### seven"
    bad = write_lines(tmp_path / "bad.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(ConfigError, match=r"(?s)2 of 5 rows .* e.g. line 2: .*forgot.*; line 4: .*SKIP_BAD_ROWS=True"):
        gsm8k.load(bad)
    # the two bad rows are dropped, the rest kept in order
    assert gsm8k.load(bad, skip_bad_rows=True)["answer"] == ["0", "2", "4"]


def test_limit_counts_usable_rows(tmp_path):
    rows = [{"question": "q0", "answer": "no marker"}] + [{"question": f"q{i}", "answer": f"#### {i}"} for i in (1, 2)]
    path = write_lines(tmp_path / "some_bad.jsonl", [json.dumps(r) for r in rows])
    # MAX_SAMPLES=2 gives 2 rows, after dropping the bad one
    assert gsm8k.load(path, limit=2, skip_bad_rows=True)["answer"] == ["1", "2"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no problems"),
        (b"\n\n  \n", "holds no problems"),
        (b'{"question": "1+1?", "answer": \n', "line 1: not JSON"),
        (b'{"problem": "1+1?", "solution": "2"}\n', "line 1: 'question' is missing, not text"),
        (b'{"question": null, "answer": "#### 2"}\n', "line 1: 'question' is a NoneType, not text"),
        (b'{"question": 7, "answer": "#### 2"}\n', "line 1: 'question' is a int, not text"),  # a number is no problem
        (b'{"question": "1+1?", "answer": true}\n', "line 1: 'answer' is a bool, not text"),  # JSON true is no number
        (b'{"question": "1+1?", "answer": ""}\n', "line 1: 'answer' is empty, not text"),
        (b'{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n', "line 2: a list, not an object"),
        (b'{"question": "caf\xe9", "answer": "#### 2"}\n', "is not UTF-8 text (line 1"),
    ],
)
def test_bad_dataset_content_names_the_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
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


def test_a_file_that_is_not_utf8_names_dataset(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + '{"question": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(
        ConfigError, match=rf"^DATASET={path} \(train split\): {path} is not UTF-8 text \(line 2, byte"
    ):
        gsm8k.load(str(path))


def test_a_row_far_larger_than_any_gsm8k_problem_is_refused_with_its_line(tmp_path):
    huge = {"question": "x" * (gsm8k.MAX_ROW_CHARS + 1), "answer": "#### 1"}
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW), json.dumps(huge), json.dumps(ROW)])
    # the line's own length: its question plus 36 characters of keys, quotes and answer
    with pytest.raises(ConfigError, match=f"line 2: {gsm8k.MAX_ROW_CHARS + 37} characters, above the bound of 65536"):
        gsm8k.load(path)


@pytest.mark.gsm8k
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_real_gsm8k_row_is_within_the_bound(split):
    lines = needs_gsm8k(split).read_text(encoding="utf-8").split("\n")
    assert max(map(len, lines)) < gsm8k.MAX_ROW_CHARS / 30  # GSM8K's longest row is 1,744 characters


def test_crlf_lines_read_as_lines(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW)] * 3, newline="\r\n")
    assert gsm8k.load(path)["answer"] == ["2", "2", "2"]  # Windows line ends are only line ends


def test_a_bom_and_blank_lines_are_tolerated(tmp_path):
    path = tmp_path / "data.jsonl"
    row = json.dumps({"question": "1+1?", "answer": "#### 2"})
    path.write_bytes(("\ufeff" + row + "\n\n  \n" + row + "\n").encode("utf-8"))
    assert gsm8k.load(str(path))["answer"] == ["2", "2"]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_lines_end_at_newline_only(tmp_path, separator):
    # str.splitlines() also splits at U+2028 (LINE SEPARATOR), U+2029 and U+0085 (NEL), which JSON writes raw inside
    # a string (ensure_ascii=False): a row holding one was cut in two and refused as "not JSON"
    question = f"Ann has 3 apples.{separator}She buys 4. How many now?"
    rows = [json.dumps({"question": question, "answer": "#### 7"}, ensure_ascii=False), json.dumps(ROW)]
    rows.append(json.dumps({"question": "q", "answer": "no marker"}))
    path = write_lines(tmp_path / "train.jsonl", rows)
    loaded = gsm8k.load(path, skip_bad_rows=True)
    assert loaded["question"] == [question, ROW["question"]]  # the character is text of its question, kept
    # the third line is still line 3: no line was counted twice
    with pytest.raises(ConfigError, match=r"1 of 3 rows .* e\.g\. line 3: "):
        gsm8k.load(path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('{"question": "Ann has \\ud83c pens", "answer": "#### 2"}', "line 2: 'question' holds U+D83C at character 8"),
        ('{"question": "q", "answer": "#### 2 \\udf4e"}', "line 2: 'answer' holds U+DF4E at character 7"),
    ],
)
def test_a_lone_surrogate_is_named_with_its_line(tmp_path, row, message):
    # JSON's "\ud83c" escape is half of a UTF-16 pair (🍎 is \ud83c\udf4e); Python's json reads it into a str that
    # cannot be encoded, so tokenizing it failed deep inside the tokenizer, naming no row
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW), row, json.dumps(ROW)])
    with pytest.raises(ConfigError, match=re.escape(f"{message}, half of a character pair")):
        gsm8k.load(path)


def test_a_whole_surrogate_pair_is_one_character(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", ['{"question": "Ann has 3 \\ud83c\\udf4e", "answer": "#### 3"}'])
    assert gsm8k.load(path)["question"] == ["Ann has 3 \U0001f34e"]  # the escaped pair is the apple emoji


# ---------------------------------------------------------------------------------------------------------------
# load: QUESTION_FIELD and ANSWER_FIELD


def test_other_columns_and_bare_number_answers_load(tmp_path):
    # a dataset shaped like MATH-style sets: problem / final_answer, the answer a bare number (text or JSON number)
    # or a whole solution ending "#### N"
    rows = [
        {"problem": "3 + 4?", "final_answer": "7"},
        {"problem": "Half of 5?", "final_answer": 2.5},
        {"problem": "10 - 13?", "final_answer": -3},
        {"problem": "1000 * 2?", "final_answer": "1,000 * 2 = 2,000\n#### 2,000"},
        {"problem": "A thousand?", "final_answer": 1000.0},  # JSON 1000.0 is the number 1000
    ]
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(r) for r in rows])
    ds = gsm8k.load(path, question="problem", answer="final_answer", system_prompt="S")
    assert ds["answer"] == ds["solution"] == ["7", "2.5", "-3", "2000", "1000"]
    assert ds["question"] == [r["problem"] for r in rows]
    assert ds["prompt"][0] == [{"role": "system", "content": "S"}, {"role": "user", "content": "3 + 4?"}]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # the default names on a file that uses others: the row's line, the missing key, and the settings to set
        ({}, "line 1: 'question' is missing, not text; line 1: 'answer' is missing, not text"),
        ({"question": "problem", "answer": "solution"}, "line 1: 'solution' is missing, not text"),
    ],
)
def test_a_missing_column_is_named_with_the_settings_that_fix_it(tmp_path, fields, message):
    path = write_lines(tmp_path / "train.jsonl", [json.dumps({"problem": "3 + 4?", "final_answer": "7"})])
    with pytest.raises(ConfigError) as err:
        gsm8k.load(path, **fields)
    assert message in str(err.value)
    assert "(QUESTION_FIELD, ANSWER_FIELD name the keys)" in str(err.value)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [(1e20, None), (float("nan"), None), ("forty", None), ("18 pens", "18"), ("$1,080", "1080")],
)
def test_a_bare_answer_is_read_as_one_number_or_refused(tmp_path, answer, gold):
    # 1e20 is written 1e+20, NaN as NaN: neither reads as one number, so neither is trained on as another
    path = write_lines(tmp_path / "train.jsonl", [json.dumps({"q": "?", "a": answer})])
    if gold is None:
        with pytest.raises(ConfigError, match="1 of 1 rows"):
            gsm8k.load(path, question="q", answer="a")
    else:
        assert gsm8k.load(path, question="q", answer="a")["answer"] == [gold]


def hub_dataset(monkeypatch, columns):
    """datasets.load_dataset answering with an in-memory dataset of `columns`, the Hub reachable."""
    import datasets

    monkeypatch.setattr(gsm8k.hub, "hub_unreachable", lambda *args, **kwargs: None)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: datasets.Dataset.from_dict(columns))


def test_hub_columns_are_chosen_by_the_field_settings(monkeypatch):
    hub_dataset(monkeypatch, {"problem": ["3 + 4?", "2 * 5?"], "final_answer": [7, 10]})
    ds = gsm8k.load("someone/math", question="problem", answer="final_answer")
    assert (ds["question"], ds["answer"]) == (["3 + 4?", "2 * 5?"], ["7", "10"])


def test_a_hub_dataset_without_the_column_names_its_columns_and_the_fix(monkeypatch):
    hub_dataset(monkeypatch, {"problem": ["3 + 4?"], "final_answer": ["7"]})
    with pytest.raises(ConfigError) as err:
        gsm8k.load("someone/math", question="problem")  # ANSWER_FIELD left at "answer"
    assert str(err.value) == (
        "DATASET someone/math has no column 'answer' (its columns: problem, final_answer); set QUESTION_FIELD and "
        "ANSWER_FIELD to the columns holding the problem and its answer."
    )


# ---------------------------------------------------------------------------------------------------------------
# load: the Hub


def offline(monkeypatch, folder):
    """The Hub switched off (HF_HUB_OFFLINE) and both caches empty folders under `folder`."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(folder / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(folder / "datasets"))


def test_a_hub_dataset_that_cannot_be_reached_stops_before_datasets_tries(monkeypatch, tmp_path):
    import datasets

    offline(monkeypatch, tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets must not be asked"))
    with pytest.raises(
        ConfigError, match="DATASET=nobody-here/no-such-data is a Hub id that is not in the local cache"
    ):
        gsm8k.load("nobody-here/no-such-data", "train")


def test_hub_dataset_errors_are_explained(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(gsm8k.hub, "hub_unreachable", lambda *args, **kwargs: None)  # the Hub answers; the load fails
    with pytest.raises(ConfigError, match="(?s)DATASET 'openai/gsm8k' could not be loaded.*local GSM8K-format"):
        gsm8k.load("openai/gsm8k")


@pytest.mark.parametrize(
    ("dataset", "config", "cached", "sizes"),
    [
        ("openai/gsm8k", "main", False, (7473, 1319)),  # offline, not cached: GSM8K's known sizes
        ("openai/gsm8k", "socratic", False, (7473, 1319)),  # the other config has the same problems
        ("openai/gsm8k", "main", True, None),  # a cached copy can be read: the dataset itself is counted
        ("openai/gsm8k", "other", False, None),  # a config whose sizes are not known
        ("someone/gsm8k-copy", "main", False, None),  # another dataset: never guessed
    ],
)
def test_known_sizes_only_when_the_hub_cannot_be_reached(monkeypatch, tmp_path, dataset, config, cached, sizes):
    offline(monkeypatch, tmp_path)
    if cached:
        (tmp_path / "datasets" / dataset.replace("/", "___")).mkdir(parents=True)  # where datasets keeps its copy
    assert gsm8k.known_sizes(dataset, config) == sizes


def test_known_sizes_are_not_used_when_the_hub_answers(monkeypatch):
    monkeypatch.setattr(gsm8k.hub, "hub_unreachable", lambda *args, **kwargs: None)
    assert gsm8k.known_sizes("openai/gsm8k", "main") is None


@pytest.mark.gsm8k
def test_the_known_sizes_are_gsm8ks():
    # the numbers a --plan uses offline are the real splits' row counts
    sizes = tuple(len(needs_gsm8k(split).read_text(encoding="utf-8").splitlines()) for split in ("train", "test"))
    assert sizes == gsm8k.KNOWN_SIZES["openai/gsm8k"]


# ---------------------------------------------------------------------------------------------------------------
# gold_answer


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("3 * 6 = 18\n#### 18", "18"),
        ("#### 1,080", "1080"),  # a comma groups thousands
        ("#### $1,000", "1000"),
        ("#### 12,345,678", "12345678"),
        ("#### -1,080", "-1080"),
        ("#### $1,000.50", "1000.5"),
        ("#### 18 pens", "18"),  # units may follow
        ("18", "18"),  # a bare number, as text or as JSON's number
        (2.5, "2.5"),
        (18, "18"),
        ("#### 2,50", None),  # a comma that groups no thousands: 250? 2.50? refused, not read as 2 or 250
        ("#### 1,0000", None),
        ("#### 25,0", None),
        ("#### 1e3", None),  # more digits after the number read
        ("#### 1 000", None),
        ("#### 2^10", None),
        ("#### 1.5.2", None),
        ("#### seven", None),
        ("no marker, 7", None),
    ],
)
def test_gold_answer(answer, gold):
    assert gsm8k.gold_answer(answer) == gold


@pytest.mark.parametrize("gold", ["#### 1e3", "#### 1 000", "#### 2^10", "#### 1.5.2", "#### 2,50"])
def test_a_gold_that_does_not_read_as_one_number_is_refused_with_its_line(gold, tmp_path):
    rows = [{"question": "q", "answer": "#### 5"}, {"question": "q", "answer": f"so\n{gold}"}]
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(ConfigError, match=f"1 of 2 rows .* e.g. line 2: .*{re.escape(repr(gold)[1:-1])}"):
        gsm8k.load(path)
    assert gsm8k.load(path, skip_bad_rows=True)["answer"] == ["5"]  # never read as a different number


@pytest.mark.gsm8k
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_real_gsm8k_answer_reads_as_the_grader_reads_it(split):
    # the stricter gold rules (thousands, one number) refuse no row of the real data, and read each as the grader
    answers = [json.loads(line)["answer"] for line in needs_gsm8k(split).read_text(encoding="utf-8").splitlines()]
    assert [gsm8k.gold_answer(a) for a in answers] == [grading.extract_hash_answer(a) for a in answers]
    assert None not in map(gsm8k.gold_answer, answers)


# ---------------------------------------------------------------------------------------------------------------
# scoring


def score(golds, completions, completion_tokens=None, truncated=None):
    """The metrics of completions against their golds, as evaluation.results makes them: summarize of grade."""
    truncated = truncated or [False] * len(completions)
    graded = [gsm8k.grade(c, g, truncated=t) for c, g, t in zip(completions, golds, truncated, strict=True)]
    return gsm8k.summarize(graded, completion_tokens or [0] * len(graded))


def test_score_counts_the_known_cases():
    golds, completions = [g for _, g, _ in CASES], [c for c, _, _ in CASES]
    metrics = score(golds, completions, completion_tokens=[10, 20, 30, 40], truncated=[False] * 3 + [True])
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


def test_score_rounds_shares_to_four_decimals():
    # moved from score's docstring
    m = score(["18", "5", "7"], ["#### 18", "The answer is 5.", "#### 8"], [4, 6, 2])
    assert (m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"]) == (3, 0.3333, 0.6667, 0.6667)
    assert m["mean_completion_tokens"] == 4.0 and m["lm_eval_flexible_extract"] == 0.6667
    assert m["strict_accuracy_ci95"] == [0.0615, 0.7923]


def test_grade_adds_lm_evals_verdicts():
    # moved from grade's docstring: the last #### is the answer (padded); lm-eval's strict reads the first
    v = gsm8k.grade("#### 18\n#### 19", "19")
    assert (v["strict_correct"], v["padded"], v["lm_eval_strict"], v["lm_eval_flexible"]) == (True, True, False, True)


def test_lm_eval_strict_reads_the_first_answer_line_where_ours_reads_the_last():
    texts = ("#### 72\n#### 73", "#### 73\n#### 72")  # two '#### N': ours reads the last (padded), lm-eval the first
    metrics = score(["72", "72"], list(texts))
    assert (metrics["strict_accuracy"], metrics["lm_eval_strict_match"]) == (0.5, 0.5)
    per_problem = [gsm8k.grade(c, "72") for c in texts]
    assert [(g["strict_correct"], g["lm_eval_strict"]) for g in per_problem] == [(False, True), (True, False)]
    assert all(g["padded"] for g in per_problem) and metrics["padded_rate"] == 1.0


def test_score_compares_by_value_not_by_text():
    # "1,080", "1080.00" and "$1080" are all 1080 (grading.answers_match compares Decimals): three right of three.
    metrics = score(["1080"] * 3, ["#### 1,080", "#### 1080.00", "The answer is $1080."])
    assert (metrics["strict_accuracy"], metrics["lenient_accuracy"]) == (0.6667, 1.0)


def test_the_wilson_interval_as_a_rounded_list():
    # moved from interval's docstring
    assert (gsm8k.interval(5, 10), gsm8k.interval(0, 0)) == ([0.2366, 0.7634], [0.0, 1.0])


def test_score_of_nothing_is_zero_not_an_error():
    intervals = {key + gsm8k.INTERVAL: [0.0, 1.0] for key in gsm8k.ACCURACIES}  # no problems: no information
    assert score([], []) == dict.fromkeys(gsm8k.KEYS, 0) | {"n": 0} | intervals


@pytest.mark.gsm8k
def test_gsm8k_test_solutions_score_full_marks_and_boxed_ones_only_lenient():
    # The trap: a model writing \boxed{} scores 0 on a '####'-only extractor. The gold solutions themselves
    # must score 100% both ways; the same solutions ending in \boxed{N} instead are 100% lenient, 0% strict.
    rows = [json.loads(line) for line in needs_gsm8k("test").read_text().splitlines()]
    golds = [grading.extract_hash_answer(r["answer"]) for r in rows]
    boxed = [
        r["answer"].rsplit("####", 1)[0] + f"So the answer is \\boxed{{{g}}}."
        for r, g in zip(rows, golds, strict=True)
    ]

    def shares(m):
        return m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"]

    assert shares(score(golds, [r["answer"] for r in rows])) == (1319, 1.0, 1.0, 1.0)
    assert shares(score(golds, boxed)) == (1319, 0.0, 1.0, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# sampled accuracy


def sampled_metrics(golds, completions, samples, temperature):
    """The sampled-accuracy metrics as evaluation.results makes them: sampled_summary of sampled_counts."""
    return gsm8k.sampled_summary(gsm8k.sampled_counts(golds, completions, samples), samples, temperature)


@pytest.mark.parametrize(
    ("completions", "samples", "accuracy", "strict"),
    [
        (["#### 3", "#### 3", "#### 5", "#### 5"], 2, 0.5, 0.5),  # problem 0 always right, problem 1 never
        (["#### 3", "The answer is 3.", "#### 5", "#### 4"], 2, 0.75, 0.5),  # the phrase counts only lenient
        (["#### 3", "#### 9", "#### 9", "#### 4", "#### 4", "#### 4"], 3, 2 / 3, 2 / 3),  # 1/3 and 3/3 -> 2/3
    ],
)
def test_sampled_accuracy_is_the_mean_per_problem_share_of_correct_samples(completions, samples, accuracy, strict):
    metrics = sampled_metrics(["3", "4"], completions, samples, 0.7)
    assert {
        k: metrics[k] for k in ("samples", "sample_temperature", "sampled_accuracy", "sampled_strict_accuracy")
    } == {
        "samples": samples,
        "sample_temperature": 0.7,
        "sampled_accuracy": round(accuracy, 4),
        "sampled_strict_accuracy": round(strict, 4),
    }


def test_sampled_metrics_of_two_samples_per_problem():
    # moved from the docstring of sampled_metrics (now sampled_summary of sampled_counts)
    m = sampled_metrics(["18", "5"], ["#### 18", "The answer is 18.", "#### 4", "#### 5"], 2, 1.0)
    assert (m["sampled_accuracy"], m["sampled_strict_accuracy"]) == (0.75, 0.5)
    assert (m["pass_at_k"], m["sampled_accuracy_ci95"]) == ({"1": 0.75, "2": 1.0}, [0.1979, 0.9733])


def test_sampled_counts_count_each_problems_right_samples():
    # moved from sampled_counts's docstring
    counts = gsm8k.sampled_counts(["3"], ["#### 3", "The answer is 3.", "#### 4"], 3)
    assert counts == [{"correct": 2, "strict_correct": 1}]


def test_pass_at_k_and_the_sampled_interval_follow_their_formulas():
    # Problem 0 is right in 1 of 3 samples, problem 1 in all 3. pass@k = 1 - C(n-c, k) / C(n, k) per problem:
    # k=1: 1/3 and 1 -> 2/3; k=2: 1 - C(2,2)/C(3,2) = 2/3 and 1 -> 5/6; k=3: 1 and 1 -> 1.
    completions = ["#### 3", "#### 9", "#### 9", "#### 4", "#### 4", "#### 4"]
    metrics = sampled_metrics(["3", "4"], completions, 3, 0.7)
    assert metrics["pass_at_k"] == {"1": 0.6667, "2": 0.8333, "3": 1.0}
    # Wilson over the 2 problems with 4/3 expected right: p = 2/3, z^2 = 3.841459, 1 + z^2/n = 2.920729,
    # centre (0.666667 + 0.960365) / 2.920729 = 0.557065, half 0.671054 * sqrt(0.111111 + 0.240091) = 0.397683.
    assert metrics["sampled_accuracy_ci95"] == [0.1594, 0.9547]


def test_sampled_counts_refuse_a_wrong_number_of_completions():
    with pytest.raises(ValueError, match="3 completions for 2 problems x 2 samples"):
        gsm8k.sampled_counts(["1", "2"], ["#### 1"] * 3, 2)
