"""The GSM8K task, shared by training (grpotrainer.py) and evaluation (evaluate.py): prompts, data, scoring.

Both scripts import this module and never each other, so a before/after accuracy is measured with exactly the prompt,
chat template and grader that training used (grpo/grading.py's `grade`: the answer a completion gives, judged as a
careful grader would; no credit for thinking that never closed). Metrics (`KEYS`): strict_accuracy (the
last '####' number), lenient_accuracy (any answer form the grader reads), format_rate, mean_completion_tokens,
truncated_rate, padded_rate (the share that repeats or pads past its answer, which the rewards pay nothing and the
accuracies still judge: after training, no higher than before);
a lenient accuracy far above the strict one means the model solves the problems but ignores the asked format.
Sampled accuracy (`SAMPLED_KEYS`): k completions per problem at a temperature, c/k per problem (pass@1 estimated
from k) averaged over problems: at training's TEMPERATURE, what GRPO's correctness reward pays on average; and
pass_at_k, the unbiased pass@k for k = 1..samples (grpo/stats.py).

How sure: every accuracy has `<key>_ci95`, its 95 % Wilson interval [low, high] over the n problems (the sampled
one too: a problem's c/k lies in [0, 1], so its variance is at most p(1-p) and the interval errs wide).
lm_eval_strict_match and lm_eval_flexible_extract grade the same greedy completions as lm-evaluation-harness's gsm8k
task does (the first `#### N`; the last number), for setting beside a published score (stats.py says what differs).
`paired` compares two evaluations of the same problems (`compare`): the flips and the exact McNemar p-value.
"""

import json
import logging
import re
from pathlib import Path

from grpo import errors, grading, hub, stats
from grpo.errors import ConfigError

