"""Checks that run in seconds, before any weights load, so that a mistake costs a message rather than a GPU hour.

Each problem is one paragraph that names the constant to change and suggests a value; grpotrainer.py prints them
all at once and exits with status 2 (see cli.run).
"""

import difflib
import itertools
import json
import os
from pathlib import Path

from cli import ConfigError
from rewards import REWARDS

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's _compute_loss
ATTENTION = ("auto", "flash_attention_2", "sdpa", "eager")
# constants that must be at least 1 (0 or less fails inside TRL/peft, some only after the model has loaded)
POSITIVE = (
    "LORA_R",
    "MAX_COMPLETION_LENGTH",
    "PER_DEVICE_TRAIN_BATCH_SIZE",
    "GRADIENT_ACCUMULATION_STEPS",
    "NUM_ITERATIONS",
    "LOGGING_STEPS",
    "SAVE_STEPS",
    "SAVE_TOTAL_LIMIT",
)


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun and accelerate launch


def check(c, smoke=False):
    """Catch in seconds, before any weights load, the settings that would fail (or silently waste) a GPU run."""
    problems = []
    spg = c.STEPS_PER_GENERATION or c.GRADIENT_ACCUMULATION_STEPS
    per_step = c.PER_DEVICE_TRAIN_BATCH_SIZE * world_size()  # completions per micro-batch, all processes
    batch = per_step * spg
    spg_name = "STEPS_PER_GENERATION" if c.STEPS_PER_GENERATION else "GRADIENT_ACCUMULATION_STEPS"
    if c.NUM_GENERATIONS < 2:
        problems.append(
            f"NUM_GENERATIONS is {c.NUM_GENERATIONS}; GRPO compares completions within a group, so it "
            "needs at least 2 (4-8 is usual)."
        )
    elif batch % c.NUM_GENERATIONS:
        fix = next(s for s in itertools.count(spg + 1) if per_step * s % c.NUM_GENERATIONS == 0)
        divisors = [d for d in range(2, batch + 1) if batch % d == 0]
        alt = f", or NUM_GENERATIONS={min(divisors, key=lambda d: abs(d - c.NUM_GENERATIONS))}" if divisors else ""
        problems.append(
            f"each generation round makes PER_DEVICE_TRAIN_BATCH_SIZE x processes x {spg_name} = "
            f"{c.PER_DEVICE_TRAIN_BATCH_SIZE} x {world_size()} x {spg} = {batch} completions, which must be a "
            f"multiple of NUM_GENERATIONS ({c.NUM_GENERATIONS}) so that every prompt's group is complete. "
            f"For example set {spg_name}={fix}{alt}."
        )
    if len(c.REWARD_WEIGHTS) != len(c.REWARD_FUNCS):
        problems.append(
            f"REWARD_WEIGHTS has {len(c.REWARD_WEIGHTS)} weights for {len(c.REWARD_FUNCS)} REWARD_FUNCS "
            f"({c.REWARD_FUNCS}); give one weight per function, in the same order."
        )
    for name in [f for f in c.REWARD_FUNCS if isinstance(f, str) and f not in REWARDS and ":" not in f]:
        close = difflib.get_close_matches(name, REWARDS, n=1)
        problems.append(
            f"REWARD_FUNCS names an unknown reward {name!r}. {f'Did you mean {close[0]}? ' if close else ''}"
            f"Known rewards: {', '.join(REWARDS)}; or give your own as 'module:function'."
        )
    if c.LOSS_TYPE not in LOSS_TYPES:
        problems.append(f"LOSS_TYPE {c.LOSS_TYPE!r} is not one of {', '.join(LOSS_TYPES)}; dapo is the default.")
    if c.SCALE_REWARDS not in ("group", "batch", "none"):
        problems.append(f"SCALE_REWARDS {c.SCALE_REWARDS!r} must be group, batch or none.")
    if c.TEMPERATURE <= 0:
        problems.append(f"TEMPERATURE is {c.TEMPERATURE}; GRPO samples, so it must be > 0 (0.7-1.0 is usual).")
    if c.VLLM_MODE not in ("colocate", "server"):
        problems.append(f"VLLM_MODE {c.VLLM_MODE!r} must be colocate or server.")
    if c.ATTN_IMPLEMENTATION not in ATTENTION:
        problems.append(f"ATTN_IMPLEMENTATION {c.ATTN_IMPLEMENTATION!r} must be one of {', '.join(ATTENTION)}.")
    for name in [n for n in POSITIVE if getattr(c, n) < 1]:
        problems.append(f"{name} is {getattr(c, name)}; it must be at least 1.")
    if c.MAX_STEPS == 0 or c.MAX_STEPS < -1 or (c.MAX_STEPS == -1 and c.NUM_TRAIN_EPOCHS <= 0):
        problems.append(
            f"MAX_STEPS={c.MAX_STEPS} with NUM_TRAIN_EPOCHS={c.NUM_TRAIN_EPOCHS} trains nothing: set "
            "MAX_STEPS to a positive number of steps, or to -1 with NUM_TRAIN_EPOCHS > 0."
        )
    if c.LEARNING_RATE <= 0:
        problems.append(f"LEARNING_RATE is {c.LEARNING_RATE}; it must be > 0 (1e-5 to 5e-5 for LoRA).")
    if c.EVAL_BEFORE < 0 or c.EVAL_AFTER < 0:
        problems.append("EVAL_BEFORE and EVAL_AFTER are numbers of test problems: 0 (off) or more.")
    model_dir = Path(c.MODEL_NAME).expanduser()
    if (model_dir.exists() or c.MODEL_NAME.startswith(("/", ".", "~"))) and not (model_dir / "config.json").is_file():
        problems.append(
            f"MODEL_NAME points at the folder {model_dir}, which holds no config.json. Give a folder "
            "with a model's config.json, weights and tokenizer (see README: weights on disk), or a Hub "
            "id such as Qwen/Qwen3-8B."
        )
    problems += hardware_problems(c, smoke)
    if problems:
        raise ConfigError("\n\n".join(problems))


