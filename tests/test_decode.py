"""Generation options on the CPU: CACHE_IMPLEMENTATION=static generates exactly what the eager path generates
(training, evaluation, and the compiled decode step itself), and continuous batching in bf16 leaves the LoRA
weights fp32 after a step.

    pytest tests/test_decode.py                  # all slow: ~5 min on 2 shared cores
"""

import json

import pytest
from conftest import run_script, train

import grpotrainer
from grpo import cli, gsm8k, guards, profiles, reward_guard


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


@pytest.mark.slow
def test_static_cache_scores_the_eager_answers_in_evaluate(tmp_path, tiny_model):
    for name in ("dynamic", "static"):
        args = [
            "--smoke",
            f"--MODEL_NAME={tiny_model}",
            f"--OUTPUT_DIR={tmp_path / name}",
            f"--CACHE_IMPLEMENTATION={name}",
        ]
        result = run_script("evaluate.py", *args)
        assert result.returncode == 0, result.stderr[-3000:]
    eager, static = ((tmp_path / n / "eval_test_predictions.jsonl").read_text() for n in ("dynamic", "static"))
    assert len(eager.splitlines()) == 8  # LIMIT=8 under --smoke
    assert static == eager  # greedy: the same tokens, so the same completions, extractions and grades


COMPILED_DECODE = """
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo import gsm8k, hardware

original = hardware.decode_options


def on_every_device(cache_implementation):
    options = original(cache_implementation)
    if options:
        options["compile_config"]._compile_all_devices = True
    return options


hardware.decode_options = on_every_device
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
prompts = gsm8k.load(str(gsm8k.FIXTURE), "train", limit=4)["prompt"]
eager = generation.hf_generator(model, tokenizer, 24)(prompts)
compiled = generation.hf_generator(model, tokenizer, 24, cache_implementation="static")
assert compiled(prompts) == eager, "the first compiled call"  # (text, tokens, truncated) for each prompt, greedy
assert hasattr(model, "_compiled_call"), "transformers did not compile the decode step"
assert compiled(prompts) == eager, "the second call"  # it runs the compiled graph as it is
"""


@pytest.mark.slow
def test_the_compiled_decode_step_generates_the_eager_tokens(tiny_model):
    # transformers compiles only on CUDA; its own test switch compiles on the CPU too (inductor, ~1-2 min). In a
    # fresh Python: dynamo's caches and torch's settings are process-wide, and the suite's earlier tests leave theirs
    out = run_script("-c", COMPILED_DECODE, tiny_model, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def trained_adapter_dtypes(tmp_path, tiny_model):
    """One continuous-batching step in bf16 on the CPU (the GPU run's settings, bar the device), through
    grpotrainer's own build_config and build_trainer; the dtypes of the trainable weights after it, and whether the
    step moved them."""
    import torch

    s = {**cli.constants(grpotrainer), **smoke.SMOKE, "MODEL_NAME": tiny_model, "OUTPUT_DIR": str(tmp_path)}
    s |= {"BF16": True, "USE_TRANSFORMERS_CONTINUOUS_BATCHING": True, "MAX_STEPS": 1, "REPORT_TO": "none"}
    # a reward that tells a random model's completions apart (their lengths), so the step has a gradient
    s |= {"REWARD_FUNCS": ["overlong_reward"], "REWARD_WEIGHTS": [1.0]}
    cb = {"transformers_continuous_batching_config": {"num_blocks": 16, "max_batch_tokens": 256}}  # RAM, not GBs
    config = grpotrainer.build_config(s, cb, cpu_only=True)
    import rewards

    funcs = reward_guard.load(s["REWARD_FUNCS"], rewards.REWARDS, max_completion_length=s["MAX_COMPLETION_LENGTH"])
    train_dataset, _ = grpotrainer.load_data(s)
    trainer = grpotrainer.build_trainer(s, config, reward_funcs=funcs, train_dataset=train_dataset)
    for callback in patches.generation_guards(trainer):  # as grpotrainer.train adds them
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
def test_continuous_batching_in_bf16_keeps_the_adapter_fp32(tmp_path, tiny_model):
    dtypes, moved, rope_kept = trained_adapter_dtypes(tmp_path, tiny_model)
    assert dtypes == {"torch.float32"} and moved  # KeepFp32 put the fp32 weights back, then Adam stepped
    assert rope_kept  # and the rotary inv_freq is the fp32 original, not its bf16 rounding


@pytest.mark.slow
def test_without_the_guard_trl_leaves_the_adapter_bf16(tmp_path, tiny_model, monkeypatch):
    # what the guard undoes: TRL 1.16 casts the whole model, LoRA included, to bf16 before generate_batch
    monkeypatch.setattr(patches, "KeepFp32", lambda model: guards.TrainerCallback())
    dtypes, _, rope_kept = trained_adapter_dtypes(tmp_path, tiny_model)
    assert dtypes == {"torch.bfloat16"} and not rope_kept
