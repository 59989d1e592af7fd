"""Watching a GRPO run from TensorBoard: sample completions (CompletionSamples), and advice that names the constant
to change when training goes wrong (HealthMonitor, whose decisions are the Advisor's, on plain log dicts).

The signals, their thresholds (constants in grpotrainer.py) and the advice are tabled in docs/troubleshooting.md.
Groups are counted tied by our own `tied_fraction`: TRL's frac_reward_zero_std misses float32 ties. A NaN or inf
loss, grad_norm, kl or reward stops training; the last checkpoint stays as it was and the final save is skipped.
"""

import contextlib
import functools
import html
import json
import logging
import math
import re
import time
from collections import deque
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from transformers import TrainerCallback

from grpo import cli, grading, gsm8k, plan

HEALTHY_EVERY = 25  # logs between "healthy" lines while no advice fires: silence must not read as a dead monitor
TIE_TOLERANCE = 1e-5  # a group is tied when its rewards differ by less than this share of the batch's reward scale
REPEAT_AFTER = 20  # logs before an advisory that keeps firing is shown again (at once if it gets more severe)
LEVELS = {"ok": 0, "warn": 1, "act": 2, "stop": 3}
HEALTH_KEYS = ("reward", "kl", "frac_tied_groups", "grad_norm")  # quoted by the "healthy" line
SOLVED_MOST = 0.8  # correctness above which tied groups are mostly all right (levers: a larger group, harder data)
FLAT_NEEDS_SIGNAL = 0.5  # the flat-reward advice needs frac_reward_zero_std below this, on average over its window
log = logging.getLogger("grpotrainer.monitor")


@dataclass(frozen=True)
class Thresholds:
    """When each signal fires; every field feeds from the grpotrainer constant of the same name in capitals."""

    kl_warn: float
    kl_act: float
    zero_std_frac: float
    zero_std_logs: int
    reward_flat_window: int
    reward_flat_delta: float
    clipped_ratio_max: float
    grad_norm_max: float = math.inf
    entropy_max_frac: float = 0.9  # entropy above this share of log(vocab size) reads as uniform noise
    entropy_logs: int = 3  # ... for this many logs in a row
    padded_rise: float = 0.2  # completions/padded_ratio this far above the run's lowest reads as learned padding
    padded_logs: int = 3  # ... for this many logs in a row

    @classmethod
    def from_settings(cls, s):
        return cls(
            kl_warn=s["KL_WARN"],
            kl_act=s["KL_ACT"],
            zero_std_frac=s["ZERO_STD_FRAC"],
            zero_std_logs=s["ZERO_STD_LOGS"],
            reward_flat_window=s["REWARD_FLAT_WINDOW"],
            reward_flat_delta=s["REWARD_FLAT_DELTA"],
            clipped_ratio_max=s["CLIPPED_RATIO_MAX"],
            grad_norm_max=s["GRAD_NORM_MAX"],
        )


@dataclass(frozen=True)
class Advice:
    signal: str  # kl, zero_std, flat_reward, clipped, nan
    level: str  # warn, act or stop
    message: str

    def __str__(self):
        return f"{self.level.upper()} {self.signal}: {self.message}"


