"""The `--smoke` profile: the whole pipeline offline on the CPU in seconds, on a folder that loads like a downloaded
Qwen3 (random 35k-parameter weights, a BPE tokenizer, a ChatML template), built by helpers demo/sums.py reuses.

    python -m demo.smoke outputs/smoke-model   # build the smoke model folder by hand
"""

import json
import sys
from pathlib import Path

from grpo import gsm8k, hardware, preflight
from grpo.files import publish_dir

# What every CPU profile sets, where the GPU defaults differ
CPU_SETTINGS = dict(USE_VLLM=False, VLLM_GPU_MEMORY_UTILIZATION=0.3, BF16=False, ACTIVATION_CHECKPOINTING=False)
# `--smoke`: these settings over the constants, then the command line's; the tiny model below in OUTPUT_DIR/smoke-model
SETTINGS = dict(
    DATASET=str(gsm8k.FIXTURE),
    OUTPUT_DIR="outputs/smoke",
    MAX_COMPLETION_LENGTH=32,
    PER_DEVICE_TRAIN_BATCH_SIZE=4,
    GRADIENT_ACCUMULATION_STEPS=1,
    MAX_STEPS=4,
    SAVE_STEPS=2,
    TEMPERATURE=1.0,
    LEARNING_RATE=1e-3,
    EVAL_STEPS=0,  # the smoke run checks the pipeline; --EVAL_STEPS=2 --EVAL_SUBSET=8 tries the held-out curve
    LOG_COMPLETIONS_STEPS=1,  # a completions table at each of its steps
    # the values it always ran with, where the GPU defaults (sized for Qwen3-8B) differ
    NUM_GENERATIONS=4,
    BETA=0.05,
    WARMUP_STEPS=0,
    EVAL_AFTER=0,
    EVAL_SUBSET=64,
    EVAL_BATCH_SIZE=64,
    **CPU_SETTINGS,
)
FIXED = ("MAX_COMPLETION_LENGTH",)  # set short on purpose: advice does not ask to raise it here


def prepare(s, given):
    """The settings with MODEL_NAME (unless given) at OUTPUT_DIR/smoke-model, which `build` writes."""
    return s if "MODEL_NAME" in given else {**s, "MODEL_NAME": str(Path(s["OUTPUT_DIR"]) / "smoke-model")}


def build(s):
    """Build the smoke model if missing and MODEL_NAME is it; LoRA targets checked first: a refusal writes nothing."""
    if s["MODEL_NAME"] == str(Path(s["OUTPUT_DIR"]) / "smoke-model") and not Path(s["MODEL_NAME"]).is_dir():
        from transformers import Qwen3Config

        config = Qwen3Config(vocab_size=VOCAB_SIZE, architectures=["Qwen3ForCausalLM"], **TINY_QWEN3)  # as saved
        preflight.refuse_misfit_model(s, config=config)
        cpu_model(s["OUTPUT_DIR"])


def finish(output_dir):
    """The smoke run's last word: what it showed."""
    return (
        "smoke: the whole pipeline ran offline (data, rewards, GRPO steps, checkpoints, adapter, card); the model is "
        "random, so rewards and accuracy stay near 0. `--demo` learns for real on the CPU (docs/demo.md)."
    )


# Qwen3's chat template, reduced to what GSM8K needs: system/user/assistant turns and the `enable_thinking` switch.
# With thinking off, Qwen3 pre-fills an empty think block so the model answers directly; this template does the same.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# A model small enough to take a GRPO step in well under a second on one CPU core (35,008 parameters).
TINY_QWEN3 = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
    # 10x Qwen's 0.02: after the final RMSNorm, LoRA (which leaves the tied embedding alone) can then move a
    # token's logit by several nats instead of ~0.6, so the learning test can show a policy actually improving.
    initializer_range=0.2,
)
VOCAB_SIZE = 512  # 256 byte symbols + special tokens + ~250 merges learnt from the fixture (so "####" is one token)


def build_tokenizer(texts=None, split_digits=False):
    """A byte-level BPE tokenizer trained on `texts` (default: the fixture) with Qwen's ChatML tokens.
    `split_digits`: one digit per token, as Qwen's tokenizer splits numbers (the demo's arithmetic needs it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if texts is None:  # the fixture, and the system prompt, whose words should tokenise compactly too
        rows = map(json.loads, gsm8k.FIXTURE.read_text(encoding="utf-8").splitlines())
        texts = [gsm8k.DEFAULT_PROMPT] + [row[key] for row in rows for key in ("question", "answer")]
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    tok.pre_tokenizer = digits if split_digits else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        # Qwen's ChatML markers: Qwen3 ends an assistant turn with <|im_end|>; <|endoftext|> is its pad token
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def build_model(tokenizer, seed=0, **overrides):
    """A randomly initialised Qwen3ForCausalLM sized by TINY_QWEN3 (or `overrides`, e.g. real Qwen3 shapes)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen3Config(
        **{"vocab_size": len(tokenizer), **TINY_QWEN3, **overrides},
        bos_token_id=None,
        eos_token_id=eos[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)  # same folder contents every time, so a resumed run sees the same base model
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    return model


def cpu_model(output_dir):
    """One torch thread (fastest for the tiny model) and output_dir/smoke-model, built by rank 0 under torchrun while
    the others wait: save_pretrained writes weights on rank 0 only, so another rank's would lack them."""
    import torch.distributed as dist

    hardware.one_cpu_thread()
    path = Path(output_dir) / "smoke-model"
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return ensure_model_dir(path)
    if dist.get_rank() == 0:
        ensure_model_dir(path)
    dist.barrier()
    return str(path)


def ensure_model_dir(path):
    path = Path(path)
    if not (path / "config.json").exists():
        tokenizer = build_tokenizer()
        model = build_model(tokenizer)
        with publish_dir(path) as tmp:  # never a half folder; another rank's finished one is kept
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return str(path)


if __name__ == "__main__":
    print(ensure_model_dir(sys.argv[1] if len(sys.argv) > 1 else "outputs/smoke-model"))
