"""The offline profiles: `--smoke` (the pipeline in seconds) and `--demo` (a run that learns), on the CPU.

Both must run with no access to the Hugging Face Hub, so instead of downloading Qwen they build, once, folders that
look exactly like downloaded checkpoints, loaded through the same `from_pretrained` path as `Qwen/Qwen3-8B`:

- smoke: a `Qwen3ForCausalLM` with random weights (35k parameters) and a byte-level BPE tokenizer trained on the
  project's own fixture, with Qwen's ChatML special tokens and a chat template that honours `enable_thinking`;
- demo: a synthetic GSM8K-format task generated from SEED (`make_task`) and a tiny Qwen3 warm-started on it by a
  short supervised phase (TRL's SFTTrainer), so that GRPO has something to improve (docs/demo.md).

    python -m grpo.profiles smoke-model outputs/smoke-model   # build the smoke model folder by hand
    python -m grpo.profiles demo-task outputs/demo-task 0      # write the demo task's {train,test}.jsonl for a seed
"""

import json
import logging
import os
import random
import shutil
import sys
from pathlib import Path

from grpo import gsm8k, hardware
from grpo.files import publish_dir

log = logging.getLogger("grpotrainer.profiles")
FIXTURE = gsm8k.FIXTURE  # our own GSM8K-format problems

# `grpotrainer.py --smoke`: these settings over the constants, then the command line's. The same pipeline, offline on
# the CPU in fp32 with one thread, on the tiny model below (built in OUTPUT_DIR/smoke-model unless MODEL_NAME is set).
SMOKE = dict(
    DATASET=str(FIXTURE),
    OUTPUT_DIR="outputs/smoke",
    MAX_COMPLETION_LENGTH=32,
    PER_DEVICE_TRAIN_BATCH_SIZE=4,
    GRADIENT_ACCUMULATION_STEPS=1,
    MAX_STEPS=4,
    SAVE_STEPS=2,
    TEMPERATURE=1.0,
    LEARNING_RATE=1e-3,
    BF16=False,
    ACTIVATION_CHECKPOINTING=False,
)

# `grpotrainer.py --demo`: these settings over the constants, then the command line's. DATASET and MODEL_NAME are
# replaced by the generated task and warm-started model in OUTPUT_DIR (see `prepare`) unless given.
DEMO = dict(
    DATASET="outputs/demo/demo-data-seed0",
    OUTPUT_DIR="outputs/demo",
    SEED=0,
    # shorter than the default prompt (a third of the tokens of a problem), asking for the same format
    SYSTEM_PROMPT="Write the final answer on its own last line as '#### <number>'.",
    LORA_DROPOUT=0.0,
    MAX_COMPLETION_LENGTH=32,  # answers are ~15 tokens
    NUM_GENERATIONS=8,
    LEARNING_RATE=5e-4,  # 1e-3 teaches the format faster but moves a few sums by one
    PER_DEVICE_TRAIN_BATCH_SIZE=64,  # 8 problems x 8 completions per step
    GRADIENT_ACCUMULATION_STEPS=1,
    MAX_STEPS=50,
    SAVE_STEPS=50,
    EVAL_BEFORE=256,  # the whole test split, before and after
    EVAL_AFTER=256,
    EVAL_BATCH_SIZE=128,
    BF16=False,
    ACTIVATION_CHECKPOINTING=False,
)

# ---------------------------------------------------------------------------------------------------------------
# the smoke model

# Qwen's ChatML markers. Qwen3 ends an assistant turn with <|im_end|>; <|endoftext|> is its pad token.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

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


