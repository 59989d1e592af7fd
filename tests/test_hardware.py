"""grpo/hardware.py: which attention kernel auto picks for what a machine offers, and what each setting needs.

.venv/bin/python -m pytest tests/test_hardware.py -q
"""

import pytest

from grpo import hardware

FA2, FA3 = hardware.FA2_KERNEL, hardware.FA3_KERNEL


HOPPER, AMPERE = (9, 0), (8, 0)


@pytest.mark.parametrize(
    ("cuda", "bf16", "modules", "capability", "cached", "expected"),
    [
        # FA3 only on Hopper or newer, where its wheel's kernels run; FA2 otherwise
        (True, True, {"flash_attn_interface", "flash_attn"}, HOPPER, (), "flash_attention_3"),
        (True, True, {"flash_attn_interface", "flash_attn"}, AMPERE, (), "flash_attention_2"),
        (True, True, {"flash_attn"}, HOPPER, (), "flash_attention_2"),
        # no wheel: a Hub kernel, but only one already in the local cache (auto never downloads)
        (True, True, {"kernels"}, HOPPER, (FA2, FA3), FA3),
        (True, True, {"kernels"}, AMPERE, (FA2, FA3), FA2),
        (True, True, {"kernels"}, HOPPER, (FA2,), FA2),
        (True, True, {"kernels"}, HOPPER, (), "sdpa"),
        (True, True, set(), HOPPER, (FA2,), "sdpa"),  # cached but `kernels` missing: nothing can load it
        # flash kernels have no fp32 path, and none runs on the CPU
        (True, False, {"flash_attn_interface", "flash_attn", "kernels"}, HOPPER, (FA2,), "sdpa"),
        (False, True, {"flash_attn", "kernels"}, (0, 0), (FA2,), "sdpa"),
    ],
)
def test_auto_picks_the_fastest_available_kernel(cuda, bf16, modules, capability, cached, expected):
    picked = hardware.pick_attention(
        "auto", cuda=cuda, bf16=bf16, importable=modules.__contains__, capability=capability, cached_kernels=cached
    )
    assert picked == expected


@pytest.mark.parametrize("requested", ["sdpa", "eager", "flash_attention_2", FA2])
def test_an_explicit_choice_is_kept(requested):
    # the user's choice wins even where it cannot load: attention_problem reports that, pick_attention never hides it
    assert hardware.pick_attention(requested, cuda=False, bf16=False, importable=set().__contains__) == requested


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


def test_cached_kernels_reads_both_cache_layouts(tmp_path, monkeypatch):
    # kernels >= 0.16 stores repositories as "kernels--org--name", older caches as "models--org--name"
    (tmp_path / "kernels--kernels-community--flash-attn2" / "snapshots" / "abc").mkdir(parents=True)
    (tmp_path / "models--kernels-community--vllm-flash-attn3" / "snapshots").mkdir(parents=True)  # empty: no files
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    assert hardware.cached_kernels() == (FA2,)


@pytest.mark.parametrize(("name", "expected"), [("json", True), ("no_such_module_xyz", False), ("no_such.sub", False)])
def test_importable(name, expected):
    # a missing parent package is "not importable", not an exception
    assert hardware.importable(name) is expected


def test_flash_attention_only_in_bf16_on_cuda(gpu):
    gpu(packages={"flash_attn"})
    assert hardware.model_init_kwargs("auto", True, cpu_only=False)["attn_implementation"] == "flash_attention_2"
    # flash-attn kernels run only in 16-bit: fp32 (e.g. on a V100) must fall back to sdpa
    kwargs = hardware.model_init_kwargs("auto", False, cpu_only=False)
    assert kwargs == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert hardware.model_init_kwargs("auto", True, cpu_only=True)["attn_implementation"] == "sdpa"