def hardware_problems(c, smoke):
    """What the requested precision, quantisation and kernels need from this machine."""
    problems = []
    cuda = on_gpu(smoke)
    if cuda and world_size() == 1 and gpu_count() > 1:
        problems.append(
            f"{gpu_count()} GPUs are visible but only one process was started, and TRL refuses to spread one "
            "process over several GPUs. Launch one process per GPU (torchrun --nproc_per_node "
            f"{gpu_count()} grpotrainer.py, or accelerate launch with configs/accelerate/), or pick one GPU with "
            "CUDA_VISIBLE_DEVICES=0."
        )
    if not smoke and not cuda:
        problems.append(
            "no CUDA GPU is visible, and a real run needs one (bf16 training of a billion-parameter "
            "model on CPU would take weeks). Try the pipeline offline on CPU with: "
            "python grpotrainer.py --smoke"
        )
    elif c.BF16 and not (cuda and bf16_gpu()):
        problems.append(
            "BF16=True needs a bf16-capable GPU, but --smoke runs on the CPU in fp32; leave BF16=False there."
            if smoke
            else "BF16=True needs a bf16-capable (Ampere or newer) GPU, and this one has no bf16 support. Set "
            "BF16=False to train in fp32 (slower, twice the memory: consider LOAD_IN_4BIT or a smaller MODEL_NAME)."
        )
    for flag, name, package, install in [
        (c.LOAD_IN_4BIT, "LOAD_IN_4BIT (QLoRA)", "bitsandbytes", "pip install -r requirements-cuda.txt"),
        (c.USE_LIGER_KERNEL, "USE_LIGER_KERNEL", "liger_kernel", "pip install -r requirements-cuda.txt"),
        (c.USE_VLLM, "USE_VLLM", "vllm", "a separate environment: pip install -r requirements-vllm.txt"),
    ]:
        if flag and not cuda:
            problems.append(f"{name} needs a CUDA GPU; set {name.split()[0]}=False on this machine.")
        elif flag and not importable(package):
            problems.append(f"{name} needs the {package} package, which is not installed; install it with {install}.")
    if c.ATTN_IMPLEMENTATION == "flash_attention_2" and not (cuda and c.BF16 and importable("flash_attn")):
        problems.append(
            "ATTN_IMPLEMENTATION=flash_attention_2 needs a CUDA GPU, BF16=True and the flash-attn "
            "package (requirements-cuda.txt); use auto to fall back to sdpa."
        )
    if c.USE_VLLM and c.LOAD_IN_4BIT:
        problems.append(
            "USE_VLLM with LOAD_IN_4BIT is not supported: TRL must merge the LoRA weights into the base "
            "model to send them to vLLM, and merging into 4-bit weights is lossy or crashes (TRL issues "
            "3466, 3654). Use vLLM with bf16 LoRA, or QLoRA with HF generation."
        )
    return problems


