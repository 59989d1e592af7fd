"""The GSM8K task, shared by training and evaluate.py (which import it, never each other, so that an accuracy is
measured with training's own prompt, chat template and grader, grpo/grading.py): prompts, data, scoring. Besides
the README's metrics: format_rate (a readable `#### N`), mean_completion_tokens, truncated_rate, padded_rate (past
the answer: the rewards pay it nothing); sampled_(strict_)accuracy, c/k right of k completions per problem at a
temperature, averaged: its interval errs wide, as a problem's c/k in [0, 1] has a variance of at most p(1-p)."""

import json
import logging
import re
from pathlib import Path

from grpo import errors, grading, hub, stats
from grpo.errors import ConfigError

# The instruction before every problem, the scripts' default
DEFAULT_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, showing each calculation. "
    "Then write the final answer on its own last line as '#### <number>', with no units."
)
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "smoke_gsm8k.jsonl"  # our own 32 problems, for --smoke
KEYS = ("n", "strict_accuracy", "lenient_accuracy", "format_rate", "mean_completion_tokens", "truncated_rate")
KEYS += ("padded_rate", "lm_eval_strict_match", "lm_eval_flexible_extract")
ACCURACIES = {  # metric -> the verdict of one graded completion it counts
    "strict_accuracy": "strict_correct",
    "lenient_accuracy": "correct",
    "lm_eval_strict_match": "lm_eval_strict",
    "lm_eval_flexible_extract": "lm_eval_flexible",
}
RATES = ACCURACIES | {"format_rate": "formatted", "truncated_rate": "truncated", "padded_rate": "padded"}
INTERVAL = "_ci95"  # `<accuracy>_ci95`: its 95 % Wilson interval [low, high]
SCALARS = {
    "strict_accuracy": "eval/gsm8k_strict_accuracy",
    "lenient_accuracy": "eval/gsm8k_lenient_accuracy",
    "format_rate": "eval/gsm8k_format_rate",
    "padded_rate": "eval/gsm8k_padded_rate",
    "sampled_accuracy": "eval/gsm8k_sampled_accuracy",
    "sampled_strict_accuracy": "eval/gsm8k_sampled_strict_accuracy",
}
SAMPLED_KEYS = ("samples", "sample_temperature", "sampled_accuracy", "sampled_strict_accuracy", "pass_at_k")
log = logging.getLogger("grpotrainer.gsm8k")


# The longest row a local dataset may hold: GSM8K's longest line (train and test) is 1,744 characters, so a row 37
# times longer is not a word problem; refused with its line number instead of stalling tokenization for minutes.
MAX_ROW_CHARS = 64 * 1024
# What a gold '#### N' holds: a number, perhaps after $, and then no other digit (units may follow, "#### 18 pens")
THOUSANDS = re.compile(r"[0-9]+|[0-9]{1,3}(?:,[0-9]{3})+")  # 1080 or 1,080: a comma groups thousands
GOLD_NUMBER = re.compile(r"[ \t]*\$?[ \t]*-?[0-9][0-9,]*(?:\.[0-9]+)?(?P<rest>.*)", re.S)


def make_prompt(question, system_prompt=DEFAULT_PROMPT, fold=False):
    """Chat messages for one problem: the system prompt, then the question; with `fold` (for a chat template that
    refuses a system turn, as Gemma's and Mistral's do) one user turn holding both."""
    if fold:
        return [{"role": "user", "content": f"{system_prompt}\n\n{question}" if system_prompt else question}]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def load(dataset, split="train", *, config="main", limit=0, skip_bad_rows=False, system_prompt=DEFAULT_PROMPT,
         question="question", answer="answer", fold=False):  # fmt: skip
    """GSM8K (or a dataset shaped like it: a Hub id, a .jsonl file, or a folder of {split}.jsonl) as a Dataset with
    `prompt`, `question`, and the gold number as `answer` and as `solution` (TRL's own rewards read `solution`).
    `question` and `answer` name its columns; rows without a gold number are an error naming them, or dropped with
    `skip_bad_rows`. `limit` keeps the first N usable rows."""
    fields = (question, answer)  # open-r1's datasets name the answer column "solution"
    if hub.is_local(dataset):
        rows, source = _read_local(dataset, split, fields)
    else:
        rows, source = _read_hub(dataset, config, split, fields)
    golds = [gold_answer(row["answer"]) for row in rows]
    if bad := [i for i, gold in enumerate(golds) if gold is None]:
        shown = "; ".join(f"{rows[i]['line']}: ...{rows[i]['answer'][-40:]!r}" for i in bad[:3])
        if not skip_bad_rows:
            raise ConfigError(
                f"{len(bad)} of {len(rows)} rows of DATASET {source} have no '#### N' answer that reads as one number "
                f"({answer} column), e.g. {shown}.\nFix those rows, or set SKIP_BAD_ROWS=True to train without them."
            )
        log.warning("skipping %d rows without a '#### N' answer (SKIP_BAD_ROWS=True), e.g. %s", len(bad), shown)
    keep = [i for i, gold in enumerate(golds) if gold is not None][: limit or None]
    import datasets

    questions = [rows[i]["question"] for i in keep]
    answers = [golds[i] for i in keep]
    prompts = [make_prompt(q, system_prompt, fold) for q in questions]
    columns = {"prompt": prompts, "answer": answers, "solution": answers, "question": questions}
    return datasets.Dataset.from_dict(columns)