# The instruction before every problem; grpotrainer.py and evaluate.py start from this default.
SYSTEM_PROMPT = (
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


def make_prompt(question, system_prompt=SYSTEM_PROMPT, fold=False):
    """Chat messages for one problem: the system prompt, then the question; with `fold` (a chat template that
    refuses a system turn, as Gemma's and Mistral's do) one user turn holding both.

    >>> make_prompt("1+1?", "Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '1+1?'}]
    >>> make_prompt("1+1?", "Be brief.", fold=True)
    [{'role': 'user', 'content': 'Be brief.\\n\\n1+1?'}]
    """
    if fold:
        return [{"role": "user", "content": f"{system_prompt}\n\n{question}" if system_prompt else question}]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def load(dataset, split="train", *, config="main", limit=0, skip_bad_rows=False, system_prompt=SYSTEM_PROMPT,
         question="question", answer="answer", fold=False, name="DATASET"):  # fmt: skip
    """GSM8K (or a dataset shaped like it) as a Dataset with `prompt` (chat messages), `answer` and `solution` (the
    gold number, under both names so that TRL's own rewards, which read `solution`, run beside ours) and `question`.

    `dataset` is a Hub id (with `config`), a .jsonl file, or a folder holding {split}.jsonl; `question` and `answer`
    name its columns (QUESTION_FIELD, ANSWER_FIELD), the answer a GSM8K solution ending `#### N` or a bare number.
    Rows without a gold number are an error naming them, or are dropped with `skip_bad_rows`. `limit` keeps the
    first N usable rows.
    """
    fields = (question, answer)  # open-r1's datasets name the answer column "solution"
    if hub.is_local(dataset):
        rows, source = _read_local(dataset, split, name, fields)
    else:
        rows, source = _read_hub(dataset, config, split, name, fields)
    golds = [gold_answer(row["answer"]) for row in rows]
    if bad := [i for i, gold in enumerate(golds) if gold is None]:
        shown = "; ".join(f"{rows[i]['line']}: ...{rows[i]['answer'][-40:]!r}" for i in bad[:3])
        if not skip_bad_rows:
            raise ConfigError(
                f"{len(bad)} of {len(rows)} rows of {name} {source} have no '#### N' answer that reads as one number "
                f"({answer} column), e.g. {shown}.\nFix those rows, or set SKIP_BAD_ROWS=True to train without them."
            )
        log.warning("skipping %d rows without a '#### N' answer (SKIP_BAD_ROWS=True), e.g. %s", len(bad), shown)
    keep = [i for i, gold in enumerate(golds) if gold is not None][: limit or None]
    import datasets

    questions = [rows[i]["question"] for i in keep]
    return datasets.Dataset.from_dict(
        {
            "prompt": [make_prompt(q, system_prompt, fold) for q in questions],
            "answer": [golds[i] for i in keep],
            "solution": [golds[i] for i in keep],
            "question": questions,
        }
    )


# GSM8K's sizes (train, test) in both its configs, for a plan made where the Hub cannot be reached
KNOWN_SIZES = {"openai/gsm8k": (7473, 1319)}


def known_sizes(dataset, config):
    """(train, test) problems of a Hub dataset in KNOWN_SIZES when the Hub cannot be reached (a --plan offline),
    else None: then the dataset itself is read."""
    if (
        dataset in KNOWN_SIZES
        and config in ("main", "socratic")
        and hub.hub_unreachable(dataset, "DATASET", "dataset")
    ):
        log.info(
            "DATASET=%s: the Hub cannot be reached; the plan uses its known sizes %s", dataset, KNOWN_SIZES[dataset]
        )
        return KNOWN_SIZES[dataset]
    return None


def gold_answer(answer):
    """The gold number of a GSM8K answer ("... #### 1,080" -> "1080") or of a bare number ("18", 2.5), or None when
    it has none: also when the text after its '####' holds more digits than the number read (`#### 1e3`,
    `#### 1 000`) or its commas do not group thousands (`#### 2,50`): such a row is refused, not trained on as 1.

    >>> [gold_answer(a) for a in ("3 * 6 = 18\\n#### 18", "#### $1,000", "#### 1e3", "#### 1 000", "#### 2,50", 18)]
    ['18', '1000', None, None, None, '18']
    """
    text = str(answer) if "####" in str(answer) else f"#### {answer}"
    value = grading.extract_hash_answer(text)
    number = GOLD_NUMBER.match(text.rpartition("####")[2])
    if value is None or not number or re.search("[0-9]", number["rest"]):
        return None
    digits = number[0][: len(number[0]) - len(number["rest"])].strip().lstrip("$-").strip()
    return value if THOUSANDS.fullmatch(digits.partition(".")[0]) else None


def _read_hub(dataset, config, split, name, fields):
    if problem := hub.hub_unreachable(dataset, name, repo_type="dataset"):
        raise ConfigError(problem)
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except (OSError, ValueError) as err:  # not found, offline, a connection (OSError); a bad config or split
        raise ConfigError(
            f"{name} {dataset!r} could not be loaded from the Hugging Face Hub ({errors.first_line(err)}).\n"
            f"Without Hub access, point {name} at a local GSM8K-format .jsonl file or folder (see README)."
        ) from None
    fields = _open_r1_answer(fields, ds.column_names)
    if missing := [field for field in fields if field not in ds.column_names]:
        raise ConfigError(
            f"{name} {dataset} has no column {missing[0]!r} (its columns: {', '.join(ds.column_names)}); "
            "set QUESTION_FIELD and ANSWER_FIELD to the columns holding the problem and its answer."
        )
    rows = zip(ds[fields[0]], ds[fields[1]], strict=True)
    return [{"question": q, "answer": str(a), "line": f"row {i}"} for i, (q, a) in enumerate(rows, 1)], dataset


def _read_local(dataset, split, name, fields):
    """The rows of a .jsonl file shaped like GSM8K, checked line by line: every problem names its line number.

    Read by hand rather than with datasets' JSON builder, whose errors name neither the line nor the field. Lines
    end at \\n only (U+2028 and the like are text inside a line); a byte-order mark and blank lines are tolerated.
    """
    path = Path(dataset)
    path = path / f"{split}.jsonl" if path.is_dir() else path
    where = f"{name}={dataset}" + (f" ({split} split)" if path.name == f"{split}.jsonl" else "")
    if not path.is_file():
        raise ConfigError(
            f"{where} points at {path}, which {'is not a regular file' if path.exists() else 'does not exist'}.\n"
            "Give a GSM8K-format .jsonl file "
            '(one {"question": ..., "answer": "... #### N"} per line), a folder with train.jsonl and test.jsonl, '
            "or the Hub id openai/gsm8k."
        )
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{where}: {path} is not UTF-8 text (line {line}, byte {err.start}); save it as UTF-8."
        ) from None
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
        problems += [
            f"line {number}: {p}" for field in fields if (p := _field_problem(row, field, field == fields[1]))
        ]
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
    read the text as lm-eval does (no rule for cut-off or unclosed thinking).

    >>> v = grade("#### 18\\n#### 19", "19")  # the last #### is the answer (padded); lm-eval's strict reads the first
    >>> v["strict_correct"], v["padded"], v["lm_eval_strict"], v["lm_eval_flexible"]
    (True, True, False, True)
    """
    verdicts = grading.grade(completion, gold, truncated=truncated, thinking=thinking)
    return {
        **verdicts,
        "truncated": truncated,
        "lm_eval_strict": stats.lm_eval_strict(completion, gold),
        "lm_eval_flexible": stats.lm_eval_flexible(completion, gold),
    }


def score(golds, completions, completion_tokens=None, truncated=None):
    """The metrics dict (keys `KEYS` and the intervals) for completions graded against their gold answers; pure.

    Shares are rounded to 4 decimals, so 1 of 3 is 0.3333.

    >>> m = score(["18", "5", "7"], ["#### 18", "The answer is 5.", "#### 8"], [4, 6, 2])
    >>> m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"], m["mean_completion_tokens"]
    (3, 0.3333, 0.6667, 0.6667, 4.0)
    >>> m["strict_accuracy_ci95"], m["lm_eval_flexible_extract"]
    ([0.0615, 0.7923], 0.6667)
    """
    truncated = truncated or [False] * len(completions)
    graded = [grade(c, g, truncated=t) for c, g, t in zip(completions, golds, truncated, strict=True)]
    return summarize(graded, completion_tokens or [0] * len(graded))


def summarize(graded, completion_tokens):
    """The metrics of already graded completions (dicts from `grade`) and their token counts: `KEYS`, and for each
    accuracy its Wilson interval (`INTERVAL`)."""
    n = len(graded)

    def count(key):
        return sum(bool(g.get(key)) for g in graded)

    def share(key):
        return round(count(key) / n, 4) if n else 0.0

    metrics = {
        "n": n,
        "strict_accuracy": share("strict_correct"),
        "lenient_accuracy": share("correct"),
        "format_rate": share("formatted"),
        "mean_completion_tokens": round(sum(completion_tokens) / n, 2) if n else 0.0,
        "truncated_rate": share("truncated"),
        "padded_rate": share("padded"),
        "lm_eval_strict_match": share("lm_eval_strict"),
        "lm_eval_flexible_extract": share("lm_eval_flexible"),
    }
    for key, verdict in ACCURACIES.items():
        metrics[key + INTERVAL] = interval(count(verdict), n)
    return metrics


def interval(successes, n):
    """The 95 % Wilson interval of `successes` of `n`, as a JSON list rounded to 4 decimals.

    >>> interval(5, 10), interval(0, 0)
    ([0.2366, 0.7634], [0.0, 1.0])
    """
    return [round(bound, 4) for bound in stats.wilson(successes, n)]


def sampled_metrics(golds, completions, samples, temperature, thinking=False, truncated=None):
    """The sampled-accuracy metrics (keys `SAMPLED_KEYS`, intervals) of `samples` completions per problem; pure.

    `completions` are problem-major: the first `samples` belong to golds[0], the next to golds[1], ... For one
    problem with c correct of k, c/k is the unbiased estimate of the chance that one sample is correct (pass@1);
    sampled_accuracy is its mean over the problems, rounded to 4 decimals. pass_at_k maps k (as text, JSON's keys)
    to the mean unbiased pass@k over the problems.

    >>> m = sampled_metrics(["18", "5"], ["#### 18", "The answer is 18.", "#### 4", "#### 5"], 2, 1.0)
    >>> m["sampled_accuracy"], m["sampled_strict_accuracy"], m["pass_at_k"], m["sampled_accuracy_ci95"]
    (0.75, 0.5, {'1': 0.75, '2': 1.0}, [0.1979, 0.9733])
    """
    if len(completions) != len(golds) * samples:
        raise ValueError(f"{len(completions)} completions for {len(golds)} problems x {samples} samples")
    return sampled_summary(sampled_counts(golds, completions, samples, thinking, truncated), samples, temperature)


def sampled_summary(counts, samples, temperature):
    """`sampled_metrics` from the per-problem counts of `sampled_counts`."""
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
    """Per problem, how many of its `samples` completions were right: [{"correct": c, "strict_correct": c'}, ...].

    >>> sampled_counts(["3"], ["#### 3", "The answer is 3.", "#### 4"], 3)
    [{'correct': 2, 'strict_correct': 1}]
    """
    truncated = truncated or [False] * len(completions)
    graded = [
        grading.grade(c, golds[i // samples], truncated=truncated[i], thinking=thinking)
        for i, c in enumerate(completions)
    ]
    return [
        {key: sum(bool(g[key]) for g in graded[i : i + samples]) for key in ("correct", "strict_correct")}
        for i in range(0, len(graded), samples)
    ]