class Advisor:
    """Turns a stream of training logs (keys as callbacks get them, without "train/") into advisories; pure.
    `settings` holds the GRPOConfig values in force (beta, learning_rate, ...) so that advice can quote them."""

    def __init__(self, thresholds, settings=None, repeat_after=REPEAT_AFTER, healthy_every=HEALTHY_EVERY):
        self.t = thresholds
        self.settings = dict(settings or {})
        self.repeat_after = repeat_after
        self.healthy_every = healthy_every  # an "ok healthy" line after this many quiet logs; 0 = never
        self._quiet = 0
        self.stop = None  # the Advice that stopped training, once a NaN was seen
        self.logs_seen = 0
        self._zero_std_run = 0
        self._entropy_run, self._entropy_first = 0, None
        self._padded_run, self._padded_low = 0, None
        self._rewards = deque(maxlen=max(thresholds.reward_flat_window, 2))
        self._signal = deque(maxlen=max(thresholds.reward_flat_window, 2))  # frac_reward_zero_std beside each reward
        self._shown = {}  # signal -> (log index, level) it was last shown at

    def update(self, logs, step=None):
        self.logs_seen += 1
        fired = [a for a in (self._nan(logs, step), self._kl(logs), self._zero_std(logs)) if a]
        fired += [a for a in (self._flat_reward(logs), self._clipped(logs), self._diverging(logs)) if a]
        fired += [a for a in (self._padded(logs),) if a]
        if self.stop is None and (stop := next((a for a in fired if a.level == "stop"), None)):
            self.stop = stop
        self._quiet = 0 if fired else self._quiet + 1
        if self.healthy_every and self._quiet and self._quiet % self.healthy_every == 0:
            return [self._healthy(logs, step)]
        return [a for a in fired if self._due(a)]

    def _healthy(self, logs, step):
        seen = ", ".join(f"{key} {logs[key]:.3g}" for key in HEALTH_KEYS if isinstance(logs.get(key), (int, float)))
        at = f"at step {step} " if step is not None else ""
        return Advice("healthy", "ok", f"{at}no advice for {self._quiet} logs ({seen}).")

    def _due(self, advice):
        last = self._shown.get(advice.signal)
        due = last is None or LEVELS[advice.level] > LEVELS[last[1]] or self.logs_seen - last[0] >= self.repeat_after
        if due:
            self._shown[advice.signal] = (self.logs_seen, advice.level)
        return due

    def _setting(self, name, fallback="?"):
        value = self.settings.get(name)
        return fallback if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    # Each rule reads one signal from the log and returns an Advice, or None when the signal is quiet.

    def _nan(self, logs, step):
        # Trainer replaces a NaN loss by the running mean in its logs (logging_nan_inf_filter), so grad_norm is the
        # reliable sign; TRL logs a reward of None when every reward function returned None or NaN for every row.
        for key in ("loss", "grad_norm", "kl", "reward"):
            value = logs.get(key, 0.0)
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                break
        else:
            return None
        at = f"{key} is {value}" + (f" at step {step}" if step is not None else "")
        kept = "The newest checkpoint-N in OUTPUT_DIR is kept as it was; the final adapter is not written."
        if key == "reward":
            why = (
                "every reward function returned None, NaN or inf for every completion, so there is nothing to "
                f"learn from and training stops. Check the functions in REWARD_FUNCS. {kept}"
            )
        else:
            why = (
                f"the weights are diverging, so training stops before they are saved. {kept} Lower LEARNING_RATE "
                f"(now {self._setting('learning_rate')}) or raise BETA (now {self._setting('beta')}); a resumed run "
                "keeps the checkpoint's learning rate, so start a fresh OUTPUT_DIR to change it."
            )
        return Advice("nan", "stop", f"{at}: {why}")

    def _kl(self, logs):
        kl = logs.get("kl")
        if not isinstance(kl, (int, float)) or not kl > self.t.kl_warn:
            return None
        beta, lr = self._setting("beta"), self._setting("learning_rate")
        if kl > self.t.kl_act:
            return Advice(
                "kl",
                "act",
                f"kl is {kl:.3g} (> KL_ACT={self.t.kl_act:g}): the policy has drifted far from the reference model "
                f"and is likely exploiting the reward or collapsing. Raise BETA (now {beta}; e.g. double it) and "
                f"lower LEARNING_RATE (now {lr}; e.g. halve it).",
            )
        return Advice(
            "kl",
            "warn",
            f"kl is {kl:.3g} (> KL_WARN={self.t.kl_warn:g}): the policy is moving away from the reference model. "
            f"Watch train/kl; above KL_ACT={self.t.kl_act:g} raise BETA (now {beta}) or lower LEARNING_RATE "
            f"(now {lr}).",
        )

    def _zero_std(self, logs):
        frac = tie_share(logs)
        if not isinstance(frac, (int, float)):
            return None
        self._zero_std_run = self._zero_std_run + 1 if frac >= self.t.zero_std_frac else 0
        if self._zero_std_run < self.t.zero_std_logs:
            return None
        n, temperature = self._setting("num_generations"), self._setting("temperature")
        solved = logs.get("rewards/correctness_reward/mean")
        fix = (
            f"The model already solves {solved:.0%} of its problems, so most groups are all right: raise "
            f"NUM_GENERATIONS (now {n}) so more groups hold a wrong answer, TEMPERATURE (now {temperature}) for more "
            "varied ones, or train on a harder subset (DATASET: the problems evaluate.py's predictions get wrong)."
            if isinstance(solved, (int, float)) and solved >= SOLVED_MOST
            else "Check that the reward tells the responses apart (see completions/samples in the Text tab), or "
            f"raise NUM_GENERATIONS (now {n}) or TEMPERATURE (now {temperature}) for more varied groups."
        )
        return Advice(
            "zero_std",
            "warn",
            f"in {frac:.0%} of groups all {n} completions got the same reward, for {self._zero_std_run} logs in a "
            f"row (frac_tied_groups >= ZERO_STD_FRAC={self.t.zero_std_frac:g} for ZERO_STD_LOGS="
            f"{self.t.zero_std_logs}): such groups have zero advantage and teach nothing. {fix}",
        )

    def _flat_reward(self, logs):
        reward = logs.get("reward")
        window = self.t.reward_flat_window
        if not isinstance(reward, (int, float)) or not math.isfinite(reward) or window < 2:
            return None
        self._rewards.append(reward)
        self._signal.append(tie_share(logs) or 0.0)
        # A plateau where most groups score all alike is zero_std's case, and the usual prelude to a jump: GRPO
        # waits for the rare group that tells its completions apart. Flat counts only while most groups carry signal.
        if len(self._rewards) < window or sum(self._signal) / len(self._signal) >= FLAT_NEEDS_SIGNAL:
            return None
        values = list(self._rewards)
        # Halves of the window, not first and last values: a per-step reward is noisy, its running mean is not.
        before, after = sum(values[: window // 2]) / (window // 2), sum(values[window // 2 :]) / (window - window // 2)
        if abs(after - before) >= self.t.reward_flat_delta:
            return None
        return Advice(
            "flat_reward",
            "warn",
            f"the mean reward has been flat for {window} logs ({before:.3f} -> {after:.3f}, a change under "
            f"REWARD_FLAT_DELTA={self.t.reward_flat_delta:g} over REWARD_FLAT_WINDOW={window}). If it is near its "
            "maximum the run has converged; otherwise check that the reward tells the responses apart "
            "(frac_tied_groups, completions/samples), or raise LEARNING_RATE "
            f"(now {self._setting('learning_rate')}) while train/kl stays low.",
        )

    def _clipped(self, logs):
        ratio = logs.get("completions/clipped_ratio")
        if not isinstance(ratio, (int, float)) or not ratio > self.t.clipped_ratio_max:
            return None
        length, padded = self._setting("max_completion_length"), logs.get("completions/padded_ratio")
        fix = (
            f"Many of them pad past their answer (completions/padded_ratio {padded:.0%}): a longer limit leaves more "
            "room to pad and masking hides what it costs, so change neither (see the padded advice)."
            if isinstance(padded, (int, float)) and padded >= ratio / 2
            else "Raise MAX_COMPLETION_LENGTH, or set MASK_TRUNCATED_COMPLETIONS=True to leave them out of the loss."
        )
        return Advice(
            "clipped",
            "warn",
            f"{ratio:.0%} of completions hit MAX_COMPLETION_LENGTH (now {length} tokens) unfinished (completions/"
            f"clipped_ratio > CLIPPED_RATIO_MAX={self.t.clipped_ratio_max:g}): a cut-off completion earns no reward. "
            f"{fix}",
        )

    def _padded(self, logs):
        """The model learning to go on past its answer (`#### 5` repeated to the limit): the rewards logged the share
        of such completions (completions/padded_ratio); it fires when that share climbs above the run's lowest."""
        share = logs.get("completions/padded_ratio")
        if not isinstance(share, (int, float)) or not math.isfinite(share):
            return None
        self._padded_low = share if self._padded_low is None else min(self._padded_low, share)
        self._padded_run = self._padded_run + 1 if share >= self._padded_low + self.t.padded_rise else 0
        if self._padded_run < self.t.padded_logs:
            return None
        fix = (
            "but MASK_TRUNCATED_COMPLETIONS=True leaves those that pad to the limit out of the loss: set it False."
            if self.settings.get("mask_truncated_completions")
            else "a REWARD_FUNCS entry of your own that pays them should score 0 where grpo.grading.pads_answer is "
            "true; with none, the padding spreads in groups that score all alike (frac_tied_groups): raise "
            f"NUM_GENERATIONS (now {self._setting('num_generations')}) or TEMPERATURE (now "
            f"{self._setting('temperature')})."
        )
        return Advice(
            "padded",
            "warn",
            f"{share:.0%} of completions repeat or pad past their final answer (completions/padded_ratio, up from "
            f"{self._padded_low:.0%} for {self._padded_run} logs): the model is learning to go on after its answer "
            "('#### 5' repeated, filler, another question). The registry's rewards pay such completions nothing; "
            f"{fix} Read completions/samples.",
        )

    def _diverging(self, logs):
        """Divergence without a NaN: the gradient norm explodes, or the entropy climbs to that of uniform noise."""
        grad_norm, entropy, vocab = logs.get("grad_norm"), logs.get("entropy"), self.settings.get("vocab_size")
        lr = f"Lower LEARNING_RATE (now {self._setting('learning_rate')}; e.g. 10x), from an earlier checkpoint."
        if isinstance(grad_norm, (int, float)) and self.t.grad_norm_max < grad_norm < math.inf:  # inf: the NaN rule
            return Advice(
                "diverging",
                "act",
                f"grad_norm is {grad_norm:.3g} (> GRAD_NORM_MAX={self.t.grad_norm_max:g}): "
                f"the updates are exploding. {lr}",
            )
        if not isinstance(entropy, (int, float)) or not vocab or not math.isfinite(entropy):
            return None
        top = self.t.entropy_max_frac * math.log(vocab)
        self._entropy_first = entropy if self._entropy_first is None else self._entropy_first
        self._entropy_run = self._entropy_run + 1 if entropy >= top else 0
        if self._entropy_run < self.t.entropy_logs or self._entropy_first >= top:
            return None  # a model that starts as noise (a random one) has not diverged
        return Advice(
            "diverging",
            "act",
            f"entropy is {entropy:.3g} nats, {entropy / math.log(vocab):.0%} of uniform noise over "
            f"{vocab} tokens, for {self._entropy_run} logs (it began at {self._entropy_first:.3g}): the model has "
            f"stopped producing text. {lr}",
        )


def tie_share(logs):
    """The share of tied groups in a log: our `frac_tied_groups`, else TRL's frac_reward_zero_std, else None."""
    for key in ("frac_tied_groups", "frac_reward_zero_std"):
        if isinstance(logs.get(key), (int, float)):
            return logs[key]
    return None


def tied_fraction(rewards, weights, group, tolerance=TIE_TOLERANCE):
    """The share of groups (`group` consecutive completions, as TRL orders them) whose weighted total rewards are
    all within `tolerance` times the batch's largest |reward|, so float rounding does not hide a tie. A None or NaN
    reward counts as 0, as TRL's nansum counts it. None for an empty batch.

    >>> tied_fraction([[1.0] * 8 + [0.0] * 7 + [1.0]], [1.2], 8)
    0.5
    """
    totals = [
        sum(w * (r if r is not None and math.isfinite(r) else 0.0) for w, r in zip(weights, row, strict=True))
        for row in zip(*rewards, strict=True)
    ]
    groups = [totals[i : i + group] for i in range(0, len(totals) - group + 1, group)]
    if not groups:
        return None
    slack = tolerance * max(abs(v) for v in totals)
    return sum(max(g) - min(g) <= slack for g in groups) / len(groups)


def latest_rewards(trainer):
    """The newest batch's rewards, one list per reward function, over all processes. GRPOTrainer keeps them in
    its private `_logs` and has no public hook: read here only, None when missing (another TRL version)."""
    logs = getattr(trainer, "_logs", None)
    if not isinstance(logs, dict) or "rewards" not in logs:
        return None
    return [list(logs["rewards"][name]) for name in trainer.reward_func_names]


# TensorBoard's Custom Scalars tab: the charts README's table names, one per row, so a run opens on them rather
# than on TRL's ~40 tags in alphabetical order (Multiline tags are regular expressions)
LAYOUT = {
    "GRPO health": {
        "reward": ["Multiline", ["train/reward$", r"train/rewards/.*/mean$"]],
        "tied groups (ours; TRL's zero std)": [
            "Multiline",
            ["train/frac_tied_groups$", "train/frac_reward_zero_std$"],
        ],
        "kl": ["Multiline", ["train/kl$"]],
        "grad_norm": ["Multiline", ["train/grad_norm$"]],
        "entropy": ["Multiline", ["train/entropy$"]],
        "clipped and padded": ["Multiline", ["train/completions/clipped_ratio$", "train/completions/padded_ratio$"]],
        "loss": ["Multiline", ["train/loss$"]],
    },
    "GSM8K held out": {"accuracy": ["Multiline", [r"eval/gsm8k_.*accuracy$", "eval/gsm8k_format_rate$"]]},
}


SETTINGS = (
    "beta",
    "learning_rate",
    "num_generations",
    "temperature",
    "max_completion_length",
    "mask_truncated_completions",
)


class HealthMonitor(TrainerCallback):
    """Prints the Advisor's advisories and writes them to TensorBoard (health/advice); stops cleanly on a NaN.

    Every rank runs the same Advisor on the same (averaged) logs, so all stop at the same step; only rank 0 writes.
    A stop sets `should_save = False` for the rest of the run, so the newest checkpoint holds the last good weights.
    """

    def __init__(self, thresholds, trainer=None, tag="health/advice"):
        self.advisor = Advisor(thresholds)
        self.trainer = trainer  # for TensorBoard's writer; without it, advice is printed only
        self.tag = tag
        self.advice = []
        self.layout_written = False

    @property
    def stopped(self):
        return self.advisor.stop

    def on_train_begin(self, args, state, control, **kwargs):
        self.advisor.settings.update({name: getattr(args, name, None) for name in SETTINGS})
        config = getattr(kwargs.get("model"), "config", None)
        self.advisor.settings["vocab_size"] = getattr(config, "vocab_size", None)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = {} if logs is None else logs
        if any(key.startswith("eval_") for key in logs):  # a held-out point (HeldOutEval), not a training log
            return
        if "reward" in logs and (rewards := latest_rewards(self.trainer)):
            weights = args.reward_weights or [1.0] * len(rewards)
            # into the log itself: the trackers' callbacks, after this one (`install`), record it as train/...
            logs["frac_tied_groups"] = tied_fraction(rewards, weights, args.num_generations)
        shown = self.advisor.update(logs, state.global_step)
        if self.advisor.stop:
            control.should_training_stop = True
            control.should_save = False
        writer = tensorboard_writer(self.trainer) if state.is_world_process_zero else None
        if writer is not None and not self.layout_written:  # the writer exists from the first log on
            writer.add_custom_scalars(LAYOUT)
            self.layout_written = True
        if not shown or not state.is_world_process_zero:
            return
        self.advice += shown
        for advice in shown:
            log.warning("health %s", advice)
        if writer is not None:
            writer.add_text(
                self.tag, "\n\n".join(f"**{a.level.upper()}** {md(a.message)}" for a in shown), state.global_step
            )
            writer.flush()
        send_alerts(getattr(args, "report_to", None) or [], [a for a in shown if a.level != "ok"])

    def install(self, trainer):
        """First in the list (transformers calls callbacks in order), so the trackers see frac_tied_groups."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def on_step_end(self, args, state, control, **kwargs):
        if self.advisor.stop:  # the flow callback may ask for a save at this step; the weights are not worth it
            control.should_save = False

    on_epoch_end = on_step_end


def send_alerts(report_to, advice):
    """Each Advice as an alert of W&B (run.alert) and trackio (trackio.alert) when they are in `report_to` and their
    run is open (their callbacks open it when training begins): the channel those trackers have for a message, as
    the Text tab is TensorBoard's. Offline, W&B keeps them in its run file and trackio in its local database."""
    if not advice:
        return
    if "wandb" in report_to:
        import wandb

        for a in advice if wandb.run is not None else ():
            level = wandb.AlertLevel.ERROR if a.level == "stop" else wandb.AlertLevel.WARN
            wandb.run.alert(title=f"{a.level} {a.signal}", text=a.message, level=level)
    if "trackio" in report_to:
        import trackio

        for a in advice:
            level = trackio.AlertLevel.ERROR if a.level == "stop" else trackio.AlertLevel.WARN
            trackio.alert(title=f"{a.level} {a.signal}", text=a.message, level=level)


class HeldOutEval(TrainerCallback):
    """Held-out GSM8K accuracy, logged through the trainer's own log (`log_metrics`), so that every tracker in
    REPORT_TO records eval/gsm8k_* at its step: EVAL_BEFORE (`before` problems) as the first step begins, at step
    0; EVAL_STEPS every `every` steps (-1: every 10 % of the run) on `subset` problems; EVAL_AFTER (`after`) when
    training ends, if `finished()` says the run was not stopped. The last step is left to EVAL_AFTER when that is on
    (it scores the same model). `scoring`: evaluate_trainer's dataset, batch_size, settings and samples.

    Inside train(), so that DeepSpeed and FSDP have wrapped the model, and first among the callbacks (`install`):
    the trackers' own on_train_end closes their runs (trackio finishes its run there), after the "after" point."""

    def __init__(self, trainer, every, subset, scoring, before=0, after=0, finished=lambda: True):
        self.trainer = trainer
        self.every, self.subset, self.before, self.after = every, subset, before, after
        self.scoring = scoring
        self.finished = finished
        self.metrics = {}  # "before", "after", or the step of an EVAL_STEPS point -> its metrics

    def install(self, trainer):
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def score(self, when, limit, key=None):
        """Score `limit` problems now, as `when` ("before", "during" or "after"), kept under `key` (default `when`)."""
        metrics = evaluate_trainer(self.trainer, when, limit=limit, **self.scoring)
        if metrics is not None:
            self.metrics[when if key is None else key] = metrics

    def on_step_begin(self, args, state, control, **kwargs):
        # at the first step, not at on_train_begin: there this callback runs before the trackers open their runs
        if state.global_step == 0 and "before" not in self.metrics:
            with cli.interruptible():  # a stop here trains and saves nothing: the same command starts again
                self.score("before", self.before)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step in plan.eval_steps(self.every, state.max_steps, final=bool(self.after)):
            self.score("during", self.subset, key=step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.finished():
            self.score("after", self.after)


class CompletionSamples(TrainerCallback):
    """Every `every` steps (LOG_COMPLETIONS_STEPS; 0 = never), at that step's log, a table of a few completions of
    the newest batch in TensorBoard's Text tab. The rows come from TRL's completion records
    (completions/completions_NNNNN.parquet), which it writes right after the callbacks' `on_log`: so the table is
    written when the next step begins, or at the save that follows the log.

    TRL writes those records, and logs its completions table to W&B and trackio, at every log while the trainer's
    `log_completions` is on (GRPOTrainer.log reads it each time): it is switched on for the steps due, off between."""

    def __init__(self, trainer, every, num_samples=4, tag="completions/samples"):
        self.trainer = trainer  # for TensorBoard's writer and the reward functions' names
        self.every = every
        self.num_samples = num_samples
        self.tag = tag
        self.pending = None  # the step of a log whose records TRL is about to write

    def on_step_end(self, args, state, control, **kwargs):  # before this step's log
        self.trainer.log_completions = bool(self.every) and state.global_step % self.every == 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "reward" in (logs or {}):  # a new batch was generated since the last log
            self.pending = state.global_step

    def on_step_begin(self, args, state, control, **kwargs):
        step, self.pending = self.pending, None
        writer = tensorboard_writer(self.trainer)
        path = Path(args.output_dir) / "completions" / f"completions_{step or 0:05d}.parquet"
        if step is None or writer is None or not state.is_world_process_zero or not path.is_file():
            return
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()  # one dict per completion, in batch order
        rows = sample_rows(records, self.trainer.reward_func_names, self.num_samples)
        if rows:
            writer.add_text(self.tag, render_table(rows), step)
            writer.flush()

    on_save = on_step_begin  # the last step's table: the final checkpoint is saved after the log, before train end


def sample_rows(records, reward_names, n=4):
    """Up to `n` of TRL's completion records, round robin over their prompts: a batch of one prompt shows its
    group, a batch of many shows many prompts."""
    questions = [question_of(r.get("prompt")) for r in records]
    groups = {}  # question -> indices of its completions, in batch order
    for i, question in enumerate(questions):
        groups.setdefault(question, []).append(i)
    round_robin = [i for rank in zip_longest(*groups.values()) for i in rank if i is not None]
    rows = []
    for i in sorted(round_robin[:n]):  # shown in batch order, so a group's completions stay together
        record, text = records[i], grading.completion_to_text(records[i].get("completion"))
        rows.append(
            {
                "question": questions[i],
                "completion": text,
                "extracted": record["extracted"] if "extracted" in record else grading.extract_answer(text),
                "gold": record.get("gold"),
                "rewards": {name: record.get(name) for name in reward_names},
                "advantage": record.get("advantage"),
            }
        )
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
        cells = [
            md(row["question"], max_chars),
            md(row["completion"], max_chars),
            md("-" if row["extracted"] is None else row["extracted"]),
            md("?" if row["gold"] is None else row["gold"]),
            *(number(row["rewards"][name]) for name in names),
            number(row["advantage"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def number(value):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|])")  # what Python-Markdown (TensorBoard's) lets one escape


def md(text, max_chars=None):
    """`text` as literal markdown for one table cell. TensorBoard sanitises HTML after rendering, which would drop
    a model's `<think>` tags: so punctuation is escaped, `&<>` become entities and line breaks `<br>`.

    >>> md("<think>2*3</think>\\n#### 6 | ok")
    '&lt;think&gt;2\\\\*3&lt;/think&gt;<br>\\\\#\\\\#\\\\#\\\\# 6 \\\\| ok'
    """
    text = str(text)
    if max_chars and len(text) > max_chars:
        text = text[:max_chars] + f" ... ({len(text) - max_chars} more characters)"
    text = html.escape(_MD_SPECIAL.sub(r"\\\1", text), quote=False)
    return "<br>".join(text.splitlines()) if text else text  # \r, \r\n, \x0b, \u2028, ...: each breaks a row


def tensorboard_writer(trainer):
    """The SummaryWriter of the trainer's TensorBoardCallback, or None: text lands in the run's own event file."""
    return getattr(tensorboard_callback(trainer), "tb_writer", None)


def tensorboard_callback(trainer):
    from transformers.integrations import TensorBoardCallback

    callbacks = trainer.callback_handler.callbacks if trainer is not None else []
    return next((cb for cb in callbacks if isinstance(cb, TensorBoardCallback)), None)


# ---------------------------------------------------------------------------------------------------------------
# EVAL_BEFORE / EVAL_AFTER: grpotrainer.py scores the model it is training, without loading a second copy.


def evaluate_trainer(trainer, when, limit, dataset, batch_size, settings=None, samples=None):
    """Score the trainer's model (adapter active) on the first `limit` test problems, with training's prompts and
    lengths, and log eval/gsm8k_* at this step through `log_metrics`; the metrics, on every rank (None when `limit`
    is 0). `when`: "before" (step 0), "during" or "after" (this step); `samples` completions per problem (default
    NUM_GENERATIONS; 0 = none) give the sampled accuracy. A "during" or "after" point on problems the run's
    EVAL_BEFORE scored carries the paired test against it (`gsm8k.compare`), also as TensorBoard text eval/paired.

    Each rank generates one contiguous shard of the problems and the rows are gathered on every rank; the main
    process writes the files. Every shard has the same length (the last padded with repeats of the last problem,
    dropped after the gather): under ZeRO-3 and FSDP each forward pass is collective, so every rank must make the
    same generate calls. Outside train() the model is not wrapped yet under DeepSpeed/FSDP: then it is skipped.
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
    with generation_ready(trainer) as model, cli.phase(f"scoring EVAL_{when.upper()}"):
        tokenizer, length, cache = trainer.processing_class, args.max_completion_length, args.cache_implementation
        # training's own end-of-turn tokens: Trainer may have rewritten the generation config's to the tokenizer's
        eos = trainer.eos_token_ids
        generate = gsm8k.hf_generator(model, tokenizer, length, thinking, cache_implementation=cache, eos=eos)
        rows = gsm8k.generate_all(shard, generate, batch_size, desc, acc.is_main_process)
        sampler = functools.partial(generate, temperature=args.temperature)
        sampled = gsm8k.sample_all(shard, sampler, samples, batch_size, desc, acc.is_main_process, args.seed)  # 0: []
    # every rank's rows, in rank order: the padding is at the end
    rows, sampled = gather_object(rows)[:n], gather_object(sampled)[: n * samples]
    seconds = time.perf_counter() - start
    metrics, predictions = gsm8k.results(rows, seconds, thinking, sampled, samples, args.temperature)
    step = trainer.state.global_step
    if acc.is_main_process:
        if when != "before" and (paired := gsm8k.paired_with_before(args.output_dir, predictions, samples)):
            metrics["paired"] = paired  # the flips since EVAL_BEFORE on the same problems, and their exact test
            if (writer := tensorboard_writer(trainer)) is not None:
                writer.add_text("eval/paired", "  \n".join(gsm8k.paired_lines(paired)), step)
        title = f"GSM8K test {when} training (step {step})"
        stem = f"eval_test_{when}"
        gsm8k.report(metrics, predictions, args.output_dir, stem, step=step, title=title, settings=settings)
        append_eval_point(args.output_dir, when, step, metrics)
    log_metrics(trainer, metrics)
    return metrics


def shard_indices(n, rank, world):
    """The problems (of `n`) rank `rank` of `world` scores: one contiguous run of ceil(n / world), padded with
    repeats of the last problem so that every rank makes the same generate calls; in rank order, the padding last.

    >>> [shard_indices(5, rank, 2) for rank in range(2)]
    [[0, 1, 2], [3, 4, 4]]
    """
    per_rank = math.ceil(n / world)
    return [min(i, n - 1) for i in range(rank * per_rank, (rank + 1) * per_rank)]


def log_metrics(trainer, metrics):
    """The held-out metrics as eval/gsm8k_* at the trainer's step, to every callback (TensorBoard, W&B, trackio: the
    trackers of REPORT_TO) and the run's log_history: transformers' Trainer.log, whose `eval_` prefix the trackers
    write as `eval/`. Not GRPOTrainer.log, which would average TRL's buffer of training metrics into this log and
    clear it."""
    from transformers import Trainer

    logs = {"eval_" + tag.removeprefix("eval/"): metrics[key] for key, tag in gsm8k.SCALARS.items() if key in metrics}
    tensorboard = tensorboard_callback(trainer)
    if tensorboard is not None and not tensorboard.logging_dir:  # outside train(): a run resumed past its last step
        tensorboard.logging_dir = gsm8k.new_logdir(trainer.args.output_dir)  # in OUTPUT_DIR/runs, not ./runs
    Trainer.log(trainer, logs)


@contextlib.contextmanager
def generation_ready(trainer):
    """The trainer's model ready to generate as GRPOTrainer's own generation gets it: unwrapped, DeepSpeed ZeRO-3
    parameters gathered (unless ds3_gather_for_generation is off), FSDP1 parameters summoned, without activation
    checkpointing (TRL's unwrap_model_for_generation), in eval mode (no LoRA dropout), under no_grad; the
    train/eval mode is put back after."""
    import torch
    from trl.distributed import DistributedBackend
    from trl.models import unwrap_model_for_generation

    was_training = trainer.model.training
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        DistributedBackend(trainer.accelerator).summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        model.eval()
        try:
            yield model
        finally:
            trainer.model.train(was_training)


# ---------------------------------------------------------------------------------------------------------------
# issue 27: the measured pace after the first steps, and every evaluation point kept


def time_generation(trainer):
    """Wrap `trainer._generate` so that its wall seconds add up in the returned dict's "seconds"; return the dict.

    TRL 1.16 has no public hook around generation: GRPOTrainer._generate is the one method through which every
    generation round goes (HF generate, paged batching or vLLM), prompts in, completion ids out, so the time spent in
    it is generation's share of a step. Rewards and log-probs are computed outside it."""
    original = trainer._generate
    clock = {"seconds": 0.0, "calls": 0}

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            clock["seconds"] += time.perf_counter() - start
            clock["calls"] += 1

    trainer._generate = timed
    return clock


class PerfMonitor(TrainerCallback):
    """After the first steps and at every tenth of the run: the measured seconds per step, the ETA and generation's
    share of the step (plan.progress_line), printed and written to TensorBoard as perf/seconds_per_step,
    perf/eta_hours and perf/generation_share; when generation dominates, plan.generation_advice's lever goes to the
    log and the Text tab (perf/advice). The first step (compilation, allocator warm-up) is left out of the pace."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.clock = time_generation(trainer)
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
        if steps < 2 or not (steps == 2 or state.global_step % report_every == 0):
            return
        per_step = (now - t0) / steps
        share = min(1.0, (self.clock["seconds"] - g0) / max(now - t0, 1e-9))
        if not state.is_world_process_zero:
            return
        log.info(plan.progress_line(state.global_step, state.max_steps, per_step, share))
        sequences = args.per_device_train_batch_size * args.steps_per_generation  # one call's, as plan.py counts
        advice = None if self.advised else plan.generation_advice(share, args.use_vllm, sequences)
        if advice:
            log.warning("perf %s", advice)
            self.advised = True
        writer = tensorboard_writer(self.trainer)
        if writer is not None:
            eta_hours = (state.max_steps - state.global_step) * per_step / 3600
            scalars = {"seconds_per_step": per_step, "generation_share": share, "eta_hours": eta_hours}
            for name, value in scalars.items():
                writer.add_scalar(f"perf/{name}", value, state.global_step)
            if advice:
                writer.add_text("perf/advice", md(advice), state.global_step)
            writer.flush()


def append_eval_point(output_dir, when, step, metrics):
    """Append one evaluation point to OUTPUT_DIR/eval_test.jsonl (before, each held-out point, after): every point
    of a run is kept, where eval_test_<when>.json holds the latest of each kind."""
    record = {"step": step, "when": when, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "metrics": metrics}
    with open(Path(output_dir) / "eval_test.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
