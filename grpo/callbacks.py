"""The training run's callbacks: what it logs, advises and scores while it trains, and how a signal stops it.
Numbers go through the trainer's log or `publish`, texts through `publish`: TensorBoard, W&B and trackio see the same.
"""

import html
import logging
import math
import re
import signal
import sys
import time
from itertools import zip_longest
from pathlib import Path

import markdown
from transformers import TrainerCallback

from grpo import advice, evaluation, files, grading, gsm8k, patches, plan, process, settings

log = logging.getLogger("grpotrainer.monitor")


class StopOnSignal(process.GracefulStop, TrainerCallback):
    """GracefulStop's handlers from the first step on; the processes agree at each step end."""

    def on_train_begin(self, args, state, control, **kwargs):
        process.raise_pending()  # a signal during the model load that a finalizer swallowed: stop before any step
        for signum in self.signals:
            self.previous[signum] = signal.signal(signum, self.handle)

    def on_step_begin(self, args, state, control, **kwargs):
        with self.deciding:
            self.step = state.global_step
            self.between = False

    def on_step_end(self, args, state, control, **kwargs):
        stop = process.any_rank(self.received is not None, args.device)  # a collective: outside the timer's lock
        with self.deciding:
            self.between = True
            if stop and self.signal_name is None:
                self.signal_name = signal.Signals(self.received).name if self.received else "a signal on another rank"
                self.stopped_at = state.global_step
                control.should_save = control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        self.newest = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self.signal_name is not None and self.saved is None:
            self.saved = self.newest

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()


# TensorBoard's Custom Scalars tab: the README's charts, so a run opens on them rather than on TRL's ~40 tags
# (Multiline tags are regular expressions); each held-out metric on a chart of its own.
HELD_OUT = {  # title: tag, drawn with its 95 % interval (a rate without one: the value itself)
    "strict accuracy (#### N)": "eval/gsm8k_strict_accuracy",
    "lenient accuracy (any answer form)": "eval/gsm8k_lenient_accuracy",
    "sampled accuracy (at TEMPERATURE)": "eval/gsm8k_sampled_accuracy",
    "format rate": "eval/gsm8k_format_rate",
    "padded rate": "eval/gsm8k_padded_rate",
}
LAYOUT = {
    "GRPO health": {
        "reward": ["Multiline", ["train/reward$", r"train/rewards/.*/mean$"]],
        "tied groups (ours; TRL's zero std)": [
            "Multiline",
            ["train/frac_tied_groups$", "train/frac_reward_zero_std$"],
        ],
        "kl (BETA > 0) or entropy": ["Multiline", ["train/kl$", "train/entropy$"]],
        "grad_norm": ["Multiline", ["train/grad_norm$"]],
        "clipped and padded": ["Multiline", ["train/completions/clipped_ratio$", "train/completions/padded_ratio$"]],
        "seconds per step": ["Multiline", ["perf/seconds_per_step$"]],
        "generation's share of a step": ["Multiline", ["perf/generation_share$"]],
    },
    # Margin charts: each point a measurement, drawn as it is. TensorBoard draws Margin charts in reverse order.
    "GSM8K held out": {
        title: ["Margin", [tag, f"{tag}_ci95_low", f"{tag}_ci95_high"] if "accuracy" in tag else [tag, tag, tag]]
        for title, tag in reversed(HELD_OUT.items())
    },
}


def publish(trainer, step, scalars=None, texts=None, alerts=()):
    """Numbers and markdown texts at `step` to each tracker of the run by its own API (the trainer's log would file
    them under train/ and drop the texts): W&B at train/global_step, as transformers logs; trackio once its callback
    opened the run, at the first log. `alerts` (Advice) go as W&B's and trackio's alerts. Main process only."""
    scalars, texts = scalars or {}, texts or {}
    report = trainer.args.report_to or []
    if not trainer.accelerator.is_main_process or not (scalars or texts):
        return
    if (writer := getattr(tensorboard_callback(trainer), "tb_writer", None)) is not None:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
        for tag, text in texts.items():
            writer.add_text(tag, text, step)
        writer.flush()
    wandb, trackio = sys.modules.get("wandb"), sys.modules.get("trackio")
    if "wandb" in report and wandb and wandb.run is not None:
        html_texts = {tag: wandb.Html(markdown.markdown(text, extensions=["tables"])) for tag, text in texts.items()}
        wandb.run.log({**scalars, **html_texts, "train/global_step": step})
        for a in alerts:
            level = getattr(wandb.AlertLevel, "ERROR" if a.level == "stop" else "WARN")
            wandb.run.alert(title=f"{a.level} {a.signal}", text=a.message, level=level)
    if "trackio" in report and trackio and (run := trackio.context_vars.current_run.get()) is not None:
        run.log({**scalars, **{tag: trackio.Markdown(text) for tag, text in texts.items()}}, step=step)
        for a in alerts:
            level = getattr(trackio.AlertLevel, "ERROR" if a.level == "stop" else "WARN")
            run.alert(f"{a.level} {a.signal}", a.message, level, step=step)


