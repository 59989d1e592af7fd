"""Scoring a model on held-out problems, for evaluate.py and a training run's own points: generate, grade
(grpo/gsm8k.py), write `<stem>.json` and `<stem>_predictions.jsonl`, pair two evaluations of the same problems."""

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

from grpo import errors, files, generation, gsm8k, settings, stats
from grpo.errors import ConfigError

log = logging.getLogger("grpotrainer.evaluation")


def results(rows, seconds, thinking=False, sampled_rows=(), samples=0, temperature=0.0):
    """(metrics, a graded record per row); with `sampled_rows` (`samples` per problem) the sampled accuracy too, and
    in each record `sampled_correct`, how many of its samples were right."""
    predictions = [{**r, **gsm8k.grade(r["completion"], r["gold"], r["truncated"], thinking)} for r in rows]
    metrics = gsm8k.summarize(predictions, [r["completion_tokens"] for r in rows])
    if samples:
        golds, completions = [r["gold"] for r in sampled_rows[::samples]], [r["completion"] for r in sampled_rows]
        cut = [r["truncated"] for r in sampled_rows]
        counts = gsm8k.sampled_counts(golds, completions, samples, thinking, cut)
        metrics |= gsm8k.sampled_summary(counts, samples, temperature)
        for prediction, count in zip(predictions, counts, strict=True):
            prediction["sampled_correct"] = count["correct"]
    return {**metrics, "seconds": round(seconds, 2)}, predictions


def evaluate(dataset, generate, batch_size, desc="GSM8K", thinking=False, *, sampler=None, samples=0, temperature=0.0):
    """Generate for every problem of `dataset` and score: (metrics, predictions); with `samples`, `sampler` (a
    `generate` that samples at `temperature`) writes that many completions per problem for the sampled accuracy."""
    start = time.perf_counter()
    rows = generation.generate_all(dataset, generate, batch_size, desc)
    sampled = generation.sample_all(dataset, sampler, samples, batch_size, desc) if samples else []
    return results(rows, time.perf_counter() - start, thinking, sampled, samples, temperature)


def report(metrics, predictions, output_dir, stem, step=0, title="GSM8K", settings=None):
    """Print the table; write <stem>.json (metrics, settings without credentials) and its _predictions.jsonl."""
    print(format_table(metrics, title), flush=True)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {**metrics, "step": step, "settings": files.redact(settings or {})}
    files.atomic_write(out / f"{stem}.json", json.dumps(record, indent=2, default=str) + "\n")
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
    files.atomic_write(out / f"{stem}_predictions.jsonl", lines)
    log.info("wrote %s/%s.json and %s_predictions.jsonl", out, stem, stem)


def to_trackers(metrics, s, stem, step, name, *, report_to, out):
    """evaluate.py's results at the adapter's step, eval/gsm8k_* and the text eval/paired, in a run of their own in
    each tracker of `report_to` (TensorBoard's under `out`, trackio's in training's project), `s` as its config."""
    report = settings.trackers(report_to)
    scalars = {tag: metrics[key] for key, tag in gsm8k.SCALARS.items() if key in metrics}
    paired = "  \n".join(paired_lines(metrics.get("paired")))  # markdown: two spaces end a line
    run_name = f"eval-{stem.removeprefix('eval_')} {name}"
    if "tensorboard" in report:
        from torch.utils.tensorboard import SummaryWriter

        logdir = new_logdir(out, suffix="_eval-" + stem.removeprefix("eval_"))
        with SummaryWriter(log_dir=str(logdir)) as writer:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, step)
            if paired:
                writer.add_text("eval/paired", paired, step)
        log.info("TensorBoard: %s", logdir)
    config = files.redact(s)
    if "wandb" in report:
        import wandb

        text = {"eval/paired": wandb.Html(f"<pre>{html.escape(paired)}</pre>")} if paired else {}
        with wandb.init(name=run_name, dir=out, config=config, job_type="eval") as run:
            run.log({**scalars, **text})
    if "trackio" in report:
        import trackio

        run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "huggingface"), name=run_name, config=config)
        run.log({**scalars, **({"eval/paired": trackio.Markdown(paired)} if paired else {})}, step=step)
        trackio.finish()


