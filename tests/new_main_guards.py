"""The fp32 guards against TRL's bf16 casts: continuous batching's whole-model cast before generate_batch, and
QLoRA's cast of the adapter. Each reproduces TRL 1.16's own lines on a tiny Qwen3 with LoRA, then takes a real Adam
step of 1e-5, and has a control that fails without the guard.

.venv/bin/python -m pytest tests/new_main_guards.py -q
"""

import pytest
import torch

from grpo import guards


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
    guard = guards.KeepFp32(model)
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
        guards.adapter_in_fp32(model)
    moved = adam_step(model)
    if guarded:
        assert moved == 1.0
    else:
        assert moved < 0.5  # the control: most 1e-5 updates round away in bf16