def training_text():
    """Text the tokenizer is trained on: the fixture's questions and solutions, and the prompt words."""
    yield gsm8k.SYSTEM_PROMPT  # the system prompt's words should tokenise compactly too
    with open(FIXTURE, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            yield row["question"]
            yield row["answer"]


def build_tokenizer(texts=None, split_digits=False):
    """A byte-level BPE tokenizer trained in a fraction of a second on `texts` (default: the smoke fixture's,
    `training_text`), wrapped as a transformers tokenizer with Qwen's ChatML special tokens, <|im_end|> as EOS and
    <|endoftext|> as pad. `split_digits`: one digit per token, as Qwen's tokenizer splits numbers (the demo's
    arithmetic needs it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(training_text() if texts is None else texts, trainer=trainer)
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
    """For the CPU profiles: one torch thread unless OMP_NUM_THREADS says otherwise (the tiny model runs fastest on
    one, and more thrash a shared machine), and the tiny model folder OUTPUT_DIR/smoke-model, built if missing."""
    hardware.one_cpu_thread()
    return ensure_model_dir(Path(output_dir) / "smoke-model")


def ensure_model_dir(path):
    """Build the tiny model folder at `path` unless it is already there; return the path as a string."""
    path = Path(path)
    if not (path / "config.json").exists():
        tokenizer = build_tokenizer()
        model = build_model(tokenizer)
        with publish_dir(path) as tmp:  # never a half folder; another rank's finished one is kept
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# the demo: its task and warm-started model

# The task: sizes, numbers and the share of warm-start targets in the asked '#### N' style.
TRAIN_PROBLEMS = 4000
TEST_PROBLEMS = 256
MAX_NUMBER = 10  # operands from 1 to this: small enough for a 0.6M-parameter model to learn in minutes
HASH_SHARE = 0.45  # warm-start targets ending '#### N'; the rest end "The answer is N.", which greedy then prefers

NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eva", "Ben", "Lily", "Jack"]
PRONOUNS = {"Mia": "She", "Ava": "She", "Zoe": "She", "Ivy": "She", "Eva": "She", "Lily": "She"}
ITEMS = ["apples", "shells", "stickers", "marbles", "pencils", "cards", "coins", "books", "cookies", "stamps"]
# (question template, operator): a + b or a - b, written in words as GSM8K's easiest problems are.
TEMPLATES = [
    ("{n} has {a} {item}. {p} buys {b} more. How many {item} does {n} have now?", "+"),
    ("{n} has {a} {item} and {f} has {b} {item}. How many {item} do they have together?", "+"),
    ("{n} had {a} {item}. {f} gave {o} {b} more. How many {item} does {n} have now?", "+"),
    ("{n} has {a} {item}. {p} gives {b} to {f}. How many {item} does {n} have left?", "-"),
    ("{n} had {a} {item} and lost {b} of them. How many {item} does {n} have now?", "-"),
    ("{n} baked {a} {item} and {f} ate {b} of them. How many {item} are left?", "-"),
]

# A 0.64M-parameter Qwen3, the size issue 9's prototype used (not tuned further).
DEMO_QWEN3 = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    initializer_range=0.02,  # Qwen's own; the smoke model's 0.2 is for LoRA on random weights
)
# The supervised warm start (TRL SFTTrainer, full fine-tuning).
SFT_STEPS = 400  # the arithmetic appears after ~250 steps; the rest gives it margin, so LoRA does not disturb it
SFT_BATCH_SIZE = 64
SFT_LEARNING_RATE = 4e-3


def make_task(seed, train=TRAIN_PROBLEMS, test=TEST_PROBLEMS):
    """Word problems in GSM8K's format, generated from `seed`: (train_rows, test_rows), each row a dict with
    question and answer ("7 + 5 = 12\\n#### 12"). No question is in both splits."""
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < train + test:
        template, op = rng.choice(TEMPLATES)
        name, friend = rng.sample(NAMES, 2)
        a, b = rng.randint(1, MAX_NUMBER), rng.randint(1, MAX_NUMBER)
        if op == "-":  # a positive difference: the larger first, a tie moved up by one
            a, b = max(a, b) + (a == b), min(a, b)
        pronoun = PRONOUNS.get(name, "He")
        fields = dict(n=name, f=friend, p=pronoun, o="her" if pronoun == "She" else "him", item=rng.choice(ITEMS))
        question = template.format(a=a, b=b, **fields)
        if question in seen:
            continue
        seen.add(question)
        result = a + b if op == "+" else a - b
        rows.append({"question": question, "answer": f"{a} {op} {b} = {result}\n#### {result}"})
    return rows[:train], rows[train:]


def write_task(folder, seed):
    """Write make_task(seed) as folder/{train,test}.jsonl (aside, then renamed: never half a folder); return it."""
    folder = Path(folder)
    if not (folder / "test.jsonl").is_file():
        with publish_dir(folder) as tmp:
            for split, rows in zip(("train", "test"), make_task(seed), strict=True):
                with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(folder)


def restyle(answer, rng, hash_share=HASH_SHARE):
    """A gold solution in one of the two answer styles the warm start mixes.

    >>> restyle("7 + 5 = 12\\n#### 12", random.Random(0), hash_share=0.0)
    '7 + 5 = 12\\nThe answer is 12.'
    """
    work, _, result = answer.rpartition("\n#### ")
    return answer if rng.random() < hash_share else f"{work}\nThe answer is {result}."


def warm_start(folder, rows, seed, system_prompt=gsm8k.SYSTEM_PROMPT, steps=SFT_STEPS):
    """Train a tiny Qwen3 on `rows` (the train split, answers restyled) with SFTTrainer and save it to `folder`."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    rng = random.Random(seed)
    targets = [restyle(r["answer"], rng) for r in rows]
    # the chat roles' words and the system prompt in every text, so that BPE merges them into few tokens
    tokenizer = build_tokenizer(
        (
            f"system\n{system_prompt}\nuser\n{r['question']}\nassistant\n{t}"
            for r, t in zip(rows, targets, strict=True)
        ),
        split_digits=True,
    )
    model = build_model(tokenizer, seed=seed, **DEMO_QWEN3)

    def prompt(question):  # rendered exactly as GRPO and the evaluation render it
        messages = gsm8k.make_prompt(question, system_prompt)
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )

    data = datasets.Dataset.from_dict({"prompt": [prompt(r["question"]) for r in rows], "completion": targets})
    work = Path(folder).with_name(Path(folder).name + f".sft{os.getpid()}")
    config = SFTConfig(
        output_dir=str(work),
        max_steps=steps,
        per_device_train_batch_size=SFT_BATCH_SIZE,
        learning_rate=SFT_LEARNING_RATE,
        lr_scheduler_type="cosine",
        warmup_steps=round(0.05 * steps),
        weight_decay=0.0,
        seed=seed,
        logging_steps=25,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    model = trainer.model.eval()
    model.generation_config.do_sample = False
    with publish_dir(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(work, ignore_errors=True)
    return str(folder)


def prepare(s, given):
    """The settings with DATASET and MODEL_NAME pointing at the demo's task and warm-started model in OUTPUT_DIR,
    each built once per SEED and reused by later runs there, unless given on the command line; one torch thread.
    The model folder is keyed by SEED only: after changing SYSTEM_PROMPT or this module, use a new OUTPUT_DIR."""
    hardware.one_cpu_thread()  # the warm start, too
    s = dict(s)
    out, seed = Path(s["OUTPUT_DIR"]), s["SEED"]
    if "DATASET" not in given:
        s["DATASET"] = write_task(out / f"demo-data-seed{seed}", seed)
    if "MODEL_NAME" not in given:
        model_dir = out / f"demo-model-seed{seed}"
        if not (model_dir / "config.json").is_file():
            log.info("warm-starting the demo model in %s: %d supervised steps (a few minutes)", model_dir, SFT_STEPS)
            train, _ = make_task(seed)
            warm_start(model_dir, train, seed, s["SYSTEM_PROMPT"])
        s["MODEL_NAME"] = str(model_dir)
    return s


if __name__ == "__main__":
    what, *args = sys.argv[1:] or ["smoke-model"]
    if what == "smoke-model":
        print(ensure_model_dir(args[0] if args else "outputs/smoke-model"))
    elif what == "demo-task":
        print(write_task(args[0] if args else "outputs/demo-task", int(args[1]) if len(args) > 1 else 0))
    else:
        sys.exit("usage: python -m grpo.profiles smoke-model [DIR] | demo-task [DIR] [SEED]")