def format_table(metrics, title="GSM8K"):
    """The metrics as an aligned text table: each accuracy with its interval, pass@k on one row, the paired test."""
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
    """{"baseline": name, "strict": stats.paired(...), "lenient": ...} when `predictions` covers the first problems of
    `baseline` in order, else None; "sampled" (stats.paired_samples) too when both drew `samples` > 0 per problem."""
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
    """The paired test as text, one line per accuracy."""
    if not paired:
        return []
    lines = [f"paired with {paired['baseline']} on {paired['strict']['n']} problems (exact McNemar test):"]
    return lines + [f"{label}: {pair_text(test)}" for label, test in paired.items() if label != "baseline"]


def pair_text(test):
    """One paired test as text, with both accuracies on the problems it pairs."""
    return stats.describe_pair(*accuracies(test), test)


def accuracies(test):
    """(before, after) accuracy on the problems a paired test (stats.paired or stats.paired_samples) covers."""
    if "before" in test:
        return test["before"], test["after"]
    return (test["both_right"] + test["down"]) / test["n"], (test["both_right"] + test["up"]) / test["n"]


def flip_lines(baseline, predictions, width=60):
    """One line per problem whose strict or lenient verdict flipped: its index, both flips, its question's start."""
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


def load_evaluation(path, split="test", name="BASELINE", stem=None):
    """(metrics, predictions, file) of an evaluation that `report` wrote: its .json, or a folder holding <stem>.json
    (evaluate.py's name for this data), eval_<split>.json or else eval_<split>_after.json (a training run's)."""
    path = Path(path)
    names = [f"{stem}.json"] if stem else []
    found = [path / f for f in (*names, f"eval_{split}.json", f"eval_{split}_after.json") if (path / f).is_file()]
    path = found[0] if path.is_dir() and found else path
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
    scores = isinstance(metrics, dict) and {"n", "strict_accuracy", "lenient_accuracy"} <= set(metrics)
    verdicts = all(isinstance(p, dict) and {"question", "correct", "strict_correct"} <= set(p) for p in predictions)
    if not (scores and verdicts and len(predictions) == metrics["n"]):
        raise ConfigError(f"{problem} (it lacks the metrics or the per-problem verdicts).\n{fix}")
    return metrics, predictions, path


def load_baseline(path, split, questions, stem=None):
    """`load_evaluation` of an evaluation of exactly `questions`, else a ConfigError naming the first that differs."""
    metrics, predictions, path = load_evaluation(path, split, "BASELINE", stem)
    scored = [p["question"] for p in predictions]
    if scored != list(questions):
        i = next(i for i, (a, b) in enumerate(itertools.zip_longest(scored, questions)) if a != b)
        first = " ".join((scored[i] if i < len(scored) else "(none)").split())[:60]
        raise ConfigError(
            f"BASELINE={path} scored other problems ({len(scored)} there, {len(questions)} here; the first that "
            f"differs: #{i}, {first!r}).\nA paired comparison needs the same DATASET, SPLIT and LIMIT as {path.name}."
        )
    return metrics, predictions, path


def paired_with_before(output_dir, predictions, samples=0):
    """`compare` against the run's eval_test_before.json, else None; one that cannot be read is only warned about."""
    path = Path(output_dir) / "eval_test_before.json"
    if not path.is_file():
        return None
    try:
        metrics, before, _ = load_evaluation(path, name=f"the run's {settings.named('held_out.before')}")
    except ConfigError as err:
        log.warning("no paired test: %s", errors.first_line(err))
        return None
    return compare(before, predictions, path.name, (metrics.get("samples", 0), samples))


