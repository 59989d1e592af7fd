"""Scoring a model on held-out problems and reporting it, for evaluate.py and for a training run's own points
(EVAL_BEFORE, EVAL_STEPS, EVAL_AFTER): generate, grade (grpo/gsm8k.py's metrics), write `<stem>.json` and
`<stem>_predictions.jsonl`, and compare two evaluations of the same problems with an exact paired test.
"""

import contextlib
import functools
import html
import itertools
import json
import logging
import math
import os
import time
from pathlib import Path

from grpo import errors, files, generation, gsm8k, settings, stats, weight_sync
from grpo.errors import ConfigError

log = logging.getLogger("grpotrainer.evaluation")


def results(rows, seconds, thinking=False, sampled_rows=(), samples=0, temperature=0.0):
    """The metrics and the prediction records (question, gold, completion, extracted, correct, lm-eval's verdicts,
    ...) of `rows`; with `sampled_rows` (from `sample_all`) the sampled-accuracy metrics too, and in each record
    `sampled_correct`, how many of its samples were right."""
    predictions = [{**r, **gsm8k.grade(r["completion"], r["gold"], r["truncated"], thinking)} for r in rows]
    metrics = gsm8k.summarize(predictions, [r["completion_tokens"] for r in rows])
    if samples:
        golds, completions = [r["gold"] for r in sampled_rows[::samples]], [r["completion"] for r in sampled_rows]
        cut = [r["truncated"] for r in sampled_rows]
        counts = gsm8k.sampled_counts(golds, completions, samples, thinking, cut)
        metrics |= gsm8k.sampled_summary(counts, samples, temperature)
        for prediction, count in zip(predictions, counts, strict=True):  # per problem, for paired comparisons
            prediction["sampled_correct"] = count["correct"]
    return {**metrics, "seconds": round(seconds, 2)}, predictions


def evaluate(dataset, generate, batch_size, desc="GSM8K", thinking=False, *, sampler=None, samples=0, temperature=0.0):
    """Generate for every problem of `dataset` (columns prompt, answer, question) and score: (metrics, predictions).

    With `samples` > 0, `sampler` (a `generate` that samples at `temperature`) also writes that many completions per
    problem, scored as sampled accuracy (see `sampled_metrics`).
    """
    start = time.perf_counter()
    rows = generation.generate_all(dataset, generate, batch_size, desc)
    sampled = generation.sample_all(dataset, sampler, samples, batch_size, desc) if samples else []
    return results(rows, time.perf_counter() - start, thinking, sampled, samples, temperature)


def report(metrics, predictions, output_dir, stem, step=0, title="GSM8K", settings=None):
    """Print the table; write <stem>.json (the metrics and, under "settings", what they were measured with, without
    credentials) and <stem>_predictions.jsonl, each written aside and renamed into place."""
    print(format_table(metrics, title), flush=True)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {**metrics, "step": step, "settings": files.redact(settings or {})}
    files.atomic_write(out / f"{stem}.json", json.dumps(record, indent=2, default=str) + "\n")
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
    files.atomic_write(out / f"{stem}_predictions.jsonl", lines)
    log.info("wrote %s/%s.json and %s_predictions.jsonl", out, stem, stem)


def to_trackers(metrics, s, stem, step, name):
    """evaluate.py's results in each tracker of REPORT_TO, at the adapter's step: a TensorBoard run of its own in
    OUTPUT_DIR/runs (eval/gsm8k_* and the paired test as text), a W&B run, a trackio run (project "huggingface",
    as training's)."""
    report = settings.trackers(s["REPORT_TO"])
    scalars = {tag: metrics[key] for key, tag in gsm8k.SCALARS.items() if key in metrics}
    paired = "  \n".join(paired_lines(metrics.get("paired")))  # markdown: two spaces end a line
    run_name = f"eval-{stem.removeprefix('eval_')} {name}"
    if "tensorboard" in report:
        from torch.utils.tensorboard import SummaryWriter

        logdir = new_logdir(s["OUTPUT_DIR"], suffix="_eval-" + stem.removeprefix("eval_"))
        with SummaryWriter(log_dir=str(logdir)) as writer:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)
            if paired:
                writer.add_text("eval/paired", paired, step)
        log.info("TensorBoard: %s", logdir)
    config = files.redact(s)
    if "wandb" in report:
        import wandb

        with wandb.init(name=run_name, dir=s["OUTPUT_DIR"], config=config, job_type="eval") as run:
            run.log(
                {**scalars, **({"eval/paired": wandb.Html(f"<pre>{html.escape(paired)}</pre>")} if paired else {})}
            )
    if "trackio" in report:
        import trackio

        run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "huggingface"), name=run_name, config=config)
        run.log({**scalars, **({"eval/paired": trackio.Markdown(paired)} if paired else {})}, step=step)
        trackio.finish()


