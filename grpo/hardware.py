"""The machine's facts (CUDA, bf16, GPUs, packages, processes) and the model-loading arguments derived from them.

python -m grpo.hardware     # what this machine offers, and the attention kernel auto picks"""

import datetime
import importlib.util
import os
import re


def vllm_lora_rank(rank):
    """The smallest --max-lora-rank vLLM accepts (one of its fixed choices) that holds an adapter of rank `rank`."""
    return next((r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank), rank)


# What transformers 5.17 loads for Qwen3 besides a Hub kernel; not paged|..., which continuous batching picks itself
ATTENTION = ("auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# org/name[@rev][:function], as transformers' integrations.hub_kernels.is_kernel matches a Hub kernel
HUB_KERNEL = re.compile(r"^[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?$")
FA2_KERNEL = "kernels-community/flash-attn2"  # transformers' fallback for flash_attention_2, named in messages


def attention_problem(requested, *, cuda, bf16, importable):
    """Why `requested` cannot load on this machine (one sentence naming the fix), or None when it can."""
    hub = bool(HUB_KERNEL.match(requested))
    if requested not in ATTENTION and not hub:
        known = ", ".join(ATTENTION)
        return f"ATTN_IMPLEMENTATION={requested!r} is not one of {known} nor a Hub kernel such as {FA2_KERNEL}."
    wheel = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(requested)
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
    """0 outside FSDP, else 1 or 2, as `accelerate launch` says in the environment."""
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
    return int(os.environ.get("FSDP_VERSION", "1")) if fsdp else 0


def on_gpu(cpu_only):
    """Whether this run computes on CUDA: the --smoke and --demo profiles always run on the CPU."""
    return not cpu_only and cuda_available()


def cuda_available():
    return importlib.import_module("torch").cuda.is_available()


def gpu_count():
    return importlib.import_module("torch").cuda.device_count()


def bf16_gpu():
    return importlib.import_module("torch").cuda.is_bf16_supported()


def cpu_bf16():
    """Whether this CPU has native bf16 (AVX512-BF16 or AMX), which torch's public get_cpu_capability() omits."""
    torch = importlib.import_module("torch")
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def capability():
    """GPU 0's compute capability, e.g. (9, 0) on an H100; (0, 0) without CUDA."""
    torch = importlib.import_module("torch")
    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else (0, 0)


def importable(package):
    """Whether the module `package` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a broken half-installed one
        return False


def flash_versions(hopper):
    """The flash attention versions transformers loads here without compiling: a wheel, or the Hub kernel it falls
    back to (loaded to check, so offline an uncached one counts as absent). FA3 only on Hopper or newer."""
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    found = [2] if is_flash_attn_2_available(kernels_fallback_ok=True) else []
    if hopper and is_flash_attn_3_available(kernels_fallback_ok=True):
        found.append(3)
    return found


def auto_attention(cpu_only, bf16):
    """auto: the newest flash attention `flash_versions` finds, on CUDA in bf16 (flash has no fp32 path); else sdpa."""
    if not (on_gpu(cpu_only) and bf16):
        return "sdpa"
    flash = flash_versions(hopper=capability() >= (9, 0))
    return f"flash_attention_{max(flash)}" if flash else "sdpa"


def one_cpu_thread():
    """One torch thread unless OMP_NUM_THREADS says otherwise: tiny CPU models run fastest on one."""
    if "OMP_NUM_THREADS" not in os.environ:
        importlib.import_module("torch").set_num_threads(1)


def init_cpu_process_group(timeout_s):
    """Under torchrun on the CPU, start gloo with `timeout_s` before transformers does without it (30 minutes), on
    plain "cpu": accelerate's cpu:0 reaches torch.load as map_location, which refused two-process CPU resumes."""
    if world_size() > 1:
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
        dist = importlib.import_module("torch.distributed")
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))


def model_init_kwargs(attn, bf16, cpu_only, **extra):
    """from_pretrained arguments: bf16 and the fastest attention on CUDA, fp32 and sdpa on CPU, and `extra`."""
    attn = auto_attention(cpu_only, bf16) if attn == "auto" else attn
    return {"dtype": "bfloat16" if bf16 else "float32", "attn_implementation": attn, **extra}


def decode_options(cache_implementation):
    """generate()'s arguments: none for a "dynamic" cache, or the static cache and a decode step compiled once."""
    if cache_implementation != "static":
        return {}
    from transformers import CompileConfig

    return {"cache_implementation": "static", "compile_config": CompileConfig(dynamic=True)}


def quantization_config(load_in_4bit, bf16):
    """QLoRA's 4-bit NF4 storage for the base weights (bitsandbytes, CUDA), or None."""
    if not load_in_4bit:
        return None
    from transformers import BitsAndBytesConfig

    dtype = "bfloat16" if bf16 else "float32"  # torch dtypes by name, as BitsAndBytesConfig reads them
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype if bf16 else "uint8",  # ZeRO-3/FSDP shard it as the weights' dtype
    )


if __name__ == "__main__":
    cuda = cuda_available()
    print(f"cuda {cuda}, gpus {gpu_count()}, capability {capability()}, bf16 {cuda and bf16_gpu()}")
    print("flash attention without compiling:", flash_versions(capability() >= (9, 0)) if cuda else [])
    print("ATTN_IMPLEMENTATION=auto ->", auto_attention(cpu_only=False, bf16=cuda and bf16_gpu()))
