"""Checks that run in seconds, before any weights load, so that a mistake costs a message rather than a GPU hour.

Each problem is one paragraph that names the constant to change and suggests a value; grpotrainer.py prints them
all at once and exits with status 2 (see cli.run).
"""

import difflib
import itertools
import os

from cli import ConfigError
from rewards import REWARDS

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's _compute_loss


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
    problems += hardware_problems(c, smoke)
    if problems:
        raise ConfigError("\n\n".join(problems))


def hardware_problems(c, smoke):
    """What the requested precision, quantisation and kernels need from this machine."""
    problems = []
    cuda = cuda_available() and not smoke
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
    if c.USE_VLLM and c.LOAD_IN_4BIT:
        problems.append(
            "USE_VLLM with LOAD_IN_4BIT is not supported: TRL must merge the LoRA weights into the base "
            "model to send them to vLLM, and merging into 4-bit weights is lossy or crashes (TRL issues "
            "3466, 3654). Use vLLM with bf16 LoRA, or QLoRA with HF generation."
        )
    return problems


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
