"""Tests of grpo/patches.py: each workaround undoes or reaches what TRL 1.16 and transformers do (the fp32 adapter
and rotary tables under continuous batching and 4-bit, trackio's step, generation's time, the newest rewards), and the
control test shows the library still does it.

    .venv/bin/python -m pytest tests/test_patches.py -q
"""

import os
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from transformers import TrainerState

from grpo import patches

# ---------------------------------------------------------------------------------------------------------------
# KeepFp32, adapter_in_fp32: TRL's casts to bf16


def tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():  # lora_B is zero at init, which would leave lora_A without a gradient: a trained adapter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    model.generate_batch = lambda *args, **kwargs: {}  # stands in for transformers' continuous batching
    return model


def inv_freqs(model):
    return {n: b for n, b in model.named_buffers() if n.endswith("inv_freq")}


def adam_step(model, lr=1e-5):
    """One AdamW step of `lr` on a loss that gives every LoRA weight a gradient; the share of lora_A entries moved."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    lora_a = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}
    ids = torch.randint(0, 64, (2, 12))
    logits = model(input_ids=ids).logits
    (logits.float() ** 2).mean().backward()
    optimizer.step()
    moved = [(p.detach() != lora_a[n]).float().mean().item() for n, p in model.named_parameters() if "lora_A" in n]
    return sum(moved) / len(moved)


def generate_as_trl_does(model):
    # GRPOTrainer._generate_single_turn, continuous batching with bf16: cast the whole model, then generate_batch
    model.to(torch.bfloat16)
    model.generate_batch([[1, 2, 3]])


def test_continuous_batching_keeps_the_adapter_and_rope_fp32():
    model = tiny_lora_model()
    rope = {n: b.clone() for n, b in inv_freqs(model).items()}
    guard = patches.KeepFp32(model)
    guard.on_step_begin(None, None, None)
    generate_as_trl_does(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    assert rope and all(torch.equal(inv_freqs(model)[n], b) for n, b in rope.items())  # the fp32 original itself
    assert {b.dtype for b in inv_freqs(model).values()} == {torch.float32}
    model.to(torch.float32)  # the frozen base was bf16 in a real run; here the step itself runs in fp32
    assert adam_step(model) == 1.0  # every lora_A entry moved


def test_control_without_the_guard_trl_leaves_rope_and_adapter_bf16():
    model = tiny_lora_model()
    rope = {n: b.clone() for n, b in inv_freqs(model).items()}
    generate_as_trl_does(model)
    assert {b.dtype for b in inv_freqs(model).values()} == {torch.bfloat16}
    assert any(not torch.equal(inv_freqs(model)[n].float(), b) for n, b in rope.items())  # rounded
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}


def quantized_style(model):
    # GRPOTrainer.__init__ for a quantized model: every trainable weight but DoRA's magnitude to bf16
    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)


@pytest.mark.parametrize("guarded", [True, False])
def test_a_4bit_run_trains_all_of_lora_a_only_with_the_adapter_in_fp32(guarded):
    model = tiny_lora_model()
    quantized_style(model)
    if guarded:
        patches.adapter_in_fp32(model)
    moved = adam_step(model)
    if guarded:
        assert moved == 1.0
    else:
        assert moved < 0.5  # the control: most 1e-5 updates round away in bf16


# ---------------------------------------------------------------------------------------------------------------
# the callbacks a run's settings call for


def trainer_with(cache="dynamic", batching=False, bf16=False):
    args = SimpleNamespace(cache_implementation=cache, use_transformers_continuous_batching=batching, bf16=bf16)
    model = SimpleNamespace(modules=lambda: [], generate_batch=lambda *a, **k: {})  # KeepFp32 wraps generate_batch
    return SimpleNamespace(args=args, generation_config=SimpleNamespace(), model=model)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, [patches.ResumedSettings, patches.UmaskFiles]),
        ({"cache": "static"}, [patches.ResumedSettings, patches.UmaskFiles, patches.CompileDecode]),
        ({"batching": True, "bf16": True}, [patches.ResumedSettings, patches.UmaskFiles, patches.KeepFp32]),
        ({"batching": True}, [patches.ResumedSettings, patches.UmaskFiles]),  # fp32 throughout: nothing is cast
    ],
)
def test_the_callbacks_a_runs_settings_call_for(settings, expected):
    # ResumedSettings first: a resumed run's intervals and learning rate before any other callback reads them
    assert [type(c) for c in patches.callbacks(trainer_with(**settings))] == expected


def test_umask_files_gives_a_checkpoints_weights_the_mode_the_umask_allows(tmp_path):
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)  # as safetensors writes it
    mask = os.umask(0o022)
    try:
        state = SimpleNamespace(global_step=2, is_world_process_zero=True)
        patches.UmaskFiles().on_save(SimpleNamespace(output_dir=str(tmp_path)), state, None)
    finally:
        os.umask(mask)
    assert weights.stat().st_mode & 0o777 == 0o644  # readable by colleagues under umask 022


def test_compile_decode_turns_the_static_cache_compilation_back_on():
    config = SimpleNamespace(disable_compile=True)  # as TRL 1.16 builds it
    patches.CompileDecode(config).on_train_begin(None, None, None)
    assert config.disable_compile is False and config.compile_config is not None


# ---------------------------------------------------------------------------------------------------------------
# generation's time and the newest rewards, which TRL keeps private


def test_time_generation_counts_the_generation_calls():
    calls = []

    def generate(prompts):
        calls.append(prompts)
        time.sleep(0.01)
        return ["done"] * len(prompts)

    trainer = SimpleNamespace(_generate=generate)
    clock = patches.time_generation(trainer)
    assert trainer._generate(["a", "b"]) == ["done", "done"]  # what the trainer's own call returns, unchanged
    assert clock["calls"] == 1 and clock["seconds"] >= 0.01 and calls == [["a", "b"]]


def test_time_generation_wraps_trls_own_method():
    from trl import GRPOTrainer

    # the private method time_generation wraps must still be the one generation goes through
    assert callable(GRPOTrainer._generate)


def test_latest_rewards_reads_the_newest_batch_per_reward_function():
    trainer = SimpleNamespace(reward_func_names=["a", "b"], _logs={"rewards": {"b": [0.0, 1.0], "a": [1.0, 1.0]}})
    assert patches.latest_rewards(trainer) == [[1.0, 1.0], [0.0, 1.0]]  # in REWARD_FUNCS' order
    assert patches.latest_rewards(SimpleNamespace(reward_func_names=["a"])) is None  # another TRL: no advice
    assert patches.latest_rewards(SimpleNamespace(reward_func_names=["a"], _logs={})) is None


def test_only_latest_rewards_reads_trls_private_logs():
    # TRL has no public hook for a batch's rewards: one named function reads them (patches.latest_rewards)
    for path in [*REPO.glob("*.py"), *REPO.glob("grpo/*.py"), *REPO.glob("demo/*.py")]:
        text = path.read_text(encoding="utf-8")
        uses = text.count('_logs"') + text.count("._logs")
        assert uses == (1 if path.name == "patches.py" else 0), path.name
    source = (REPO / "grpo" / "patches.py").read_text(encoding="utf-8")
    assert 'getattr(trainer, "_logs", None)' in source.split("def latest_rewards")[1].split("\ndef ")[0]


# ---------------------------------------------------------------------------------------------------------------
# trackio_at_step: trackio's points at the trainer's step


def trackio_callback():
    """transformers' TrackioCallback, opened, with a stand-in trackio that records what it logs."""
    from transformers.integrations import TrackioCallback

    logged = []
    callback = TrackioCallback()
    callback._initialized = True  # as after its setup at the first log (which would start a trackio run)
    callback._trackio = SimpleNamespace(log=lambda data, step=None: logged.append((data, step)))
    return callback, logged


LOGS = {"loss": 0.5, "eval_gsm8k_strict_accuracy": 0.25, "train_runtime": 12.0}  # a training and a held-out value


def log_at(callback, step):
    callback.on_log(None, TrainerState(global_step=step, is_world_process_zero=True), None, logs=dict(LOGS))


def test_trackio_logs_at_the_trainers_step():
    callback, logged = trackio_callback()
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[object(), callback]))
    patches.trackio_at_step(trainer)
    log_at(callback, 2)
    log_at(callback, 10)
    # at the trainer's steps, as TensorBoard and W&B place them; train_runtime is a one-off summary, not a curve
    points = {"train/loss": 0.5, "eval/gsm8k_strict_accuracy": 0.25}
    assert logged == [({**points, "train/global_step": 2}, 2), ({**points, "train/global_step": 10}, 10)]


def test_control_transformers_trackio_callback_logs_without_a_step():
    # what trackio_at_step answers: trackio would count its own steps (0, 1, 2 ...) beside the trainer's
    callback, logged = trackio_callback()
    log_at(callback, 10)
    assert [step for _, step in logged] == [None]