class HealthMonitor(TrainerCallback):
    """Prints and publishes the advice (health/advice, alerts); on a NaN every rank (all read the same averaged logs)
    stops at the same log, saving no more: the last good weights stay. `fixed`: what a profile sets on purpose."""

    def __init__(self, thresholds, trainer, fixed=()):
        self.advisor = advice.Advisor(thresholds, fixed=fixed)
        self.trainer = trainer
        self.layout_written = False

    @property
    def stopped(self):
        return self.advisor.stop

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.advisor.settings.update({name: getattr(args, name, None) for name in advice.CONFIG})
        self.advisor.settings["vocab_size"] = getattr(getattr(model, "config", None), "vocab_size", None)

    def on_log(self, args, state, control, logs, **kwargs):
        if any(key.startswith("eval_") for key in logs):  # a held-out point (HeldOutEval), not a training log
            return
        if "reward" in logs and (rewards := patches.latest_rewards(self.trainer)):
            weights = args.reward_weights or [1.0] * len(rewards)
            # into the log itself: the trackers' callbacks, after this one (`install`), record it as train/...
            logs["frac_tied_groups"] = advice.tied_fraction(rewards, weights, args.num_generations)
        shown = self.advisor.update(logs, state.global_step)
        if self.advisor.stop:
            control.should_training_stop = True
            control.should_save = False
        if not state.is_world_process_zero:
            return
        # at the first log: TensorBoard's writer opens at train begin, after this callback's own
        writer = getattr(tensorboard_callback(self.trainer), "tb_writer", None)
        if not self.layout_written and writer is not None:
            writer.add_custom_scalars(LAYOUT)
            self.layout_written = True
        for a in shown:
            log.warning("health %s", a)
        if shown:
            text = "\n\n".join(f"**{a.level.upper()}** {md(a.message)}" for a in shown)
            alerts = [a for a in shown if a.level != "ok"]
            publish(self.trainer, state.global_step, texts={"health/advice": text}, alerts=alerts)

    def on_step_end(self, args, state, control, **kwargs):
        if self.advisor.stop:  # the flow callback may ask for a save at this step; the weights are not worth it
            control.should_save = False

    on_epoch_end = on_step_end


class HeldOutEval(TrainerCallback):
    """Held-out accuracy at the trainer's step (`log_point`): `before` problems as the first step begins, `subset`
    every `every` steps (-1: each 10 % of the run; the last step is `after`'s), `after` at the end unless `finished()`
    says the run stopped; `scoring`: evaluate_trainer's other arguments. A signal while it scores ends it at once
    (`stopper.evaluating`): the step (at the end the adapter) is saved, unfinished, for the same command to score."""

    def __init__(self, trainer, stopper, every, subset, scoring, before=0, after=0, finished=lambda: True):
        self.trainer, self.stopper = trainer, stopper
        self.every, self.subset, self.before, self.after = every, subset, before, after
        self.scoring = scoring
        self.finished = finished
        self.metrics = {}  # "before", "after", or the step of a point during training -> its metrics
        self.interrupted = None  # what a signal cut short: "before", "during" or "after"

    def score(self, when, limit, key=None):
        """Score `limit` problems now as `when`, kept under `key` (default `when`); False if a signal cut it short."""
        with self.stopper.evaluating(when, self.trainer.args.device) as scoring:
            metrics = evaluation.evaluate_trainer(self.trainer, when, limit=limit, check=scoring.check, **self.scoring)
        if scoring.cut:
            self.interrupted, self.stopper.stopped_at = when, self.trainer.state.global_step
            return False
        if metrics is not None:
            self.metrics[when if key is None else key] = metrics
            log_point(self.trainer, metrics)
        return True

    def on_step_begin(self, args, state, control, **kwargs):
        # at the first step, not at on_train_begin: there this callback runs before the trackers open their runs
        step = state.global_step
        if step == 0 and "before" not in self.metrics:
            self.score("before", self.before)
        elif step in self.due(state) and step not in self.metrics and not evaluation.scored(args.output_dir, step):
            self.score("during", self.subset, key=step)  # resumed at a point a signal cut short: the rerun does it
        if self.interrupted:
            control.should_training_stop = True

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.due(state) and not self.score("during", self.subset, key=state.global_step):
            control.should_save = control.should_training_stop = True

    def due(self, state):
        return plan.eval_steps(self.every, state.max_steps, final=bool(self.after))

    def on_train_end(self, args, state, control, **kwargs):
        if self.finished() and not self.interrupted:
            self.score("after", self.after)


