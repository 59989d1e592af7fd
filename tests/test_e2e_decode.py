"""End to end: generation options in a training run on the CPU. CACHE_IMPLEMENTATION=static trains on exactly what
the eager path generates, and continuous batching in bf16 leaves the LoRA weights fp32 after a step (grpo/patches.py's
KeepFp32). The same options in evaluation: tests/test_generation.py and tests/test_evaluate.py.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_e2e_decode.py -q   # all slow: ~3 min on 2 shared cores
"""

import json

import pytest
from conftest import load_rewards, train
from transformers import TrainerCallback

import grpotrainer
from demo import smoke
from grpo import cli, gsm8k, patches


def completions(output_dir):
    """Every completion TRL logged (OUTPUT_DIR/completions/*.parquet), step by step, and the greedy EVAL_BEFORE
    predictions, as plain lists."""
    import pandas as pd

    logged = [
        pd.read_parquet(p)["completion"].tolist() for p in sorted((output_dir / "completions").glob("*.parquet"))
    ]
    rows = (output_dir / "eval_test_before_predictions.jsonl").read_text().splitlines()
    return logged, [json.loads(row)["completion"] for row in rows]


@pytest.mark.slow
def test_static_cache_trains_on_the_eager_completions(tmp_path, tiny_model):
    args = [f"--MODEL_NAME={tiny_model}", "--MAX_STEPS=2", "--EVAL_BEFORE=8", "--EVAL_SAMPLES=0"]
    args += [f"--DATASET={gsm8k.FIXTURE}"]
    for name in ("dynamic", "static"):
        result = train(tmp_path / name, *args, f"--CACHE_IMPLEMENTATION={name}")
        assert result.returncode == 0, result.stderr[-3000:]
    eager, static = completions(tmp_path / "dynamic"), completions(tmp_path / "static")
    assert len(eager[0]) == 2 and len(eager[1]) == 8  # two steps logged, eight problems scored
    # same seed, same weights, the same logits from either cache: the same samples and the same greedy answers
    assert static == eager


@pytest.fixture
def offline(monkeypatch):
    """The Hub off in this process, as conftest's subprocesses run: TRL's trainer would otherwise send its telemetry
    from a thread of huggingface_hub's that outlives the test."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read once, at import


def trained_adapter_dtypes(tmp_path, tiny_model):
    """One continuous-batching step in bf16 on the CPU (the GPU run's settings, bar the device), through
    grpotrainer's own build_config and build_trainer; the dtypes of the trainable weights after it, and whether the
    step moved them."""
    import torch

    s = {**cli.constants(grpotrainer), **smoke.SETTINGS, "MODEL_NAME": tiny_model, "OUTPUT_DIR": str(tmp_path)}
    s |= {"BF16": True, "USE_TRANSFORMERS_CONTINUOUS_BATCHING": True, "MAX_STEPS": 1, "REPORT_TO": "none"}
    # a reward that tells a random model's completions apart (their lengths), so the step has a gradient
    s |= {"REWARD_FUNCS": ["overlong_reward"], "REWARD_WEIGHTS": [1.0]}
    cb = {"transformers_continuous_batching_config": {"num_blocks": 16, "max_batch_tokens": 256}}  # RAM, not GBs
    config = grpotrainer.build_config(s, cb, cpu_only=True)
    funcs = load_rewards(s["REWARD_FUNCS"], s["MAX_COMPLETION_LENGTH"])
    train_dataset, _ = grpotrainer.load_data(s)
    trainer = grpotrainer.build_trainer(s, config, reward_funcs=funcs, train_dataset=train_dataset)
    for callback in patches.callbacks(trainer):  # as grpotrainer.train adds them
        trainer.add_callback(callback)
    trainable = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    before = {n: p.detach().float().clone() for n, p in trainable.items()}
    rope = {n: b.clone() for n, b in trainer.model.named_buffers() if n.endswith("inv_freq")}
    trainer.train()
    moved = any(not torch.equal(before[n], p.detach().float()) for n, p in trainable.items())
    buffers = dict(trainer.model.named_buffers())
    rope_kept = bool(rope) and all(torch.equal(buffers[n], b) for n, b in rope.items())  # same values, fp32
    return {str(p.dtype) for p in trainable.values()} | {str(buffers[n].dtype) for n in rope}, moved, rope_kept


@pytest.mark.slow
def test_continuous_batching_in_bf16_keeps_the_adapter_fp32(tmp_path, tiny_model, offline):
    dtypes, moved, rope_kept = trained_adapter_dtypes(tmp_path, tiny_model)
    assert dtypes == {"torch.float32"} and moved  # KeepFp32 put the fp32 weights back, then Adam stepped
    assert rope_kept  # and the rotary inv_freq is the fp32 original, not its bf16 rounding


@pytest.mark.slow
def test_without_the_guard_trl_leaves_the_adapter_bf16(tmp_path, tiny_model, monkeypatch, offline):
    # what the guard undoes: TRL 1.16 casts the whole model, LoRA included, to bf16 before generate_batch
    monkeypatch.setattr(patches, "KeepFp32", lambda model: TrainerCallback())
    dtypes, _, rope_kept = trained_adapter_dtypes(tmp_path, tiny_model)
    assert dtypes == {"torch.bfloat16"} and not rope_kept
