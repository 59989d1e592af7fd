"""Advice that names the constant to change when GRPO training goes wrong: pure rules over plain log dicts, which
grpo/callbacks.py feeds. docs/troubleshooting.md tables the signals, their thresholds and the advice."""

import math
from collections import deque
from dataclasses import asdict, dataclass, fields

from grpo.plan import duration

HEALTHY_EVERY = 25  # logs between "healthy" lines while no advice fires: silence must not read as a dead monitor
TIE_TOLERANCE = 1e-5  # a group is tied when its rewards differ by less than this share of the batch's reward scale
REPEAT_AFTER = 20  # logs before an advisory that keeps firing is shown again (at once if it gets more severe)
LEVELS = {"ok": 0, "warn": 1, "act": 2, "stop": 3}
HEALTH_KEYS = ("reward", "kl", "frac_tied_groups", "grad_norm")  # quoted by the "healthy" line
SOLVED_MOST = 0.8  # correctness above which tied groups are mostly all right (levers: a larger group, harder data)
LEVERS = {"clipped": "MAX_COMPLETION_LENGTH"}  # the setting an advisory asks to change, when a profile fixes it
FLAT_NEEDS_SIGNAL = 0.5  # the flat-reward advice needs frac_reward_zero_std below this, on average over its window
GENERATION_DOMINATES = 0.6  # share of the step above which generation's lever is named

# the GRPOConfig values the advice reads (callbacks.HealthMonitor copies them from the trainer's arguments)
CONFIG = ("beta", "learning_rate", "num_generations", "temperature", "max_completion_length")
CONFIG += ("mask_truncated_completions",)
# What the advice says, naming the constant to change: filled in by Advisor._text with the thresholds (kl_act, ...),
# the CONFIG values ("?" when unknown) and the rule's own values (kl, frac, fix, ...)
TEXTS = {
    "kept": "The newest checkpoint-N in OUTPUT_DIR is kept as it was; the final adapter is not written.",
    "nan": "{key} is {value}{at}: the weights are diverging, so training stops before they are saved. {kept} Lower "
    "LEARNING_RATE (now {learning_rate}) or raise BETA (now {beta}); a resumed run keeps the checkpoint's learning "
    "rate, so start a fresh OUTPUT_DIR to change it.",
    "nan_reward": "{key} is {value}{at}: every reward function returned None, NaN or inf for every completion, so "
    "there is nothing to learn from and training stops. Check the functions in REWARD_FUNCS. {kept}",
    "kl_act": "kl is {kl:.3g} (> KL_ACT={kl_act:g}): the policy has drifted far from the reference model and is "
    "likely exploiting the reward or collapsing. Raise BETA (now {beta}; e.g. double it) and lower LEARNING_RATE (now "
    "{learning_rate}; e.g. halve it).",
    "kl_warn": "kl is {kl:.3g} (> KL_WARN={kl_warn:g}): the policy is moving away from the reference model. Watch "
    "train/kl; above KL_ACT={kl_act:g} raise BETA (now {beta}) or lower LEARNING_RATE (now {learning_rate}).",
    "zero_std": "in {frac:.0%} of groups all {num_generations} completions got the same reward, for {run} logs in a "
    "row (frac_tied_groups >= ZERO_STD_FRAC={zero_std_frac:g} for ZERO_STD_LOGS={zero_std_logs}): such groups have "
    "zero advantage and teach nothing. {fix}",
    "solved_most": "The model already solves {solved:.0%} of its problems, so most groups are all right: raise "
    "NUM_GENERATIONS (now {num_generations}) so more groups hold a wrong answer, TEMPERATURE (now {temperature}) for "
    "more varied ones, or train on a harder subset (DATASET: the problems evaluate.py's predictions get wrong).",
    "tell_apart": "Check that the reward tells the responses apart (see completions/samples in the Text tab), or "
    "raise NUM_GENERATIONS (now {num_generations}) or TEMPERATURE (now {temperature}) for more varied groups.",
    "flat_reward": "the mean reward has been flat for {reward_flat_window} logs ({before:.3f} -> {after:.3f}, a "
    "change under REWARD_FLAT_DELTA={reward_flat_delta:g} over REWARD_FLAT_WINDOW={reward_flat_window}). If it is "
    "near its maximum the run has converged; otherwise check that the reward tells the responses apart "
    "(frac_tied_groups, completions/samples), or raise LEARNING_RATE (now {learning_rate}) while train/kl stays low.",
    "clipped": "{ratio:.0%} of completions hit MAX_COMPLETION_LENGTH (now {max_completion_length} tokens) unfinished "
    "(completions/clipped_ratio > CLIPPED_RATIO_MAX={clipped_ratio_max:g}): a cut-off completion earns no reward. "
    "{fix}",
    "clipped_pads": "Many of them pad past their answer (completions/padded_ratio {padded:.0%}): a longer limit "
    "leaves more room to pad and masking hides what it costs, so change neither (see the padded advice).",
    "clipped_fix": "Raise MAX_COMPLETION_LENGTH, or set MASK_TRUNCATED_COMPLETIONS=True to leave them out of the "
    "loss.",
    "padded": "{share:.0%} of completions repeat or pad past their final answer (completions/padded_ratio, up from "
    "{low:.0%} for {run} logs): the model is learning to go on after its answer ('#### 5' repeated, filler, another "
    "question). The registry's rewards pay such completions nothing; {fix} Read completions/samples.",
    "padded_masked": "but MASK_TRUNCATED_COMPLETIONS=True leaves those that pad to the limit out of the loss: set it "
    "False.",
    "padded_rewards": "a REWARD_FUNCS entry of your own that pays them should score 0 where grpo.grading.pads_answer "
    "is true; with none, the padding spreads in groups that score all alike (frac_tied_groups): raise NUM_GENERATIONS "
    "(now {num_generations}) or TEMPERATURE (now {temperature}).",
    "grad_norm": "grad_norm is {grad_norm:.3g} (> GRAD_NORM_MAX={grad_norm_max:g}): the updates are exploding. "
    "{lower}",
    "entropy": "entropy is {entropy:.3g} nats, {noise:.0%} of uniform noise over {vocab} tokens, for {run} logs (it "
    "began at {first:.3g}): the model has stopped producing text. {lower}",
    "lower_lr": "Lower LEARNING_RATE (now {learning_rate}; e.g. 10x), from an earlier checkpoint.",
    "generation": "generation takes {percent:.0f} % of each step; set USE_VLLM=True (requirements-vllm.txt) to "
    "generate with vLLM, or {more}",
    "generation_vllm": "generation takes {percent:.0f} % of each step; {more}",
    "more_sequences": "decode more sequences per generation call{batch}: raise STEPS_PER_GENERATION or "
    "PER_DEVICE_TRAIN_BATCH_SIZE, so that decoding reads the weights once for many sequences",
}