def format_table(metrics, title="GSM8K"):
    """The metrics as a small aligned text table: each accuracy with its interval, pass@k on one row, and the
    paired test's lines when there is one.

    >>> print(format_table({"n": 10, "strict_accuracy": 0.5, "strict_accuracy_ci95": [0.2366, 0.7634]}, "T"))
    T
      n                                             10
      strict_accuracy             0.500 [0.237, 0.763]
    """
    lines = [title]
    for key, value in metrics.items():
        if key.endswith(gsm8k.INTERVAL) or key == "paired":
            continue
        if key + gsm8k.INTERVAL in metrics:
            value = stats.format_interval(value, *metrics[key + gsm8k.INTERVAL])
        elif key == "pass_at_k":
            value = ", ".join(f"@{k} {v:.3f}" for k, v in value.items())
        lines.append(f"  {key:<26}{value:>22}")
    return "\n".join(lines + [f"  {line}" for line in paired_lines(metrics.get("paired"))])


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


def summary_line(steps, started, metrics=(None, None), dataset="openai/gsm8k", now=time.monotonic):
    """The one line a run ends with: its steps, its wall time since `started`, and the strict and lenient accuracy
    on `dataset`'s test split before -> after training when both were scored (`metrics`: before, after), with the
    paired test when `after` holds one (the accuracies then on the problems both scored).

    >>> scored = ({"strict_accuracy": 0.25, "n": 64}, {"strict_accuracy": 0.5, "n": 64})
    >>> summary_line(50, 0.0, scored, now=lambda: 754.0)
    'finished: 50 steps in 12m34s; GSM8K strict accuracy 0.250 -> 0.500 (64 test problems)'
    """
    before, after = metrics
    minutes, seconds = divmod(round(now() - started), 60)
    line = f"finished: {steps} steps in {minutes}m{seconds:02d}s"
    name = "GSM8K" if dataset == "openai/gsm8k" else f"{Path(str(dataset)).name} test"
    if before and after and "paired" in after:
        strict, lenient = after["paired"]["strict"], after["paired"]["lenient"]
        line += f"; {name} strict accuracy {pair_text(strict)}, lenient {pair_text(lenient)}"
        if sampled := after["paired"].get("sampled"):
            line += f", sampled {pair_text(sampled)}"
        line += f", paired exact test ({strict['n']} test problems)"
    elif before and after:
        line += f"; {name} strict accuracy {before['strict_accuracy']:.3f} -> {after['strict_accuracy']:.3f}"
        line += f" ({after['n']} test problems)"
    elif after:
        line += f"; {name} strict accuracy after {after['strict_accuracy']:.3f} ({after['n']} test problems)"
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


