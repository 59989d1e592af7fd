"""The machine's facts (CUDA, bf16, GPUs, installed packages, processes) and the model-loading arguments derived
from them: the attention kernel, the dtype, 4-bit quantization, decode compilation, vLLM's LoRA rank.

preflight.py and grpotrainer.py ask here instead of importing torch themselves; nothing here compiles anything.

    python -m grpo.hardware     # prints what this machine offers and what ATTN_IMPLEMENTATION=auto picks
"""

import datetime
import importlib.util
import os
import re

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts


def vllm_lora_rank(rank):
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of rank `rank`.

    >>> vllm_lora_rank(16), vllm_lora_rank(17), vllm_lora_rank(1000)
    (16, 32, 1000)
    """
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


# ATTN_IMPLEMENTATION values transformers 5.17 loads for Qwen3, besides a Hub kernel "org/repo" (see HUB_KERNEL).
# The paged|... variants are left out: continuous batching switches to them by itself while generating.
ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# A Hub kernel repository, as transformers' integrations.hub_kernels.is_kernel matches it: org/name[@rev][:function]
HUB_KERNEL = re.compile(r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")
FA2_KERNEL = "kernels-community/flash-attn2"  # transformers' fallback for flash_attention_2, named in messages


def attention_problem(requested, *, cuda, bf16, importable):
    """Why `requested` cannot load on this machine (one sentence naming the fix), or None when it can."""
    if requested not in ATTENTION and not HUB_KERNEL.match(requested):
        return (
            f"ATTN_IMPLEMENTATION={requested!r} is not one of {', '.join(ATTENTION)} nor a Hub kernel such as "
            f"{FA2_KERNEL}."
        )
    wheel = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(requested)
    hub = bool(HUB_KERNEL.match(requested))
    if wheel is None and not hub:
        return None
    if not (cuda and bf16):
        return f"ATTN_IMPLEMENTATION={requested} needs a CUDA GPU and BF16=True; use auto, which falls back to sdpa."
    if importable("kernels") or (wheel and importable(wheel)):  # without the wheel transformers loads a Hub kernel
        return None
    package = {"flash_attn": "flash-attn", "flash_attn_interface": "flash-attn-3"}.get(wheel, "kernels")
    alternative = " or the kernels package (requirements-cuda.txt)" if wheel else " (requirements-cuda.txt)"
    return f"ATTN_IMPLEMENTATION={requested} needs the {package} package{alternative}; or use auto (docs/gpu.md)."


def world_size():
    """Processes in this run, on every node: torchrun and accelerate launch set WORLD_SIZE."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process():
    return os.environ.get("RANK", "0") == "0"


def fsdp_version():
    """0 outside FSDP, else 1 or 2: `accelerate launch` with an FSDP config says so in the environment."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() not in ("1", "true"):
        return 0
    return int(os.environ.get("FSDP_VERSION", "1"))


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


def cpu_bf16():
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX tiles), where bf16 halves the bytes a CPU run
    moves; without them torch emulates it. torch reads the flags (cpuinfo) behind these private helpers, and has no
    public one (torch.backends.cpu.get_cpu_capability() says AVX512, not whether it has BF16)."""
    import torch

    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def capability():
    """The CUDA compute capability of GPU 0, e.g. (9, 0) on an H100/H200; (0, 0) without CUDA."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else (0, 0)


def importable(package):
    """Whether the module `package` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a broken half-installed one
        return False


def flash_versions(hopper):
    """The flash attention versions transformers loads here without compiling: its wheel, or else the prebuilt Hub
    kernel transformers itself falls back to (FLASH_ATTN_KERNEL_FALLBACK, through the `kernels` package). That
    check loads the kernel: from the local cache, or downloaded only when the Hub is reachable; HF_HUB_OFFLINE
    never downloads, so an uncached kernel then counts as absent. FA3 only on Hopper or newer, where it runs."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    found = [2] if is_flash_attn_2_available(kernels_fallback_ok=True) else []
    if hopper and is_flash_attn_3_available(kernels_fallback_ok=True):
        found.append(3)
    return found


def auto_attention(cpu_only, bf16):
    """ATTN_IMPLEMENTATION=auto: the newest flash attention that loads here without compiling (`flash_versions`) on
    CUDA in bf16, since flash kernels have no fp32 path; sdpa otherwise."""
    if not (on_gpu(cpu_only) and bf16):
        return "sdpa"
    flash = flash_versions(hopper=capability() >= (9, 0))
    return f"flash_attention_{max(flash)}" if flash else "sdpa"


def one_cpu_thread():
    """One torch thread unless OMP_NUM_THREADS says otherwise: the CPU profiles' tiny models run fastest on one, and
    more thrash a shared machine."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def init_cpu_process_group(timeout_s):
    """Under torchrun on the CPU, start the gloo process group with DDP_TIMEOUT before transformers does: its CPU
    branch leaves ddp_timeout out, so a stalled process would wait torch's default 30 minutes. No-op otherwise.

    The device is named plain "cpu" (ACCELERATE_TORCH_DEVICE): accelerate would make it cpu:0, which Trainer passes
    to torch.load as map_location, and torch's CPU deserializer refused every two-process CPU resume."""
    import torch.distributed as dist

    if world_size() > 1:
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    if world_size() > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))


def model_init_kwargs(attn, bf16, cpu_only, **extra):
    """from_pretrained arguments: bf16 and the fastest attention kernel on CUDA, fp32 and sdpa on CPU, and `extra`;
    under FSDP device_map=None, which TRL sets for DDP and DeepSpeed only ("auto" would put the whole model on each
    rank's GPU before sharding).

    >>> model_init_kwargs("auto", bf16=False, cpu_only=True)
    {'dtype': 'float32', 'attn_implementation': 'sdpa'}
    """
    attn = auto_attention(cpu_only, bf16) if attn == "auto" else attn
    kwargs = {"dtype": "bfloat16" if bf16 else "float32", "attn_implementation": attn, **extra}
    return {**kwargs, "device_map": None} if fsdp_version() else kwargs


def decode_options(cache_implementation):
    """generate()'s keyword arguments for CACHE_IMPLEMENTATION: {} for "dynamic" (transformers' default), or for
    "static" the static KV cache and a compile config for the decode step (CUDA graphs on CUDA; prefill stays eager).
    dynamic=True compiles once for every batch size and cache length, not once per shape; the first call takes a
    minute.

    >>> decode_options("dynamic"), decode_options("static")["cache_implementation"]
    ({}, 'static')
    """
    if cache_implementation != "static":
        return {}
    from transformers import CompileConfig

    return {"cache_implementation": "static", "compile_config": CompileConfig(dynamic=True)}


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


if __name__ == "__main__":
    cuda = cuda_available()
    print(f"cuda {cuda}, gpus {gpu_count()}, capability {capability()}, bf16 {cuda and bf16_gpu()}")
    print("flash attention without compiling:", flash_versions(capability() >= (9, 0)) if cuda else [])
    print("ATTN_IMPLEMENTATION=auto ->", auto_attention(cpu_only=False, bf16=cuda and bf16_gpu()))