def log_point(trainer, metrics):
    """A held-out point as eval/gsm8k_* (each interval as _ci95_low and _ci95_high) at the trainer's step, to every
    callback and log_history, and its paired test as the text eval/paired. Through transformers' Trainer.log, whose
    `eval_` prefix the trackers write as `eval/`: GRPOTrainer.log would average TRL's buffer into it and clear it."""
    from transformers import Trainer

    logs = {}
    for key, tag in gsm8k.SCALARS.items():
        name = "eval_" + tag.removeprefix("eval/")
        logs |= {name: metrics[key]} if key in metrics else {}
        low_high = metrics.get(key + gsm8k.INTERVAL)
        logs |= {f"{name}_ci95_low": low_high[0], f"{name}_ci95_high": low_high[1]} if low_high else {}
    tensorboard = tensorboard_callback(trainer)
    if tensorboard is not None and not tensorboard.logging_dir:  # TENSORBOARD_LOGGING_DIR="" (name_run names the rest)
        tensorboard.logging_dir = evaluation.new_logdir(trainer.args.output_dir)  # output_dir/runs, not ./runs
    Trainer.log(trainer, logs)
    if lines := evaluation.paired_lines(metrics.get("paired")):  # markdown: two spaces end a line
        publish(trainer, trainer.state.global_step, texts={"eval/paired": "  \n".join(lines)})


class CompletionSamples(TrainerCallback):
    """Every `every` steps (0 = never), a table of a few completions of the newest batch (completions/samples). TRL
    writes their records (completions/completions_NNNNN.parquet) at a log while the trainer's `log_completions` is on
    (the steps due), after the callbacks' `on_log`: the table is made as the next step begins, or at the next save."""

    def __init__(self, trainer, every):
        self.trainer = trainer
        self.every = every
        self.pending = None  # the step of a log whose records TRL is about to write

    def on_step_end(self, args, state, control, **kwargs):  # before this step's log
        self.trainer.log_completions = bool(self.every) and state.global_step % self.every == 0

    def on_log(self, args, state, control, logs=None, **kwargs):  # before TRL writes the records of this log
        if "reward" in (logs or {}):  # a new batch was generated since the last log
            self.pending = state.global_step
        else:  # none since (the train-end summary): TRL would write the last table a second time
            self.trainer.log_completions = False

    def on_step_begin(self, args, state, control, **kwargs):
        step, self.pending = self.pending, None
        path = Path(args.output_dir) / "completions" / f"completions_{step or 0:05d}.parquet"
        if step is None or not state.is_world_process_zero or not path.is_file():
            return
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()  # one dict per completion, in batch order
        if rows := sample_rows(records, self.trainer.reward_func_names):
            publish(self.trainer, step, texts={"completions/samples": render_table(rows)})

    on_save = on_step_begin  # the last step's table: the final checkpoint is saved after the log, before train end


def sample_rows(records, reward_names, n=4):
    """Up to `n` of TRL's completion records, round robin over their prompts, in batch order."""
    questions = [question_of(r.get("prompt")) for r in records]
    groups = {}  # question -> indices of its completions, in batch order
    for i, question in enumerate(questions):
        groups.setdefault(question, []).append(i)
    round_robin = [i for rank in zip_longest(*groups.values()) for i in rank if i is not None]
    rows = []
    for i in sorted(round_robin[:n]):
        record, text = records[i], grading.completion_to_text(records[i].get("completion"))
        extracted = record["extracted"] if "extracted" in record else grading.extract_answer(text)
        row = dict(question=questions[i], completion=text, extracted=extracted, gold=record.get("gold"))
        rewards = {name: record.get(name) for name in reward_names}
        rows.append(row | {"rewards": rewards, "advantage": record.get("advantage")})
    return rows


