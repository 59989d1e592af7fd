"""What this machine can run: CUDA, bf16, installed packages, and the attention kernel to load the model with.

preflight.py and grpotrainer.py ask here instead of importing torch themselves. `pick_attention` is a pure function of
what was found, so its choice is tested without a GPU:

    python -m grpo.hardware     # prints what this machine offers and what ATTN_IMPLEMENTATION=auto picks

Nothing here compiles anything: flash-attn is used when a prebuilt wheel is installed, a Hub kernel (the `kernels`
package) when it is already in the local cache, and PyTorch's own sdpa otherwise.
"""

import importlib.util
import os
import re
from pathlib import Path

# ATTN_IMPLEMENTATION values transformers 5.17 loads for Qwen3, besides a Hub kernel "org/repo" (see HUB_KERNEL).
# The paged|... variants are left out: continuous batching switches to them by itself while generating.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts


def vllm_lora_rank(rank):
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of rank `rank`.

    >>> vllm_lora_rank(16), vllm_lora_rank(17), vllm_lora_rank(1000)
    (16, 32, 1000)
    """
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# A Hub kernel repository, as transformers' integrations.hub_kernels.is_kernel matches it: org/name[@rev][:function]
HUB_KERNEL = re.compile(r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")
# The prebuilt Hub kernels transformers 5.17 itself falls back to for flash_attention_2/3 (FLASH_ATTN_KERNEL_FALLBACK)
FA2_KERNEL = "kernels-community/flash-attn2"
FA3_KERNEL = "kernels-community/vllm-flash-attn3"


def pick_attention(requested, *, cuda, bf16, importable, capability=(0, 0), cached_kernels=()):
    """The attn_implementation to load the model with: `requested` itself unless it is "auto".

    auto picks the fastest kernel that needs no compiling, on CUDA in bf16 (flash kernels have no fp32 path):
    flash_attention_3 (the flash-attn-3 wheel, module flash_attn_interface) on Hopper or newer, else
    flash_attention_2 (the flash-attn wheel), else a prebuilt Hub kernel already in the local cache (the `kernels`
    package; never a download at run time), else PyTorch's sdpa, which is also the answer on CPU and in fp32.

    Args:
        requested: the ATTN_IMPLEMENTATION setting.
        cuda: whether the run computes on a CUDA GPU.
        bf16: whether it trains in bfloat16.
        importable: a function telling whether a Python module can be imported (`importable` below).
        capability: the GPU's CUDA compute capability (9, 0) for Hopper; (0, 0) when unknown or no GPU.
        cached_kernels: the Hub kernel repositories present in the local cache (`cached_kernels` below).

    >>> pick_attention("auto", cuda=True, bf16=True, importable={"flash_attn"}.__contains__)
    'flash_attention_2'
    >>> pick_attention("auto", cuda=False, bf16=False, importable={"flash_attn"}.__contains__)
    'sdpa'
    """
    if requested != "auto":
        return requested
    if not (cuda and bf16):
        return "sdpa"
    hopper = tuple(capability) >= (9, 0)
    if hopper and importable("flash_attn_interface"):
        return "flash_attention_3"
    if importable("flash_attn"):
        return "flash_attention_2"
    if importable("kernels"):
        for kernel in (FA3_KERNEL, FA2_KERNEL) if hopper else (FA2_KERNEL,):
            if kernel in cached_kernels:
                return kernel
    return "sdpa"


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


def cached_kernels(repos=(FA2_KERNEL, FA3_KERNEL)):
    """Those of `repos` already in the local cache the `kernels` package reads ($KERNELS_CACHE, else the Hugging Face
    Hub cache), in either of its layouts ("kernels--org--name", or the older "models--org--name")."""
    from huggingface_hub import constants

    cache = Path(os.environ.get("KERNELS_CACHE") or constants.HF_HUB_CACHE)
    found = []
    for repo in repos:
        folders = [cache / f"{kind}--{repo.replace('/', '--')}" / "snapshots" for kind in ("kernels", "models")]
        if any(folder.is_dir() and any(folder.iterdir()) for folder in folders):
            found.append(repo)
    return tuple(found)


def auto_attention(cpu_only, bf16):
    """pick_attention("auto", ...) for this machine."""
    gpu = on_gpu(cpu_only)
    return pick_attention(
        "auto",
        cuda=gpu,
        bf16=bf16,
        importable=importable,
        capability=capability() if gpu else (0, 0),
        cached_kernels=cached_kernels() if gpu and importable("kernels") else (),
    )


def one_cpu_thread():
    """One torch thread unless OMP_NUM_THREADS says otherwise: the CPU profiles' tiny models run fastest on one, and
    more thrash a shared machine."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


def init_cpu_process_group(timeout_s):
    """Under torchrun on the CPU, start the gloo process group with DDP_TIMEOUT before transformers does: its CPU
    branch leaves ddp_timeout out, so a stalled process would wait torch's default 30 minutes. No-op otherwise.

    It also names the device plain "cpu" (accelerate's ACCELERATE_TORCH_DEVICE): accelerate's MULTI_CPU branch
    would make it cpu:0 (`PartialState.set_device`), which Trainer then passes to torch.load as map_location for
    the optimizer state when world_size > 1, and torch's CPU deserializer accepts only "cpu": every resume of a
    two-process CPU run failed with "don't know how to restore data location ... (tagged with cpu:0)"."""
    import datetime

    import torch.distributed as dist

    if world_size() > 1:
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    if world_size() > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))


def model_init_kwargs(attn, bf16, cpu_only):
    """from_pretrained arguments: bf16 and the fastest attention kernel on CUDA, fp32 and sdpa on CPU.

    >>> model_init_kwargs("auto", bf16=False, cpu_only=True)
    {'dtype': 'float32', 'attn_implementation': 'sdpa'}
    """
    attn = auto_attention(cpu_only, bf16) if attn == "auto" else attn
    return {"dtype": "bfloat16" if bf16 else "float32", "attn_implementation": attn}


def decode_options(cache_implementation):
    """generate()'s keyword arguments for CACHE_IMPLEMENTATION: {} for "dynamic" (transformers' default: a dynamic KV
    cache, eager), or for "static" its static KV cache with a compile config, with which generate() compiles the
    decode step (torch.compile, inductor, mode "reduce-overhead": CUDA graphs) where transformers compiles, on CUDA;
    on the CPU the static cache alone. Prefill stays eager. dynamic=True: one compilation for every batch size and
    cache length (transformers grows the static cache to the longest prompt seen), not one per shape. The first
    call compiles, about a minute.

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
    print("importable:", {name: importable(name) for name in ("flash_attn", "flash_attn_interface", "kernels")})
    print("cached Hub kernels:", cached_kernels())
    print("ATTN_IMPLEMENTATION=auto ->", auto_attention(cpu_only=False, bf16=cuda and bf16_gpu()))