# GSM8K's sizes (train, test) in both its configs, for a plan made where the Hub cannot be reached
KNOWN_SIZES = {"openai/gsm8k": (7473, 1319)}


def known_sizes(dataset, config):
    """(train, test) problems of a dataset in KNOWN_SIZES when the Hub cannot be reached, else None."""
    known = dataset in KNOWN_SIZES and config in ("main", "socratic")
    if not known or not hub.hub_unreachable(dataset, "DATASET", "dataset"):
        return None
    log.info("DATASET=%s: the Hub cannot be reached; the plan uses its known sizes %s", dataset, KNOWN_SIZES[dataset])
    return KNOWN_SIZES[dataset]


def gold_answer(answer):
    """The gold number of a GSM8K answer ("... #### 1,080" -> "1080") or of a bare number ("18", 2.5), else None:
    also when more digits follow the number (`#### 1e3`, `#### 1 000`) or a comma groups no thousands (`#### 2,50`),
    so that such a row is refused rather than trained on as 1."""
    text = str(answer) if "####" in str(answer) else f"#### {answer}"
    value = grading.extract_hash_answer(text)
    number = GOLD_NUMBER.match(text.rpartition("####")[2])
    if value is None or not number or re.search("[0-9]", number["rest"]):
        return None
    digits = number[0][: len(number[0]) - len(number["rest"])].strip().lstrip("$-").strip()
    return value if THOUSANDS.fullmatch(digits.partition(".")[0]) else None


def _read_hub(dataset, config, split, fields):
    if problem := hub.hub_unreachable(dataset, "DATASET", repo_type="dataset"):
        raise ConfigError(problem)
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except (OSError, ValueError) as err:  # not found, offline, a connection (OSError); a bad config or split
        raise ConfigError(
            f"DATASET {dataset!r} could not be loaded from the Hugging Face Hub ({errors.first_line(err)}).\n"
            "Without Hub access, point DATASET at a local GSM8K-format .jsonl file or folder (see README)."
        ) from None
    fields = _open_r1_answer(fields, ds.column_names)
    if missing := [field for field in fields if field not in ds.column_names]:
        raise ConfigError(
            f"DATASET {dataset} has no column {missing[0]!r} (its columns: {', '.join(ds.column_names)}); "
            "set QUESTION_FIELD and ANSWER_FIELD to the columns holding the problem and its answer."
        )
    rows = zip(ds[fields[0]], ds[fields[1]], strict=True)
    return [{"question": q, "answer": str(a), "line": f"row {i}"} for i, (q, a) in enumerate(rows, 1)], dataset


def _read_local(dataset, split, fields):
    """The rows of a .jsonl file shaped like GSM8K, each problem named with its line: by hand, as datasets' JSON
    builder names neither line nor field. Lines end at \\n only; a byte-order mark and blank lines are tolerated."""
    path = Path(dataset)
    path = path / f"{split}.jsonl" if path.is_dir() else path
    where = f"DATASET={dataset}" + (f" ({split} split)" if path.name == f"{split}.jsonl" else "")
    if not path.is_file():
        raise ConfigError(
            f"{where} points at {path}, which {'is not a regular file' if path.exists() else 'does not exist'}.\n"
            'Give a GSM8K-format .jsonl file (one {"question": ..., "answer": "... #### N"} per line), a folder with '
            "train.jsonl and test.jsonl, or the Hub id openai/gsm8k."
        )
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        message = f"{where}: {path} is not UTF-8 text (line {line}, byte {err.start}); save it as UTF-8."
        raise ConfigError(message) from None
    rows, problems = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_ROW_CHARS:  # before json.loads and the grader, which a megabyte row would stall
            problems.append(f"line {number}: {len(line)} characters, above the bound of {MAX_ROW_CHARS} per row")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"line {number}: not JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: a {type(row).__name__}, not an object")
            continue
        fields = fields if rows or problems else _open_r1_answer(fields, row)  # decided by the first row
        problems += [f"line {number}: {p}" for f in fields if (p := _field_problem(row, f, f == fields[1]))]
        rows.append({"question": row.get(fields[0]), "answer": str(row.get(fields[1])), "line": f"line {number}"})
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(
            f"{where}: {path} has bad rows: {'; '.join(problems[:3])}{more}.\nEach line must be "
            f'{{"{fields[0]}": "...", "{fields[1]}": "... #### N"}} (QUESTION_FIELD, ANSWER_FIELD name the keys).'
        )
    if not rows:
        raise ConfigError(f"{where}: {path} holds no problems; give a GSM8K-format .jsonl file with rows.")
    return rows, path


