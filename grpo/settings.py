"""Every setting of the three scripts, described once (its default and comment live in its script): the command
line, --help, preflight, the resume check, the card, the plan and build_config read this table, so a new setting is
its constant line plus one row here."""

import difflib
import math
import re
from typing import NamedTuple


class Setting(NamedTuple):
    check: str | tuple = ""  # "[low, high]" with ( or ) for an open end and inf, or the allowed values
    field: str = ""  # the GRPOConfig field it sets ("lora_config." peft's LoraConfig's, "held_out." our evaluation's)
    names: tuple = ()  # TRL's and open-r1's names (or an old name) read as it
    resume: bool = False  # a resumed run may change it: how long, how saved, logged, watched or computed
    card: str = ""  # its row in the model card's "Training settings"
    plan: tuple = ()  # the plan lines (plan.format_plan's labels) it shapes
    repeat: bool = False  # a list given once per item (--ASK="..." --ASK="..."), never split at commas
    path: bool = False  # names a file or folder: `~` expanded, recorded absolute where it exists


S = Setting
POSITIVE, COUNT = "[1, inf]", "[0, inf]"
TABLE = {
    # model
    "MODEL_NAME": S(names=("model_name_or_path",), plan=("model", "time (estimate)"), path=True),
    "ADAPTER": S(path=True),
    "TRUST_REMOTE_CODE": S(field="trust_remote_code", resume=True),
    "ATTN_IMPLEMENTATION": S(names=("attn_implementation",), resume=True),
    "LOAD_IN_4BIT": S(names=("load_in_4bit",), card="4-bit base weights (QLoRA)", plan=("time (estimate)",)),
    "ENABLE_THINKING": S(card="thinking mode (enable_thinking)"),
    "LORA_R": S(POSITIVE, "lora_config.r", ("lora_r",), card="LoRA rank r"),
    "LORA_ALPHA": S("(0, inf]", "lora_config.lora_alpha", ("lora_alpha",), card="LoRA alpha"),
    "LORA_DROPOUT": S("[0, 1)", "lora_config.lora_dropout", ("lora_dropout",), card="LoRA dropout"),
    "LORA_TARGET_MODULES": S("", "lora_config.target_modules", ("lora_target_modules",), card="LoRA target modules"),
    "USE_RSLORA": S(field="lora_config.use_rslora", names=("use_rslora",), card="rank-stabilised LoRA"),
    "USE_DORA": S(field="lora_config.use_dora", names=("use_dora",), card="DoRA"),
    # data
    "DATASET": S(names=("dataset_name",), plan=("data",), path=True),
    "DATASET_CONFIG": S(names=("dataset_config",)),
    "QUESTION_FIELD": S(names=("dataset_prompt_column",)),
    "ANSWER_FIELD": S(),
    "MAX_SAMPLES": S(COUNT, plan=("data",)),
    "SKIP_BAD_ROWS": S(),
    "SYSTEM_PROMPT": S(names=("system_prompt",)),
    "SPLIT": S(("test", "train")),
    "LIMIT": S(COUNT),
    "BASELINE": S(path=True),
    "ASK": S(repeat=True),
    # generation / GRPO
    "NUM_GENERATIONS": S("[2, inf]", "num_generations", card="completions per prompt (num_generations)",
                         plan=("per step",)),
    "MAX_COMPLETION_LENGTH": S(POSITIVE, "max_completion_length", card="max completion length (tokens)",
                               plan=("generation", "time (estimate)")),
    "TEMPERATURE": S("[0.01, inf)", "temperature", ("SAMPLE_TEMPERATURE",), card="sampling temperature"),
    "BETA": S("[0, 10]", "beta", card="KL coefficient beta", plan=("time (estimate)",)),
    "LOSS_TYPE": S(("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"), "loss_type",
                   card="loss type"),
    "SCALE_REWARDS": S(("group", "batch", "none"), "scale_rewards", card="reward scaling"),
    "NUM_ITERATIONS": S(POSITIVE, "num_iterations", plan=("per step", "generation")),
    "STEPS_PER_GENERATION": S(COUNT, "steps_per_generation", plan=("generation",)),
    "MASK_TRUNCATED_COMPLETIONS": S(field="mask_truncated_completions"),
    "REWARD_FUNCS": S(names=("reward_funcs",)),
    "REWARD_WEIGHTS": S(field="reward_weights", names=("reward_weights",)),
    "REWARD_TIMEOUT": S("[0, inf)", resume=True),
    "USE_TRANSFORMERS_CONTINUOUS_BATCHING": S(field="use_transformers_continuous_batching", resume=True),
    "CACHE_IMPLEMENTATION": S(("dynamic", "static"), "cache_implementation", resume=True),
    "USE_VLLM": S(("auto", True, False), "use_vllm", resume=True, plan=("generation", "time (estimate)")),
    "VLLM_MODE": S(("colocate", "server"), "vllm_mode", resume=True),
    "VLLM_GPU_MEMORY_UTILIZATION": S("(0, 1]", "vllm_gpu_memory_utilization", resume=True),
    "VLLM_ENABLE_SLEEP_MODE": S(field="vllm_enable_sleep_mode", resume=True),
    "VLLM_SERVER_BASE_URL": S(field="vllm_server_base_url", resume=True),
    # optimisation
    "LEARNING_RATE": S("(0, 1]", "learning_rate", card="learning rate"),
    "PER_DEVICE_TRAIN_BATCH_SIZE": S(POSITIVE, "per_device_train_batch_size", card="per-device batch size",
                                     plan=("per step", "generation")),
    "GRADIENT_ACCUMULATION_STEPS": S(POSITIVE, "gradient_accumulation_steps", card="gradient accumulation steps",
                                     plan=("per step", "generation")),
    "NUM_TRAIN_EPOCHS": S("[0, inf)", "num_train_epochs", resume=True, card="epochs", plan=("optimiser steps",)),
    "MAX_STEPS": S("[-1, inf]", "max_steps", resume=True, card="max steps (-1 = by epochs)",
                   plan=("optimiser steps",)),
    "WARMUP_STEPS": S("[0, inf)", "warmup_steps", ("warmup_ratio",)),
    "ACTIVATION_CHECKPOINTING": S(field="gradient_checkpointing", resume=True),
    "BF16": S(field="bf16", resume=True, card="bf16"),
    "DTYPE": S(("", "bfloat16", "float16", "float32")),
    "SEED": S(f"[0, {2**32 - 1}]", "seed", card="seed"),
    "DDP_TIMEOUT": S(f"[1, {7 * 86400}]", "ddp_timeout", resume=True),
    # logging / output
    "OUTPUT_DIR": S(field="output_dir", resume=True, path=True),
    "REPORT_TO": S(field="report_to", resume=True),
    "LOGGING_STEPS": S(POSITIVE, "logging_steps", resume=True),
    "LOG_COMPLETIONS_STEPS": S(COUNT, "log_completions", resume=True),
    "SAVE_STEPS": S(POSITIVE, "save_steps", resume=True, plan=("checkpoints",)),
    "SAVE_TOTAL_LIMIT": S(POSITIVE, "save_total_limit", resume=True),
    "RESUME": S(resume=True),
    "STOP_GRACE": S("[0, inf)", resume=True),
    "EVAL_BEFORE": S(COUNT, "held_out.before", resume=True, plan=("eval before",)),
    "EVAL_AFTER": S(COUNT, "held_out.after", resume=True, plan=("final eval",)),
    "EVAL_STEPS": S("[-1, inf]", "held_out.every", resume=True, plan=("held-out eval",)),
    "EVAL_SUBSET": S(POSITIVE, "held_out.subset", resume=True, plan=("held-out eval",)),
    "EVAL_BATCH_SIZE": S(POSITIVE, "held_out.batch_size", ("BATCH_SIZE",), resume=True),
    "EVAL_SAMPLES": S(COUNT, "held_out.samples", ("SAMPLES",), resume=True, plan=("held-out eval", "final eval")),
    "ADAPTER_ONLY": S(),
    "PUSH_TO_HUB": S(),
    "PRIVATE": S(),
    # health advice
    "KL_WARN": S("(0, inf)", resume=True),
    "KL_ACT": S("(0, inf)", resume=True),
    "ZERO_STD_FRAC": S("(0, 1]", resume=True),
    "ZERO_STD_LOGS": S(POSITIVE, resume=True),
    "REWARD_FLAT_WINDOW": S(COUNT, resume=True),
    "REWARD_FLAT_DELTA": S("[0, inf)", resume=True),
    "CLIPPED_RATIO_MAX": S("[0, 1]", resume=True),
    "GRAD_NORM_MAX": S("(0, inf)", resume=True),
}  # fmt: skip
INTERVAL = re.compile(r"([\[(])(-?[\d.e+]+|-?inf), *(-?[\d.e+]+|-?inf)([\])])")


