"""grpo/hardware.py: which attention kernel auto picks for what a machine offers, and what each setting needs.

.venv/bin/python -m pytest tests/test_hardware.py -q
"""

from pathlib import Path

import pytest

from grpo import hardware

FA2 = hardware.FA2_KERNEL
HOPPER, AMPERE = (9, 0), (8, 0)


@pytest.mark.parametrize(
    ("cuda", "bf16", "capability", "loadable", "expected"),
    [
        # FA3 only on Hopper or newer, where its wheel or Hub kernel runs; FA2 otherwise
        (True, True, HOPPER, {2, 3}, "flash_attention_3"),
        (True, True, AMPERE, {2, 3}, "flash_attention_2"),
        (True, True, HOPPER, {2}, "flash_attention_2"),
        # nothing loads without compiling (no wheel, no cached or reachable Hub kernel): sdpa
        (True, True, HOPPER, set(), "sdpa"),
        # flash kernels have no fp32 path, and none runs on the CPU
        (True, False, HOPPER, {2, 3}, "sdpa"),
        (False, True, (0, 0), {2, 3}, "sdpa"),
    ],
)
def test_auto_picks_the_newest_flash_kernel_that_loads(gpu, monkeypatch, cuda, bf16, capability, loadable, expected):
    gpu(count=int(cuda))
    monkeypatch.setattr(hardware, "capability", lambda: capability)
    # transformers' is_flash_attn_*_available(kernels_fallback_ok=True): the wheel, else its Hub kernel fallback
    monkeypatch.setattr(hardware, "flash_versions", lambda hopper: sorted(v for v in loadable if v == 2 or hopper))
    assert hardware.model_init_kwargs("auto", bf16, cpu_only=False)["attn_implementation"] == expected


@pytest.mark.parametrize("requested", ["sdpa", "eager", "flash_attention_2", FA2])
def test_an_explicit_choice_is_kept(requested):
    # the user's choice wins even where it cannot load: attention_problem reports that, auto never hides it
    assert hardware.model_init_kwargs(requested, False, cpu_only=True)["attn_implementation"] == requested


def test_without_cuda_no_flash_kernel_is_looked_for(monkeypatch):
    # on the CPU, auto answers sdpa without asking transformers (which may load a Hub kernel to check)
    monkeypatch.setattr(hardware, "flash_versions", lambda hopper: pytest.fail("asked for a flash kernel"))
    assert hardware.auto_attention(cpu_only=True, bf16=True) == "sdpa"


@pytest.mark.parametrize(
    ("requested", "cuda", "bf16", "modules", "problem"),
    [
        ("auto", False, False, set(), None),
        ("sdpa", False, False, set(), None),
        ("flex_attention", False, False, set(), None),
        ("flash_attention_2", True, True, {"flash_attn"}, None),
        ("flash_attention_2", True, True, set(), "needs the flash-attn package or the kernels package"),
        ("flash_attention_2", True, True, {"kernels"}, None),  # transformers loads kernels-community/flash-attn2
        ("flash_attention_3", True, True, {"flash_attn"}, "needs the flash-attn-3 package"),
        ("flash_attention_2", True, False, {"flash_attn"}, "needs a CUDA GPU and BF16=True"),
        (FA2, True, True, {"kernels"}, None),
        (FA2 + "@v3:flash_attn_varlen_func", True, True, {"kernels"}, None),
        (FA2, True, True, set(), "needs the kernels package (requirements-cuda.txt)"),
        ("flash_attention", True, True, {"flash_attn"}, "is not one of auto, sdpa"),  # a typo, not a Hub repo
        ("paged|sdpa", True, True, set(), "is not one of"),  # continuous batching picks paged variants itself
    ],
)
def test_attention_problem(requested, cuda, bf16, modules, problem):
    found = hardware.attention_problem(requested, cuda=cuda, bf16=bf16, importable=modules.__contains__)
    assert found is None if problem is None else problem in found


@pytest.mark.parametrize(("name", "expected"), [("json", True), ("no_such_module_xyz", False), ("no_such.sub", False)])
def test_importable(name, expected):
    # a missing parent package is "not importable", not an exception
    assert hardware.importable(name) is expected


def test_flash_versions_asks_transformers_with_its_hub_kernel_fallback(monkeypatch):
    import transformers.utils

    asked = []
    for version in (2, 3):
        answer = lambda kernels_fallback_ok=False, v=version: asked.append((v, kernels_fallback_ok)) or True  # noqa: E731
        monkeypatch.setattr(transformers.utils, f"is_flash_attn_{version}_available", answer)
    assert hardware.flash_versions(hopper=False) == [2]
    assert asked == [(2, True)]  # off Hopper the FA3 kernel is not even loaded
    assert hardware.flash_versions(hopper=True) == [2, 3]


def test_cpu_bf16_agrees_with_the_cpus_own_flags():
    # torch reads the instruction set itself; on Linux the kernel lists the same flags in /proc/cpuinfo
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    assert hardware.cpu_bf16() == bool({"avx512_bf16", "amx_bf16", "amx_tile"} & set(flags))


def test_vllm_lora_rank_rounds_up_to_a_rank_vllm_accepts():
    # vLLM's --max-lora-rank takes fixed choices; above the largest the rank itself is passed on
    assert (hardware.vllm_lora_rank(16), hardware.vllm_lora_rank(17), hardware.vllm_lora_rank(1000)) == (16, 32, 1000)


def test_model_init_kwargs_on_the_cpu():
    assert hardware.model_init_kwargs("auto", bf16=False, cpu_only=True) == {
        "dtype": "float32",
        "attn_implementation": "sdpa",
    }


def test_decode_options():
    # the dynamic cache is transformers' default: nothing to pass
    assert hardware.decode_options("dynamic") == {}
    assert hardware.decode_options("static")["cache_implementation"] == "static"


def test_quantization_config_keeps_the_weights_dtype_for_sharding():
    import torch

    config = hardware.quantization_config(True, bf16=True)
    assert (config.bnb_4bit_compute_dtype, config.bnb_4bit_quant_storage) == (torch.bfloat16, torch.bfloat16)
    config = hardware.quantization_config(True, bf16=False)
    assert (config.bnb_4bit_compute_dtype, config.bnb_4bit_quant_storage) == (torch.float32, torch.uint8)