def resume_checkpoint(c):
    """The checkpoint to resume from (None for a fresh start), after checking that resuming or not is safe.

    The newest checkpoint-N holding trainer_state.json counts (transformers writes that file last, so a save cut
    off by a kill is skipped). Starting over in a folder with checkpoints would overwrite and rotate them away, and
    an adapter trained on another base model cannot be resumed: both are refused.
    """
    folders = checkpoints(c.OUTPUT_DIR)
    if folders and not c.RESUME:
        raise ConfigError(
            f"OUTPUT_DIR {c.OUTPUT_DIR} already holds {len(folders)} checkpoint(s) of an earlier run, which "
            "RESUME=False would overwrite or delete (SAVE_TOTAL_LIMIT). Give this run a new OUTPUT_DIR, move the old "
            "one away, or set RESUME=True to continue it."
        )
    last = newest_checkpoint(c.OUTPUT_DIR)
    if last is None:
        return None
    if base := other_base_model(last, c.MODEL_NAME):
        raise ConfigError(
            f"OUTPUT_DIR {c.OUTPUT_DIR} holds checkpoints of an adapter for {base}, but MODEL_NAME is {c.MODEL_NAME}: "
            f"resuming would fail on mismatched shapes. Set MODEL_NAME={base}, or give this run a new OUTPUT_DIR."
        )
    return str(last)


def newest_checkpoint(output_dir):
    """The complete checkpoint-N with the highest N in output_dir, or None. Complete = it holds trainer_state.json,
    which transformers writes last, so a save cut off by a kill is never taken for the newest."""
    done = [p for p in checkpoints(output_dir) if (p / "trainer_state.json").is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix("checkpoint-")), default=None)


def checkpoints(output_dir):
    """The checkpoint-N folders Trainer wrote in output_dir, complete or not."""
    return [p for p in Path(output_dir).glob("checkpoint-*") if p.name.removeprefix("checkpoint-").isdigit()]


def other_base_model(adapter_dir, model_name):
    """The base model a LoRA adapter folder was trained on, when that is not `model_name`; else None."""
    config = Path(adapter_dir) / "adapter_config.json"
    base = json.loads(config.read_text()).get("base_model_name_or_path") if config.is_file() else None
    return base if base and Path(base).name != Path(model_name).name else None  # a Hub id and its local copy match


def on_gpu(smoke):
    """Whether this run computes on CUDA: --smoke always runs on the CPU."""
    return not smoke and cuda_available()


def cuda_available():
    import torch

    return torch.cuda.is_available()


def gpu_count():
    import torch

    return torch.cuda.device_count()


def bf16_gpu():
    import torch

    return torch.cuda.is_bf16_supported()


def importable(package):
    import importlib.util

    return importlib.util.find_spec(package) is not None