def _open_r1_answer(fields, columns):
    """`fields` with the answer read from open-r1's "solution" column when the default "answer" is not there."""
    if fields[1] == "answer" and "answer" not in columns and "solution" in columns:
        log.info("reading the answers from the column 'solution' (open-r1's name; ANSWER_FIELD names another)")
        return fields[0], "solution"
    return fields


def _field_problem(row, field, number_ok):
    """Why the row's `field` is no usable text (a number too, for an answer), or None."""
    value = row.get(field)
    if number_ok and isinstance(value, int | float) and not isinstance(value, bool):
        return None
    if not isinstance(value, str) or not value.strip():
        what = "missing" if field not in row else "empty" if value == "" else f"a {type(value).__name__}"
        return f"{field!r} is {what}, not text"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON's "\\ud83c" escape: half of a character, which no text holds
        return f"{field!r} holds U+{ord(value[err.start]):04X} at character {err.start}, half of a character pair"
    return None


def grade(completion, gold, truncated=False, thinking=False):
    """The grader's verdicts (grading.grade), `truncated`, and lm-evaluation-harness's two gsm8k verdicts, which
    read the text as lm-eval does (no rule for cut-off or unclosed thinking)."""
    verdicts = grading.grade(completion, gold, truncated=truncated, thinking=thinking) | {"truncated": truncated}
    verdicts["lm_eval_strict"] = stats.lm_eval_strict(completion, gold)
    verdicts["lm_eval_flexible"] = stats.lm_eval_flexible(completion, gold)
    return verdicts


def summarize(graded, completion_tokens):
    """The metrics of completions graded by `grade`: `KEYS` (shares to 4 decimals), each accuracy's `INTERVAL`."""
    n = len(graded)
    counts = {key: sum(bool(g.get(verdict)) for g in graded) for key, verdict in RATES.items()}
    metrics = {key: round(count / n, 4) if n else 0.0 for key, count in counts.items()}
    metrics |= {"n": n, "mean_completion_tokens": round(sum(completion_tokens) / n, 2) if n else 0.0}
    metrics = {key: metrics[key] for key in KEYS}  # in the order of KEYS, the JSON file's
    return metrics | {key + INTERVAL: interval(counts[key], n) for key in ACCURACIES}


def interval(successes, n):
    """The 95 % Wilson interval of `successes` of `n`, as a JSON list rounded to 4 decimals."""
    return [round(bound, 4) for bound in stats.wilson(successes, n)]


def sampled_summary(counts, samples, temperature):
    """The sampled-accuracy metrics (`SAMPLED_KEYS`, intervals) from the per-problem counts of `sampled_counts`;
    pass_at_k maps k, as text, to the mean unbiased pass@k."""
    n = len(counts)
    right = sum(c["correct"] for c in counts) / samples  # the expected number right of one sample per problem
    strict = sum(c["strict_correct"] for c in counts) / samples
    pass_at = stats.pass_at_ks([c["correct"] for c in counts], samples) if n else {}
    return {
        "samples": samples,
        "sample_temperature": temperature,
        "sampled_accuracy": round(right / n, 4) if n else 0.0,
        "sampled_strict_accuracy": round(strict / n, 4) if n else 0.0,
        "pass_at_k": {str(k): round(value, 4) for k, value in pass_at.items()},
        "sampled_accuracy" + INTERVAL: interval(right, n),
        "sampled_strict_accuracy" + INTERVAL: interval(strict, n),
    }


def sampled_counts(golds, completions, samples, thinking=False, truncated=None):
    """Per problem, how many of its `samples` completions (problem-major: the first `samples` are golds[0]'s) were
    right: [{"correct": c, "strict_correct": c'}, ...]."""
    if len(completions) != len(golds) * samples:
        raise ValueError(f"{len(completions)} completions for {len(golds)} problems x {samples} samples")
    truncated = truncated or [False] * len(completions)
    graded = [
        grading.grade(c, golds[i // samples], truncated=truncated[i], thinking=thinking)
        for i, c in enumerate(completions)
    ]
    return [
        {key: sum(bool(g[key]) for g in graded[i : i + samples]) for key in ("correct", "strict_correct")}
        for i in range(0, len(graded), samples)
    ]
