"""What this machine offers: GPUs, bf16, optional packages, processes; and the model-loading arguments that follow.

Every question is a small function, so that a test can answer it differently (the `gpu` fixture in
tests/conftest.py) without a GPU. Nothing here imports torch at import time.
"""

import importlib.util
import os


def world_size():
    """Processes in this run, on every node: torchrun and accelerate launch set WORLD_SIZE."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process():
    return os.environ.get("RANK", "0") == "0"


def on_gpu(cpu_only):
    """Whether this run computes on CUDA: the --smoke and --demo profiles always run on the CPU."""
    return not cpu_only and cuda_available()


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
    return importlib.util.find_spec(package) is not None


def model_init_kwargs(attn, bf16, cuda):
    """from_pretrained arguments: bf16 and the fastest attention kernel on CUDA, fp32 and sdpa on CPU.

    >>> model_init_kwargs("auto", bf16=False, cuda=False)
    {'dtype': 'float32', 'attn_implementation': 'sdpa'}
    """
    if attn == "auto":  # flash-attn kernels run only in 16-bit, and we never train in fp16
        attn = "flash_attention_2" if bf16 and cuda and importable("flash_attn") else "sdpa"
    return {"dtype": "bfloat16" if bf16 else "float32", "attn_implementation": attn}


def quantization_config(load_in_4bit, bf16):
    """QLoRA's 4-bit NF4 storage for the base weights (bitsandbytes, CUDA), or None."""
    if not load_in_4bit:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    dtype = torch.bfloat16 if bf16 else torch.float32
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype if bf16 else torch.uint8,  # ZeRO-3/FSDP shard it as the weights' dtype
    )