def evaluate_trainer(trainer, when, limit, dataset, batch_size, settings=None, samples=None, check=None):
    """Score the trainer's model (adapter active) on the first `limit` test problems, with training's prompts and
    lengths, and log eval/gsm8k_* at this step through `log_metrics`; the metrics, on every rank (None when `limit`
    is 0). `when`: "before" (step 0), "during" or "after" (this step); `samples` completions per problem (default
    NUM_GENERATIONS; 0 = none) give the sampled accuracy. A "during" or "after" point on problems the run's
    EVAL_BEFORE scored carries the paired test against it (`compare`), also as TensorBoard text eval/paired.

    Each rank generates one contiguous shard of the problems and the rows are gathered on every rank; the main
    process writes the files. Every shard has the same length (the last padded with repeats of the last problem,
    dropped after the gather): under ZeRO-3 and FSDP each forward pass is collective, so every rank must make the
    same generate calls. Outside train() the model is not wrapped yet under DeepSpeed/FSDP: then it is skipped.
    Under vLLM the run's own engine generates, its weights synced first (grpo/weight_sync.py). `check` is called
    between generate calls (a signal's stop, on every rank at once).
    """
    if not limit:
        return None
    if (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled) and not trainer.is_in_train:
        log.warning(
            "EVAL_%s is skipped: under DeepSpeed/FSDP the model is scored inside training only; evaluate the saved "
            "adapter: python evaluate.py --ADAPTER=%s",
            when.upper(),
            trainer.args.output_dir,
        )
        return None
    from accelerate.utils import gather_object

    acc, args = trainer.accelerator, trainer.args
    n = min(limit, len(dataset))
    shard = dataset.select(shard_indices(n, acc.process_index, acc.num_processes))
    thinking = (args.chat_template_kwargs or {}).get("enable_thinking", False)
    samples, desc = args.num_generations if samples is None else samples, f"GSM8K test, {when} training"
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.use_vllm:
            generate = weight_sync.trainer_vllm_generator(trainer, args.max_completion_length, thinking)
        else:  # training's own end-of-turn tokens: Trainer may have rewritten the generation config's
            model, cache = stack.enter_context(generation.generation_ready(trainer)), args.cache_implementation
            generate = generation.hf_generator(
                model, trainer.processing_class, args.max_completion_length, thinking, cache_implementation=cache,
                eos=trainer.eos_token_ids,
            )  # fmt: skip
        rows = generation.generate_all(shard, generate, batch_size, desc, acc.is_main_process, check=check)
        sampler = functools.partial(generate, temperature=args.temperature)
        seed = args.seed
        sampled = generation.sample_all(shard, sampler, samples, batch_size, desc, acc.is_main_process, seed, check)
    # every rank's rows, in rank order: the padding is at the end
    rows, sampled = gather_object(rows)[:n], gather_object(sampled)[: n * samples]
    seconds = time.perf_counter() - start
    metrics, predictions = results(rows, seconds, thinking, sampled, samples, args.temperature)
    step = trainer.state.global_step
    if acc.is_main_process:
        if when != "before" and (paired := paired_with_before(args.output_dir, predictions, samples)):
            metrics["paired"] = paired  # the flips since EVAL_BEFORE on the same problems, and their exact test
        title = f"GSM8K test {when} training (step {step})"
        report(metrics, predictions, args.output_dir, f"eval_test_{when}", step=step, title=title, settings=settings)
        append_eval_point(args.output_dir, when, step, metrics)
    return metrics


def shard_indices(n, rank, world):
    """The problems (of `n`) rank `rank` of `world` scores: one contiguous run of ceil(n / world), padded with
    repeats of the last problem so that every rank makes the same generate calls; in rank order, the padding last.

    >>> [shard_indices(5, rank, 2) for rank in range(2)]
    [[0, 1, 2], [3, 4, 4]]
    """
    per_rank = math.ceil(n / world)
    return [min(i, n - 1) for i in range(rank * per_rank, (rank + 1) * per_rank)]


def scored(output_dir, step):
    """Whether OUTPUT_DIR/eval_test.jsonl holds a held-out point at `step` (a rerun scores a point a stop cut)."""
    path = Path(output_dir) / "eval_test.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return any(json.loads(line).get("step") == step for line in lines if line.strip())


def append_eval_point(output_dir, when, step, metrics):
    """Append one evaluation point to OUTPUT_DIR/eval_test.jsonl (before, each held-out point, after): every point
    of a run is kept, where eval_test_<when>.json holds the latest of each kind."""
    record = {"step": step, "when": when, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "metrics": metrics}
    with open(Path(output_dir) / "eval_test.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