@dataclass(frozen=True)
class Thresholds:
    """When each signal fires; a field without a default is read from the setting of its name in capitals."""

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
        return cls(**{f.name: s[f.name.upper()] for f in fields(cls) if f.name.upper() in s})


@dataclass(frozen=True)
class Advice:
    signal: str  # nan, kl, zero_std, flat_reward, clipped, diverging, padded, healthy
    level: str  # ok, warn, act or stop
    message: str

    def __str__(self):
        return f"{self.level.upper()} {self.signal}: {self.message}"


class Advisor:
    """Turns a stream of training logs (keys as callbacks get them, without "train/") into advisories. `settings`
    holds the GRPOConfig values in force (beta, learning_rate, ...), which the advice quotes."""

    def __init__(self, thresholds, settings=None, repeat_after=REPEAT_AFTER, healthy_every=HEALTHY_EVERY, fixed=()):
        self.t = thresholds
        self.fixed = set(fixed)  # settings a profile fixes on purpose: their advice becomes a note
        self.settings = dict(settings or {})
        self.repeat_after = repeat_after
        self.healthy_every = healthy_every  # 0 = never
        self.stop = None  # the Advice that stopped training
        self.logs_seen = self._quiet = 0
        self._zero_std_run = self._entropy_run = self._padded_run = 0  # logs in a row each signal has held
        self._entropy_first = self._padded_low = None  # the run's first entropy, its lowest padded share
        self._rewards = deque(maxlen=max(thresholds.reward_flat_window, 2))  # (reward, share of tied groups)
        self._shown = {}  # signal -> (log index, level) it was last shown at

    def update(self, logs, step=None):
        self.logs_seen += 1
        fired = [self._nan(logs, step), self._kl(logs), self._zero_std(logs), self._flat_reward(logs)]
        fired += [self._clipped(logs), self._diverging(logs), self._padded(logs)]
        fired = [self._as_note(a) if LEVERS.get(a.signal) in self.fixed else a for a in fired if a]
        self.stop = self.stop or next((a for a in fired if a.level == "stop"), None)
        self._quiet = 0 if fired else self._quiet + 1
        if self.healthy_every and self._quiet and self._quiet % self.healthy_every == 0:
            seen = ", ".join(f"{key} {logs[key]:.3g}" for key in HEALTH_KEYS if isinstance(logs.get(key), int | float))
            at = f"at step {step} " if step is not None else ""
            return [Advice("healthy", "ok", f"{at}no advice for {self._quiet} logs ({seen}).")]
        return [a for a in fired if self._due(a)]

    def _as_note(self, advice):
        """An advisory whose lever the profile fixes on purpose, as an "ok" note that asks for nothing."""
        said = advice.message.split(": ")[0]
        return Advice(advice.signal, "ok", f"{said}: expected here, as this profile sets {LEVERS[advice.signal]}.")

    def _due(self, advice):
        last = self._shown.get(advice.signal)
        due = last is None or LEVELS[advice.level] > LEVELS[last[1]] or self.logs_seen - last[0] >= self.repeat_after
        if due:
            self._shown[advice.signal] = (self.logs_seen, advice.level)
        return due

    def _text(self, name, **values):
        """TEXTS[name] filled in with the thresholds, the CONFIG values ("?" when unknown) and the rule's `values`."""
        config = {key: self.settings.get(key) for key in CONFIG}
        config = {key: "?" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for key, v in config.items()}
        return TEXTS[name].format(**asdict(self.t), **config, **values)

    def _say(self, signal, level, name, **values):
        return Advice(signal, level, self._text(name, **values))

    # Each rule reads one signal from the log and returns an Advice, or None when the signal is quiet.

    def _nan(self, logs, step):
        # Trainer logs a NaN loss as the running mean (logging_nan_inf_filter), so grad_norm is the reliable sign;
        # TRL logs a reward of None when every reward function returned None or NaN for every row.
        for key in ("loss", "grad_norm", "kl", "reward"):
            value = logs.get(key, 0.0)
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                at = f" at step {step}" if step is not None else ""
                name = "nan_reward" if key == "reward" else "nan"
                return self._say("nan", "stop", name, key=key, value=value, at=at, kept=TEXTS["kept"])
        return None

    def _kl(self, logs):
        kl = logs.get("kl")
        if not isinstance(kl, (int, float)) or not kl > self.t.kl_warn:
            return None
        level = "act" if kl > self.t.kl_act else "warn"
        return self._say("kl", level, f"kl_{level}", kl=kl)

    def _zero_std(self, logs):
        frac = tie_share(logs)
        if not isinstance(frac, (int, float)):
            return None
        self._zero_std_run = self._zero_std_run + 1 if frac >= self.t.zero_std_frac else 0
        if self._zero_std_run < self.t.zero_std_logs:
            return None
        solved = logs.get("rewards/correctness_reward/mean")
        most = isinstance(solved, (int, float)) and solved >= SOLVED_MOST
        fix = self._text("solved_most" if most else "tell_apart", solved=solved)
        return self._say("zero_std", "warn", "zero_std", frac=frac, run=self._zero_std_run, fix=fix)

    def _flat_reward(self, logs):
        reward, window = logs.get("reward"), self.t.reward_flat_window
        if not _finite(reward) or window < 2:
            return None
        self._rewards.append((reward, tie_share(logs) or 0.0))
        # Most groups scoring all alike is zero_std's case and the usual prelude to a jump (GRPO waits for a group
        # that tells its completions apart): flat counts only while most groups carry signal.
        if len(self._rewards) < window or sum(t for _, t in self._rewards) / window >= FLAT_NEEDS_SIGNAL:
            return None
        # the halves' means, not the first and last values: a per-step reward is noisy
        values, half = [r for r, _ in self._rewards], window // 2
        before, after = sum(values[:half]) / half, sum(values[half:]) / (window - half)
        if abs(after - before) >= self.t.reward_flat_delta:
            return None
        return self._say("flat_reward", "warn", "flat_reward", before=before, after=after)

    def _clipped(self, logs):
        ratio = logs.get("completions/clipped_ratio")
        if not isinstance(ratio, (int, float)) or not ratio > self.t.clipped_ratio_max:
            return None
        padded = logs.get("completions/padded_ratio")
        pads = isinstance(padded, (int, float)) and padded >= ratio / 2
        fix = self._text("clipped_pads" if pads else "clipped_fix", padded=padded)
        return self._say("clipped", "warn", "clipped", ratio=ratio, fix=fix)

    def _padded(self, logs):
        """Learning to go on past the answer (`#### 5` repeated): completions/padded_ratio climbs off its lowest."""
        share = logs.get("completions/padded_ratio")
        if not _finite(share):
            return None
        self._padded_low = share if self._padded_low is None else min(self._padded_low, share)
        self._padded_run = self._padded_run + 1 if share >= self._padded_low + self.t.padded_rise else 0
        if self._padded_run < self.t.padded_logs:
            return None
        fix = self._text("padded_masked" if self.settings.get("mask_truncated_completions") else "padded_rewards")
        return self._say("padded", "warn", "padded", share=share, low=self._padded_low, run=self._padded_run, fix=fix)

    def _diverging(self, logs):
        """Divergence without a NaN: the gradient norm explodes, or the entropy climbs to that of uniform noise."""
        grad_norm, entropy, vocab = logs.get("grad_norm"), logs.get("entropy"), self.settings.get("vocab_size")
        if isinstance(grad_norm, (int, float)) and self.t.grad_norm_max < grad_norm < math.inf:  # inf: the NaN rule
            return self._say("diverging", "act", "grad_norm", grad_norm=grad_norm, lower=self._text("lower_lr"))
        if not _finite(entropy) or not vocab:
            return None
        top = self.t.entropy_max_frac * math.log(vocab)
        self._entropy_first = entropy if self._entropy_first is None else self._entropy_first
        self._entropy_run = self._entropy_run + 1 if entropy >= top else 0
        if self._entropy_run < self.t.entropy_logs or self._entropy_first >= top:
            return None  # a model that starts as noise (a random one) has not diverged
        values = dict(entropy=entropy, vocab=vocab, run=self._entropy_run, first=self._entropy_first)
        lower = self._text("lower_lr")  # built only when it is said: this runs at every log
        return self._say("diverging", "act", "entropy", noise=entropy / math.log(vocab), lower=lower, **values)


