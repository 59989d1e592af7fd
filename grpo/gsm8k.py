"""The GSM8K task, shared by training (grpotrainer.py) and evaluation (evaluate.py): prompts, data, scoring.

Both scripts import this module and never each other, so a before/after accuracy is measured with exactly the prompt,
chat template and grader that training used (grpo/grading.py's `grade`: no credit for thinking that never closed,
for a cut-off completion, or for one that repeats or pads past its answer). Metrics (`KEYS`): strict_accuracy (the
last '####' number), lenient_accuracy (any answer form the grader reads), format_rate, mean_completion_tokens,
truncated_rate, padded_rate (the share that repeats or pads past its answer: after training, no higher than before);
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

import contextlib
import itertools
import json
import logging
import os
import re
import time
from pathlib import Path

from grpo import errors, grading, hardware, hub, stats
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
    "sampled_accuracy": "eval/gsm8k_sampled_accuracy",
    "sampled_strict_accuracy": "eval/gsm8k_sampled_strict_accuracy",
}
CONTEXT_MARGIN = 64  # tokens of vLLM context over the longest prompt plus a completion (see `context_length`)
SAMPLED_KEYS = ("samples", "sample_temperature", "sampled_accuracy", "sampled_strict_accuracy", "pass_at_k")
log = logging.getLogger("grpotrainer.gsm8k")


# ---------------------------------------------------------------------------------------------------------------
# Prompts and data


# The longest row a local dataset may hold: GSM8K's longest line (train and test) is 1,744 characters, so a row 37
# times longer is not a word problem; refused with its line number instead of stalling tokenization for minutes.
MAX_ROW_CHARS = 64 * 1024
# What a gold '#### N' holds: a number, perhaps after $, and then no other digit (units may follow, "#### 18 pens")
GOLD_NUMBER = re.compile(r"[ \t]*\$?[ \t]*-?[0-9][0-9,]*(?:\.[0-9]+)?(?P<rest>.*)", re.S)


def make_prompt(question, system_prompt=SYSTEM_PROMPT):
    """Chat messages for one problem: the system prompt, then the question.

    >>> make_prompt("1+1?", "Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '1+1?'}]
    """
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def load(
    dataset, split="train", *, config="main", limit=0, skip_bad_rows=False, system_prompt=SYSTEM_PROMPT, name="DATASET"
):
    """GSM8K (or a local file in its format) as a Dataset with `prompt` (chat messages), `answer` and `solution` (the
    gold number, under both names so that TRL's own rewards, which read `solution`, run beside ours) and `question`.

    `dataset` is a Hub id (with `config`), a .jsonl file, or a folder holding {split}.jsonl. Rows whose answer has no
    '#### N' are an error naming them, or are dropped with `skip_bad_rows`. `limit` keeps the first N usable rows.
    """
    rows, source = (
        _read_local(dataset, split, name) if hub.is_local(dataset) else _read_hub(dataset, config, split, name)
    )
    golds = [gold_answer(row["answer"]) for row in rows]
    if bad := [i for i, gold in enumerate(golds) if gold is None]:
        shown = "; ".join(f"{rows[i].get('line', f'row {i + 1}')}: ...{rows[i]['answer'][-40:]!r}" for i in bad[:3])
        if not skip_bad_rows:
            raise ConfigError(
                f"{len(bad)} of {len(rows)} rows of {name} {source} have no '#### N' answer that reads as one number, "
                f"e.g. {shown}.\nFix those rows, or set SKIP_BAD_ROWS=True to train without them."
            )
        log.warning("skipping %d rows without a '#### N' answer (SKIP_BAD_ROWS=True), e.g. %s", len(bad), shown)
    keep = [i for i, gold in enumerate(golds) if gold is not None][: limit or None]
    import datasets

    questions = [rows[i]["question"] for i in keep]
    return datasets.Dataset.from_dict(
        {
            "prompt": [make_prompt(q, system_prompt) for q in questions],
            "answer": [golds[i] for i in keep],
            "solution": [golds[i] for i in keep],
            "question": questions,
        }
    )


def gold_answer(answer):
    """The gold number of a GSM8K answer ("... #### 1,080" -> "1080"), or None when it has none, or when the text
    after its '####' holds more digits than the number read (`#### 1e3`, `#### 1 000`): such a row is refused
    rather than trained on as 1.

    >>> [gold_answer(a) for a in ("3 * 6 = 18\\n#### 18", "#### $1,000", "#### 1e3", "#### 1 000")]
    ['18', '1000', None, None]
    """
    value = grading.extract_hash_answer(answer)
    number = GOLD_NUMBER.match(answer.rpartition("####")[2])
    return value if value is not None and number and not re.search("[0-9]", number["rest"]) else None


def _read_hub(dataset, config, split, name):
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
    if missing := {"question", "answer"} - set(ds.column_names):
        raise ConfigError(f"{name} {dataset} lacks the column(s) {sorted(missing)}; GSM8K rows have question, answer.")
    return [{"question": q, "answer": a} for q, a in zip(ds["question"], ds["answer"], strict=True)], dataset


def _read_local(dataset, split, name):
    """The rows of a GSM8K-format .jsonl file, checked line by line: every problem names its line number.

    Read by hand rather than with datasets' JSON builder, whose errors name neither the line nor the field.
    A byte-order mark and blank lines are tolerated.
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
    for number, line in enumerate(text.splitlines(), 1):
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
        for key in ("question", "answer"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                what = "missing" if key not in row else "empty" if row[key] == "" else f"a {type(row[key]).__name__}"
                problems.append(f"line {number}: {key!r} is {what}, not text")
        rows.append({**row, "line": f"line {number}"})
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(
            f"{where}: {path} has bad rows: {'; '.join(problems[:3])}{more}.\nEach line must be "
            '{"question": "...", "answer": "... #### N"}.'
        )
    if not rows:
        raise ConfigError(f"{where}: {path} holds no problems; give a GSM8K-format .jsonl file with rows.")
    return rows, path


# ---------------------------------------------------------------------------------------------------------------
# Grading and scoring


def grade(completion, gold, truncated=False, thinking=False):
    """The grader's verdicts (grading.grade), `truncated`, and lm-evaluation-harness's two gsm8k verdicts, which
    read the text as lm-eval does (no rule for cut-off or unclosed thinking).

    >>> v = grade("#### 18\\n#### 19", "19")  # a second #### pads past the answer: no credit
    >>> v["strict_correct"], v["lm_eval_strict"], v["lm_eval_flexible"]
    (False, False, True)
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


# ---------------------------------------------------------------------------------------------------------------
# Generating and evaluating


def generate_all(dataset, generate, batch_size, desc="GSM8K", progress=True):
    """Run `generate` over the dataset's prompts in batches, with a progress bar.

    `generate(prompts)` takes a list of chat prompts (lists of messages) and returns one `(text, n_tokens, truncated)`
    per prompt: `hf_generator` and `vllm_generator` make one from a model, and a test can pass a stub.
    Returns one row per problem: question, gold, completion, completion_tokens, truncated.
    """
    from tqdm.auto import tqdm

    rows = []
    with tqdm(total=len(dataset), desc=desc, unit="problem", disable=not (progress and len(dataset))) as bar:
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            outputs = generate(batch["prompt"])
            if len(outputs) != len(batch["prompt"]):
                raise RuntimeError(f"the generator returned {len(outputs)} completions for {len(batch['prompt'])}")
            for question, gold, (text, n_tokens, cut) in zip(batch["question"], batch["answer"], outputs, strict=True):
                rows.append(
                    {
                        "question": question,
                        "gold": gold,
                        "completion": text,
                        "completion_tokens": n_tokens,
                        "truncated": cut,
                    }
                )
            bar.update(len(batch["prompt"]))
    return rows


def sample_all(dataset, generate, samples, batch_size, desc="GSM8K", progress=True, seed=0):
    """`samples` completions per problem from a sampling `generate`, problem-major, as `generate_all` returns rows.

    The random state is seeded with `seed` for the sampling and restored afterwards, so a training run's own
    sampling stream is the same with or without this evaluation.
    """
    repeated = dataset.select([i for i in range(len(dataset)) for _ in range(samples)])
    with seeded(seed):
        return generate_all(repeated, generate, batch_size, f"{desc}, {samples} samples each", progress)


@contextlib.contextmanager
def seeded(seed):
    """torch's random state seeded with `seed` inside the block and put back as it was after it."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def results(rows, seconds, thinking=False, sampled_rows=(), samples=0, temperature=0.0):
    """The metrics and the prediction records (question, gold, completion, extracted, correct, lm-eval's verdicts,
    ...) of `rows`; with `sampled_rows` (from `sample_all`) the sampled-accuracy metrics too, and in each record
    `sampled_correct`, how many of its samples were right."""
    predictions = [{**r, **grade(r["completion"], r["gold"], r["truncated"], thinking)} for r in rows]
    metrics = summarize(predictions, [r["completion_tokens"] for r in rows])
    if samples:
        golds, completions = [r["gold"] for r in sampled_rows[::samples]], [r["completion"] for r in sampled_rows]
        cut = [r["truncated"] for r in sampled_rows]
        counts = sampled_counts(golds, completions, samples, thinking, cut)
        metrics |= sampled_summary(counts, samples, temperature)
        for prediction, count in zip(predictions, counts, strict=True):  # per problem, for paired comparisons
            prediction["sampled_correct"] = count["correct"]
    return {**metrics, "seconds": round(seconds, 2)}, predictions


def evaluate(dataset, generate, batch_size, desc="GSM8K", thinking=False, *, sampler=None, samples=0, temperature=0.0):
    """Generate for every problem of `dataset` (columns prompt, answer, question) and score: (metrics, predictions).

    With `samples` > 0, `sampler` (a `generate` that samples at `temperature`) also writes that many completions per
    problem, scored as sampled accuracy (see `sampled_metrics`).
    """
    start = time.perf_counter()
    rows = generate_all(dataset, generate, batch_size, desc)
    sampled = sample_all(dataset, sampler, samples, batch_size, desc) if samples else []
    return results(rows, time.perf_counter() - start, thinking, sampled, samples, temperature)


def report(metrics, predictions, output_dir, stem, logdir=None, step=0, title="GSM8K", settings=None):
    """Print the table; write <stem>.json (the metrics and, under "settings", what they were measured with) and
    <stem>_predictions.jsonl; log the TensorBoard scalars (and the paired test as text) at `step` when `logdir` is
    given."""
    print(format_table(metrics, title), flush=True)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {**metrics, "step": step, "settings": settings or {}}
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    with open(out / f"{stem}_predictions.jsonl", "w", encoding="utf-8") as f:
        for p in predictions:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    if logdir:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(logdir)) as writer:
            for key, tag in SCALARS.items():
                if key in metrics:  # the sampled accuracy only when it was measured
                    writer.add_scalar(tag, metrics[key], step)
            if lines := paired_lines(metrics.get("paired")):  # the Text tab; two spaces end a markdown line
                writer.add_text("eval/paired", "  \n".join(lines), step)
    log.info(
        "wrote %s/%s.json and %s_predictions.jsonl%s", out, stem, stem, f"; TensorBoard: {logdir}" if logdir else ""
    )


def format_table(metrics, title="GSM8K"):
    """The metrics as a small aligned text table: each accuracy with its interval, pass@k on one row, and the
    paired test's lines when there is one.

    >>> print(format_table({"n": 10, "strict_accuracy": 0.5, "strict_accuracy_ci95": [0.2366, 0.7634]}, "T"))
    T
      n                                     10
      strict_accuracy     0.500 [0.237, 0.763]
    """
    lines = [title]
    for key, value in metrics.items():
        if key.endswith(INTERVAL) or key == "paired":
            continue
        if key + INTERVAL in metrics:
            value = stats.format_interval(value, *metrics[key + INTERVAL])
        elif key == "pass_at_k":
            value = ", ".join(f"@{k} {v:.3f}" for k, v in value.items())
        lines.append(f"  {key:<20}{value:>20}")
    return "\n".join(lines + [f"  {line}" for line in paired_lines(metrics.get("paired"))])


# ---------------------------------------------------------------------------------------------------------------
# Two evaluations of the same problems: the paired test


def compare(baseline, predictions, name="", samples=(0, 0)):
    """The paired exact test of two evaluations' greedy verdicts, problem by problem, when `predictions` covers the
    first problems of `baseline` (the same question texts in the same order): a held-out point of EVAL_SUBSET
    problems pairs with an EVAL_BEFORE of as many or more. None when the problems differ. `samples`: how many
    sampled answers per problem (baseline's, predictions'); when equal and above 0, sampled accuracy is paired too.

    Returns {"baseline": name, "strict": stats.paired(...), "lenient": stats.paired(...)}, and "sampled":
    stats.paired_samples(...) on each problem's count of right samples: n, the flips up (wrong -> right) and down,
    the exact McNemar (sign test) p_value and the difference in accuracy.

    >>> before = [{"question": q, "correct": c, "strict_correct": c} for q, c in zip("abc", (0, 0, 1))]
    >>> after = [{"question": q, "correct": c, "strict_correct": 0} for q, c in zip("ab", (1, 1))]
    >>> paired = compare(before, after, "before.json")
    >>> paired["lenient"]["up"], paired["lenient"]["p_value"], paired["strict"]["up"]
    (2, 0.5, 0)
    >>> compare(before, after[::-1]) is None
    True
    """
    head = baseline[: len(predictions)]
    if not predictions or [b["question"] for b in head] != [p["question"] for p in predictions]:
        return None
    tests = {
        label: stats.paired([bool(b[key]) for b in head], [bool(p[key]) for p in predictions])
        for label, key in (("strict", "strict_correct"), ("lenient", "correct"))
    }
    both = [(b.get("sampled_correct"), p.get("sampled_correct")) for b, p in zip(head, predictions, strict=True)]
    if samples[0] == samples[1] > 0 and all(b is not None and p is not None for b, p in both):
        tests["sampled"] = stats.paired_samples([b for b, _ in both], [p for _, p in both], samples[0])
    return {"baseline": name, **tests}


def paired_lines(paired):
    """The paired test as text, one line per accuracy: both accuracies on the shared problems, the change, the
    flips and the p-value.

    >>> paired_lines({"baseline": "b.json", "strict": stats.paired([0, 0, 1, 1], [1, 1, 1, 0])})
    ['paired with b.json on 4 problems (exact McNemar test):', 'strict: 0.500 -> 0.750 (+0.250; 2 up / 1 down, p = 1)']
    """
    if not paired:
        return []
    tests = {label: test for label, test in paired.items() if label != "baseline"}
    n = next(iter(tests.values()))["n"]
    lines = [f"paired with {paired['baseline']} on {n} problems (exact McNemar test):"]
    return lines + [f"{label}: {pair_text(test)}" for label, test in tests.items()]


def pair_text(test):
    """One paired test (stats.paired's dict) as text, with both accuracies on the problems it pairs."""
    before, after = accuracies(test)
    return stats.describe_pair(before, after, test)


def accuracies(test):
    """(before, after) accuracy on the problems a paired test (stats.paired or stats.paired_samples) covers."""
    if "before" in test:
        return test["before"], test["after"]
    return (test["both_right"] + test["down"]) / test["n"], (test["both_right"] + test["up"]) / test["n"]


def flip_lines(baseline, predictions, width=60):
    """One line per problem whose strict or lenient verdict flipped: its index, both flips, its question's start.

    >>> before = [{"question": "How many apples?", "correct": 0, "strict_correct": 0}]
    >>> flip_lines(before, [{"question": "How many apples?", "correct": 1, "strict_correct": 0}])
    ['#0   strict -     lenient up    How many apples?']
    """
    lines = []
    for i, (b, p) in enumerate(zip(baseline, predictions, strict=True)):
        flips = {
            label: ("up" if p[key] else "down") if bool(b[key]) != bool(p[key]) else "-"
            for label, key in (("strict", "strict_correct"), ("lenient", "correct"))
        }
        if set(flips.values()) != {"-"}:
            question = " ".join(p["question"].split())
            question = question if len(question) <= width else question[: width - 3] + "..."
            lines.append(f"#{i:<3} strict {flips['strict']:<5} lenient {flips['lenient']:<5} {question}")
    return lines


def load_evaluation(path, split="test", name="BASELINE"):
    """(metrics, predictions, file) of an evaluation that `report` wrote: `path` is its .json, or a folder holding
    eval_<split>.json (evaluate.py's) or else eval_<split>_after.json (a training run's EVAL_AFTER). Anything else
    is a ConfigError naming `name`."""
    path = Path(path)
    if path.is_dir():
        path = next(
            (path / f for f in (f"eval_{split}.json", f"eval_{split}_after.json") if (path / f).is_file()), path
        )
    predictions_path = path.with_name(path.stem + "_predictions.jsonl")
    problem = f"{name}={path} is not an evaluation that evaluate.py or a training run wrote"
    fix = f"Give an eval_<split>.json with its _predictions.jsonl beside it, or a folder holding eval_{split}.json."
    if not path.is_file() or not predictions_path.is_file():
        missing = predictions_path.name if path.is_file() else f"no eval_{split}.json or eval_{split}_after.json"
        raise ConfigError(f"{problem} ({missing} there).\n{fix}")
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
        with open(predictions_path, encoding="utf-8") as f:
            predictions = [json.loads(line) for line in f if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{problem} ({type(err).__name__}: {err}).\n{fix}") from None
    keys = {"question", "correct", "strict_correct"}
    if not (
        isinstance(metrics, dict)
        and {"n", "strict_accuracy", "lenient_accuracy"} <= set(metrics)
        and all(isinstance(p, dict) and keys <= set(p) for p in predictions)
        and len(predictions) == metrics["n"]
    ):
        raise ConfigError(f"{problem} (it lacks the metrics or the per-problem verdicts).\n{fix}")
    return metrics, predictions, path


def load_baseline(path, split, questions, name="BASELINE"):
    """`load_evaluation` of an evaluation that scored exactly `questions` (the same texts in the same order), or
    a ConfigError naming the first problem that differs."""
    metrics, predictions, path = load_evaluation(path, split, name)
    scored = [p["question"] for p in predictions]
    if scored != list(questions):
        i = next(i for i, (a, b) in enumerate(itertools.zip_longest(scored, questions)) if a != b)
        first = " ".join((scored[i] if i < len(scored) else "(none)").split())[:60]
        raise ConfigError(
            f"{name}={path} scored other problems ({len(scored)} there, {len(questions)} here; the first that "
            f"differs: #{i}, {first!r}).\nA paired comparison needs the same DATASET, SPLIT and LIMIT as {path.name}."
        )
    return metrics, predictions, path


def paired_with_before(output_dir, predictions, samples=0):
    """`compare` against the run's EVAL_BEFORE (OUTPUT_DIR/eval_test_before.json) when there is one on the same
    problems, else None. A before file that cannot be read is warned about and skipped: it must not stop a run."""
    path = Path(output_dir) / "eval_test_before.json"
    if not path.is_file():
        return None
    try:
        metrics, before, _ = load_evaluation(path, name="the run's EVAL_BEFORE")
    except ConfigError as err:
        log.warning("no paired test: %s", errors.first_line(err))
        return None
    return compare(before, predictions, path.name, (metrics.get("samples", 0), samples))


def eos_ids(model, tokenizer):
    """Token ids that end a completion, by GRPOTrainer's rule: the tokenizer's EOS, then the generation config's
    (Qwen3: <|im_end|>, <|endoftext|>). A converted folder may name another EOS than the end of turn its generation
    config stops at (SmolLM2's GGUF: <|im_start|> and <|im_end|>): then either ends a completion, as in training.

    >>> from types import SimpleNamespace as NS
    >>> eos_ids(NS(generation_config=NS(eos_token_id=2)), NS(eos_token_id=1))
    [1, 2]
    >>> eos_ids(NS(generation_config=NS(eos_token_id=[2, 0])), NS(eos_token_id=2))
    [2, 0]
    """
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    return eos


def hf_generator(
    model, tokenizer, max_new_tokens, enable_thinking=False, temperature=0.0, cache_implementation="dynamic", eos=None
):
    """A `generate(prompts, temperature=temperature)` for `generate_all` on a transformers model, as training
    generates: its chat template and `enable_thinking`, left padding, greedy at temperature 0 else sampled from the
    full distribution (no top-k or top-p, GRPOTrainer's default). Tokens are counted up to and including the first
    end-of-turn token (`eos`, a trainer's `eos_token_ids`, else `eos_ids`) and the text decoded without special
    tokens, as TRL does for the rewards; no end-of-turn token means cut off. A tokenizer without a pad token is
    given the first end-of-turn token, as GRPOTrainer does."""
    import torch
    from transformers import GenerationConfig

    eos = eos_ids(model, tokenizer) if eos is None else list(eos)
    if not eos:
        raise ConfigError(
            "the model names no EOS token in its tokenizer or generation config, so no completion could end.\n"
            "Set eos_token_id in the model folder's generation_config.json to its end-of-turn token."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos[0])
    pad = tokenizer.pad_token_id

    def generate(prompts, temperature=temperature):
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
        config = GenerationConfig(
            **{"do_sample": False, **sampling}, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad
        )
        texts = [
            tokenizer.apply_chat_template(
                p, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
            )
            for p in prompts
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        inputs = inputs.to(model.device)
        with torch.no_grad():
            output = model.generate(
                **inputs, generation_config=config, **hardware.decode_options(cache_implementation)
            )
        outputs = []
        for ids in output[:, inputs["input_ids"].shape[1] :].tolist():
            end = next((i for i, t in enumerate(ids) if t in eos), None)
            n_tokens = len(ids) if end is None else end + 1
            outputs.append((tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens, end is None))
        return outputs

    return generate


def longest_prompt(dataset, model_name, enable_thinking=False, trust_remote_code=False):
    """The token count of the longest prompt of `dataset` as training and evaluation render it: MODEL_NAME's chat
    template with the generation prompt. Loads only the tokenizer (a second for all of GSM8K's train split)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name, trust_remote_code=trust_remote_code)
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)
        for p in dataset["prompt"]
    ]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def context_length(prompt_tokens, max_completion_length):
    """vLLM's context bound for a GSM8K run, training's `vllm_max_model_length` and evaluation's `max_model_len`:
    the longest prompt plus a whole completion plus CONTEXT_MARGIN. Without it vLLM reserves KV cache for the
    model's full context (40,960 positions for Qwen3-8B) when a prompt and its completion need ~1,300.

    >>> context_length(180, 256)
    500
    """
    return prompt_tokens + max_completion_length + CONTEXT_MARGIN


def vllm_generator(
    model_name,
    adapter,
    *,
    prompt_tokens,
    max_completion_length,
    enable_thinking,
    bf16,
    trust_remote_code,
    gpu_memory_utilization,
    temperature=0.0,
):
    """A `generate(prompts, temperature=temperature)` backed by vLLM, greedy at temperature 0, with the adapter (if
    any) as a LoRA request. One engine serves every temperature. `prompt_tokens`: the longest prompt's length
    (`longest_prompt`), which bounds vLLM's context (`context_length`)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"] if adapter else 0
    llm = LLM(
        model=model_name,
        dtype="bfloat16" if bf16 else "float32",
        trust_remote_code=trust_remote_code,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=context_length(prompt_tokens, max_completion_length),
        enable_lora=bool(adapter),
        max_lora_rank=hardware.vllm_lora_rank(rank) if adapter else 16,
        seed=0,
    )
    lora = LoRARequest("adapter", 1, str(Path(adapter).resolve())) if adapter else None

    def generate(prompts, temperature=temperature):
        params = SamplingParams(temperature=temperature, max_tokens=max_completion_length)
        kwargs = {"enable_thinking": enable_thinking}
        outs = llm.chat(prompts, params, lora_request=lora, chat_template_kwargs=kwargs, use_tqdm=True)
        return [(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]

    return generate


def summary_line(steps, started, metrics=(None, None), now=time.monotonic):
    """The one line a run ends with: its steps, its wall time since `started`, and the strict and lenient accuracy
    before -> after training when both were scored (`metrics`: before, after), with the paired test when `after`
    holds one (the accuracies then on the problems both scored).

    >>> scored = ({"strict_accuracy": 0.25, "n": 64}, {"strict_accuracy": 0.5, "n": 64})
    >>> summary_line(50, 0.0, scored, now=lambda: 754.0)
    'finished: 50 steps in 12m34s; GSM8K strict accuracy 0.250 -> 0.500 (64 test problems)'
    """
    before, after = metrics
    minutes, seconds = divmod(round(now() - started), 60)
    line = f"finished: {steps} steps in {minutes}m{seconds:02d}s"
    if before and after and "paired" in after:
        strict, lenient = after["paired"]["strict"], after["paired"]["lenient"]
        line += f"; GSM8K strict accuracy {pair_text(strict)}, lenient {pair_text(lenient)}"
        if sampled := after["paired"].get("sampled"):
            line += f", sampled {pair_text(sampled)}"
        line += f", paired exact test ({strict['n']} test problems)"
    elif before and after:
        line += f"; GSM8K strict accuracy {before['strict_accuracy']:.3f} -> {after['strict_accuracy']:.3f}"
        line += f" ({after['n']} test problems)"
    elif after:
        line += f"; GSM8K strict accuracy after {after['strict_accuracy']:.3f} ({after['n']} test problems)"
    return line


def new_logdir(output_dir, suffix=""):
    """A new TensorBoard run folder, output_dir/runs/<date>_<host><suffix>, named as transformers names its runs.
    TENSORBOARD_LOGGING_DIR replaces output_dir/runs/... for training (`suffix` ""), where transformers writes too;
    an evaluation (a `suffix`) gets its own run folder in it, so two never log the same tags into one."""
    from transformers.integrations.integration_utils import default_logdir

    chosen = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if chosen and not suffix:
        return chosen
    return os.path.join(chosen or output_dir, default_logdir() + suffix)