def problem(name, value, comment=""):
    """Why `value` is not allowed for the setting `name`, in one line ending in its constant's `comment`, or None."""
    check = TABLE[name].check if name in TABLE else ""
    why = f": {comment}." if comment else "."
    if isinstance(check, tuple):
        # a boolean choice may come as text ("false"); a text choice is exact: TRL compares "dapo", never "DAPO"
        booleans = [str(c).lower() for c in check if isinstance(c, bool)]
        if value in check or (isinstance(value, str) and value.lower() in booleans):
            return None
        close = difflib.get_close_matches(str(value), [str(c) for c in check], n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        return f"{name}={value!r} is not one of {', '.join(str(c) for c in check)}{why}{hint}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name}={value}: a number here must be finite."
    if not check or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    opening, low, high, closing = INTERVAL.fullmatch(check).groups()
    low, high = float(low), float(high)
    inside = (value >= low if opening == "[" else value > low) and (value <= high if closing == "]" else value < high)
    return None if inside else f"{name}={value} is outside {check}{why}"


def problems(s, comments=None):
    """`problem` for every setting of `s` the table checks (an "auto" value is the machine's to decide)."""
    return [
        p for name, value in s.items() if value != "auto" and (p := problem(name, value, (comments or {}).get(name)))
    ]


def trl_names(settings):
    """{TRL/open-r1 or old name: the constant it is read as}, for the constants in `settings`."""
    names = {row.field: name for name, row in TABLE.items() if row.field and "." not in row.field}
    names |= {alias: name for name, row in TABLE.items() for alias in row.names}
    return {alias: name for alias, name in names.items() if name in settings}


def changeable():
    """The settings a resumed run may change."""
    return {name for name, row in TABLE.items() if row.resume}


def card_rows(s):
    """(label, value) for each setting on the model card, in the table's order; None where `s` lacks it."""
    return [(row.card, s.get(name)) for name, row in TABLE.items() if row.card]


def levers(line):
    """The settings that shape a plan line (its label), in the table's order."""
    return [name for name, row in TABLE.items() if line in row.plan]


def trackers(text):
    """REPORT_TO as GRPOConfig's report_to list: "none" is [], a comma list its names."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return [] if names == ["none"] else names


def lora_targets(text):
    """The target modules as peft takes them: "all-linear", or the list of module names (spaces tolerated)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return "all-linear" if names == ["all-linear"] else names


# How a constant's value becomes its field's where they differ (0 and "" mean TRL's default)
CONVERT = {
    "LORA_TARGET_MODULES": lora_targets,
    "STEPS_PER_GENERATION": lambda value: value or None,
    "VLLM_SERVER_BASE_URL": lambda value: value or None,
    "LOG_COMPLETIONS_STEPS": lambda value: value > 0,
    "REPORT_TO": trackers,
    "USE_VLLM": lambda value: value is True,
}


def config_kwargs(s, prefix=""):
    """{field: value} for the settings of `s` whose field starts with `prefix` ("" the GRPOConfig's own,
    "lora_config." peft's LoraConfig, "held_out." the held-out evaluation's), each converted as CONVERT says."""
    return {
        row.field.removeprefix(prefix): CONVERT[name](s[name]) if name in CONVERT else s[name]
        for name, row in TABLE.items()
        if name in s and row.field.startswith(prefix) and row.field and "." not in row.field.removeprefix(prefix)
    }


def named(field):
    """The constant that sets `field` ("held_out.after"), for a message."""
    return next(name for name, row in TABLE.items() if row.field == field)