def _finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def tie_share(logs):
    """The share of tied groups in a log: our `frac_tied_groups`, else TRL's frac_reward_zero_std, else None."""
    keys = ("frac_tied_groups", "frac_reward_zero_std")
    return next((logs[key] for key in keys if isinstance(logs.get(key), (int, float))), None)


def tied_fraction(rewards, weights, group, tolerance=TIE_TOLERANCE):
    """The share of groups (`group` consecutive completions, as TRL orders them) whose weighted total rewards lie
    within `tolerance` times the batch's largest |reward|: TRL's frac_reward_zero_std misses float32 ties. A None
    or NaN reward counts as 0, as TRL's nansum counts it. None for an empty batch."""
    totals = [
        sum(w * (r if r is not None and math.isfinite(r) else 0.0) for w, r in zip(weights, row, strict=True))
        for row in zip(*rewards, strict=True)
    ]
    groups = [totals[i : i + group] for i in range(0, len(totals) - group + 1, group)]
    if not groups:
        return None
    slack = tolerance * max(abs(v) for v in totals)
    return sum(max(g) - min(g) <= slack for g in groups) / len(groups)


def progress_line(step, max_steps, seconds_per_step, generation_share):
    """The pace line: measured seconds per step, the ETA and generation's share of the step."""
    eta = duration((max_steps - step) * seconds_per_step)
    share = f"{generation_share * 100:.0f} %"
    return f"step {step}/{max_steps}: {seconds_per_step:.1f} s/step, ETA {eta}, generation {share} of the step"


def generation_advice(generation_share, use_vllm=False, sequences_per_call=None):
    """Advice naming the lever when generation takes more than `GENERATION_DOMINATES` of the step, else None."""
    if generation_share <= GENERATION_DOMINATES:
        return None
    more = TEXTS["more_sequences"].format(batch=f" (now {sequences_per_call})" if sequences_per_call else "")
    return TEXTS["generation_vllm" if use_vllm else "generation"].format(percent=generation_share * 100, more=more)