def summary_line(steps, started, metrics=(None, None), dataset="openai/gsm8k", now=time.monotonic):
    """The line a run ends with: its steps, its time since `started` and its (before, after) accuracy."""
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
    """A new TensorBoard run folder, output_dir/runs/<date>_<host><suffix>, as transformers names them; under
    TENSORBOARD_LOGGING_DIR an evaluation (a `suffix`) gets a folder of its own, so two never log into one."""
    from transformers.integrations.integration_utils import default_logdir

    chosen = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if chosen and not suffix:
        return chosen
    return os.path.join(chosen or output_dir, default_logdir() + suffix)


def evaluate_trainer(trainer, when, limit, dataset, batch_size, settings=None, samples=0, check=None):
    """The metrics of the trainer's model (adapter on) on the first `limit` test problems (None for no `limit`), on
    every rank, with training's prompts, lengths and `samples` per problem at its temperature; the main process writes
    the files, paired with the run's "before" point. `check` runs between generate calls (a signal's stop, on every
    rank at once). Each rank scores a shard; under vLLM the run's own engine generates, its weights synced first."""
    if not limit:
        return None
    if (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled) and not trainer.is_in_train:
        log.warning(
            f"EVAL_{when.upper()} is skipped: under DeepSpeed/FSDP the model is scored inside training only; evaluate "
            f"the saved adapter: python evaluate.py --ADAPTER={trainer.args.output_dir}"
        )
        return None
    from accelerate.utils import gather_object

    acc, args = trainer.accelerator, trainer.args
    main = acc.is_main_process
    n = min(limit, len(dataset))
    shard = dataset.select(shard_indices(n, acc.process_index, acc.num_processes))
    thinking = (args.chat_template_kwargs or {}).get("enable_thinking", False)
    tokens = args.max_completion_length
    desc = f"GSM8K test, {when} training"
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.use_vllm:
            generate = generation.trainer_vllm_generator(trainer, tokens, thinking)
        else:  # training's own end-of-turn tokens: Trainer may have rewritten the generation config's
            model = stack.enter_context(generation.generation_ready(trainer))
            options = dict(cache_implementation=args.cache_implementation, eos=trainer.eos_token_ids)
            generate = generation.hf_generator(model, trainer.processing_class, tokens, thinking, **options)
        rows = generation.generate_all(shard, generate, batch_size, desc, main, check=check)
        sampler = functools.partial(generate, temperature=args.temperature)
        sampled = generation.sample_all(shard, sampler, samples, batch_size, desc, main, seed=args.seed, check=check)
    # every rank's rows, in rank order: the padding is at the end
    rows, sampled = gather_object(rows)[:n], gather_object(sampled)[: n * samples]
    metrics, predictions = results(rows, time.perf_counter() - start, thinking, sampled, samples, args.temperature)
    step = trainer.state.global_step
    if main:
        if when != "before" and (paired := paired_with_before(args.output_dir, predictions, samples)):
            metrics["paired"] = paired
        title = f"GSM8K test {when} training (step {step})"
        report(metrics, predictions, args.output_dir, f"eval_test_{when}", step=step, title=title, settings=settings)
        append_eval_point(args.output_dir, when, step, metrics)
    return metrics


def shard_indices(n, rank, world):
    """The problems (of `n`) that rank `rank` of `world` scores: ceil(n / world) in a row, padded with the last
    problem, as under ZeRO-3 and FSDP every forward pass is collective and every rank must make the same calls."""
    per_rank = math.ceil(n / world)
    return [min(i, n - 1) for i in range(rank * per_rank, (rank + 1) * per_rank)]


def scored(output_dir, step):
    """Whether output_dir/eval_test.jsonl holds a held-out point at `step`."""
    path = Path(output_dir) / "eval_test.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return any(json.loads(line).get("step") == step for line in lines if line.strip())


def append_eval_point(output_dir, when, step, metrics):
    """Append a point to output_dir/eval_test.jsonl, which keeps them all (eval_test_<when>.json the latest)."""
    record = {"step": step, "when": when, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "metrics": metrics}
    with open(Path(output_dir) / "eval_test.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