def question_of(prompt):
    """The user's text of a chat prompt (its last user message), or the prompt itself when it is plain text."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    return grading.completion_to_text([{"content": users[-1]}]) if users else ""


def render_table(rows, max_chars=1500):
    """A markdown table of sample rows. Model output is data: every cell is escaped (see `md`)."""
    names = list(rows[0]["rewards"])
    header = ["question", "completion", "extracted", "gold", *names, "advantage"]
    lines = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        extracted, gold = row["extracted"], row["gold"]
        cells = [md(row["question"], max_chars), md(row["completion"], max_chars)]
        cells += [md("-" if extracted is None else extracted), md("?" if gold is None else gold)]
        numbers = [*(row["rewards"][name] for name in names), row["advantage"]]  # "-" for none or NaN
        cells += ["-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}" for v in numbers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|])")  # what Python-Markdown (TensorBoard's) lets one escape


def md(text, max_chars=None):
    """`text` as literal markdown for one table cell. TensorBoard sanitises HTML after rendering, which would drop
    a model's `<think>` tags: so punctuation is escaped, `&<>` become entities and line breaks `<br>`."""
    text = str(text)
    if max_chars and len(text) > max_chars:
        text = text[:max_chars] + f" ... ({len(text) - max_chars} more characters)"
    text = html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)
    return "<br>".join(text.splitlines())  # \r, \r\n, \x0b, \u2028, ...: each breaks a row


def install(trainer, s, record, stopper, eval_dataset, resumed, fixed=()):
    """The run's callbacks on `trainer` and its name in every tracker; returns the HealthMonitor and the HeldOutEval,
    which say how the run ended."""
    health = HealthMonitor(advice.Thresholds.from_settings(s), trainer, fixed=fixed)
    h = settings.config_kwargs(s, "held_out.")
    scoring = dict(dataset=eval_dataset, batch_size=h["batch_size"], settings=record, samples=h["samples"])
    points = dict(every=h["every"], subset=h["subset"], before=0 if resumed else h["before"], after=h["after"])
    held_out = HeldOutEval(
        trainer, stopper, scoring=scoring, finished=lambda: not (stopper.signal_name or health.stopped), **points
    )
    # first (transformers calls callbacks in order): the trackers then record the frac_tied_groups that the health
    # monitor adds to a log, and the "after" point before their own on_train_end closes their runs
    trainer.callback_handler.callbacks[:0] = [held_out, health]
    samples = CompletionSamples(trainer, s["LOG_COMPLETIONS_STEPS"])
    trainer.callback_handler.callbacks += [stopper, PerfMonitor(trainer), *patches.callbacks(trainer), samples]
    name_run(trainer, resumed)
    return health, held_out


def name_run(trainer, resumed=None):
    """Name the run after its output folder, a resumed segment after its checkpoint, unless --run_name or
    TENSORBOARD_LOGGING_DIR chose: TensorBoard's runs/<folder>_<date>_<host>[_resumed-at-N] and the run_name."""
    from transformers.integrations.integration_utils import default_logdir

    name = Path(trainer.args.output_dir).resolve().name
    step = files.checkpoint_step(resumed) if resumed else None
    if trainer.args.run_name in (None, trainer.args.output_dir):  # TrainingArguments' default is output_dir
        trainer.args.run_name = name + (f" (resumed at step {step})" if step is not None else "")
    tensorboard = tensorboard_callback(trainer)
    if tensorboard is not None and tensorboard.logging_dir is None:
        folder = f"{name}_{Path(default_logdir()).name}" + (f"_resumed-at-{step}" if step is not None else "")
        tensorboard.logging_dir = str(Path(trainer.args.output_dir) / "runs" / folder)


def tensorboard_callback(trainer):
    from transformers.integrations import TensorBoardCallback

    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TensorBoardCallback)), None)


class PerfMonitor(TrainerCallback):
    """Two steps after the first and at every tenth of the run: the pace, the ETA and generation's share (perf/*),
    and once generation's lever when it dominates. The first step (compilation, warm-up) is left out of the pace."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.clock = patches.time_generation(trainer)
        self.start = None  # (step, time, generation seconds) at the end of the first step
        self.advised = False

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.start is None:
            self.start = (state.global_step, now, self.clock["seconds"])
            return
        step0, t0, g0 = self.start
        steps = state.global_step - step0
        report_every = max(1, round(state.max_steps / 10))
        if steps < 2 or not (steps == 2 or state.global_step % report_every == 0) or not state.is_world_process_zero:
            return
        per_step = (now - t0) / steps
        share = min(1.0, (self.clock["seconds"] - g0) / max(now - t0, 1e-9))
        log.info(advice.progress_line(state.global_step, state.max_steps, per_step, share))
        sequences = args.per_device_train_batch_size * args.steps_per_generation  # one call's
        lever = None if self.advised or args.use_cpu else advice.generation_advice(share, args.use_vllm, sequences)
        if lever:
            log.warning("perf %s", lever)
            self.advised = True
        eta_hours = (state.max_steps - state.global_step) * per_step / 3600
        scalars = {"perf/seconds_per_step": per_step, "perf/generation_share": share, "perf/eta_hours": eta_hours}
        publish(self.trainer, state.global_step, scalars, {"perf/advice": md(lever)} if lever else {})
