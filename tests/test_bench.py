"""The benchmarks run end to end on CPU: the GPU benchmark's --dry-run (tiny shapes, the same code path as on a GPU)
and a short overhead benchmark; plus the sizes the GPU benchmark's bandwidth bound is computed from.

    pytest tests/test_bench.py          # ~20 s on 2 cores (more while other jobs share them)
"""

import json

import pytest
import torch
from conftest import run_script

from bench import bench_gpu

# Parameters of the real models (Qwen3-0.6B, Qwen3-8B), and the bytes a bf16 decode step reads: every layer and the
# LM head; Qwen3-8B's separate input embedding (151936 x 4096 = 622,329,856 parameters) is only a row lookup.
REAL_SIZES = {"qwen3-0.6b": (596_049_920, 1_192_099_840), "qwen3-8b": (8_190_735_360, 15_136_811_008)}


@pytest.mark.parametrize("name", REAL_SIZES)
def test_real_shapes_have_the_published_sizes(name):
    import smoke

    with bench_gpu.build_defaults("meta", torch.bfloat16):  # shapes only: no memory, no initialisation maths
        model = smoke.build_model(smoke.build_tokenizer(), **bench_gpu.SHAPES[name])
    assert (sum(p.numel() for p in model.parameters()), bench_gpu.decode_weight_bytes(model)) == REAL_SIZES[name]
    assert model.config.initializer_range == 0.02  # Qwen's, not smoke.TINY_QWEN3's 0.2 (random logits stay sane)


def test_kv_bytes_per_decode_step():
    # Qwen3-8B, bf16: 36 layers x (K and V) x 8 heads x 128 dims x 2 bytes = 147,456 bytes per token of context;
    # one 100-token prompt with 256 new tokens averages 100 + 128 = 228 tokens of context per decode step.
    assert bench_gpu.kv_bytes_per_decode_step(bench_gpu.SHAPES["qwen3-8b"], [100], 256, 2) == 147_456 * 228


def test_token_reward_ignores_text_and_extra_columns():
    # (1 + 2) % 7 / 6 and 6 % 7 / 6: from ids alone, so the 512-token tokenizer's lossy decoding cannot matter
    assert bench_gpu.token_reward(["?", "?"], completion_ids=[[1, 2], [6]], trainer_state=None) == [0.5, 1.0]


@pytest.mark.slow
def test_gpu_bench_dry_run(tmp_path):
    result = run_script("bench/bench_gpu.py", "--dry-run", "--json", str(tmp_path / "gpu.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["dry_run"] is True
    cases = {(c["model"], c["backend"]): c for c in report["cases"]}
    assert {k: c["status"] for k, c in cases.items()} == {
        ("tiny", "hf"): "ok",
        ("tiny", "vllm"): "skipped",  # vLLM is CUDA only; a GPU run without vllm records why it skipped, too
    }
    case = cases["tiny", "hf"]
    assert case["completions"] == 4  # 2 prompts x 2 generations, one generation round in the measured step
    assert case["completion_tokens"] == 32  # every completion forced to exactly 8 tokens
    assert len(case["all_steps_s"]) == 2  # a warm-up step, then the measured one
    # smoke.TINY_QWEN3 with a 4096-token vocabulary, untied: 2 layers x 9,296 + final norm 32 + LM head 4096 x 32 =
    # 149,696 fp32 parameters read per decode step, and the input embedding (4096 x 32) besides
    assert (case["decode_weight_bytes"], case["params"]) == (149_696 * 4, 149_696 + 4096 * 32)
    assert (case["device"], case["dtype"], case["peak_memory_gb"]) == ("cpu", "float32", None)
    assert case["gen_tokens_per_s"] > 0 and case["train_tokens_per_s"] > 0 and case["bandwidth_fraction"] > 0


@pytest.mark.slow
def test_overhead_bench_runs_and_times_the_same_work(tmp_path):
    args = ["--steps", "4", "--warmup", "1", "--repeats", "1", "--json", str(tmp_path / "overhead.json")]
    result = run_script("bench/bench_overhead.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "overhead.json").read_text())
    assert report["same_tokens"] is True  # same seed, model, prompts: both sides sampled the same completions
    assert report["timed_steps"] == 2  # 4 steps: 3 step-to-step intervals, the first dropped as warm-up
    assert report["ratio"] > 0 and report["ratio_q1"] <= report["ratio"] <= report["ratio_q3"]
