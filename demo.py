"""A run that visibly learns on the CPU: `python grpotrainer.py --demo` raises held-out accuracy in minutes.

Real Qwen weights are out of reach offline, so the demo brings its own task and base model, built once in OUTPUT_DIR:

- a synthetic GSM8K-format task generated from SEED (`make_task`): one-step word problems with small numbers
  ("Mia has 7 shells. She buys 5 more. How many shells does Mia have now?"), gold `7 + 5 = 12\\n#### 12`,
  disjoint train and test splits, written as OUTPUT_DIR/demo-data-seed<SEED>/{train,test}.jsonl;
- a tiny Qwen3 (0.6M parameters) warm-started on the train split by a short supervised phase (TRL's SFTTrainer,
  full fine-tuning) whose targets end in one of two answer styles: GSM8K's `#### 12` (45%) or "The answer is 12."
  (55%), saved as OUTPUT_DIR/demo-model-seed<SEED>. Like a real instruct model that writes `\\boxed{}`, it solves
  the problems but answers in a format other than the asked one: greedy decoding picks the style it saw most, so
  strict accuracy starts near 0 while lenient accuracy is at its arithmetic level.

GRPO then trains a LoRA adapter through the same code path as a real run (LoRA, the default rewards: correctness
plus format), and EVAL_BEFORE/EVAL_AFTER score the test split. What rises is the asked format: strict accuracy
climbs to the lenient one. The arithmetic does not improve in 50 steps (sampled accuracy stays within a point);
docs/demo.md has the numbers over 3 seeds.

    python grpotrainer.py --demo                    # ~6 minutes on 2 CPU cores, warm start included
    python demo.py outputs/demo-task 0              # write the task's {train,test}.jsonl for a seed by hand
"""

import json
import logging
import os
import random
import shutil
import sys
from pathlib import Path

import gsm8k
import hardware
import smoke

log = logging.getLogger("grpotrainer.demo")

# `grpotrainer.py --demo`: these settings over the constants, then the command line's. DATASET and MODEL_NAME are
# replaced by the generated task and warm-started model in OUTPUT_DIR (see `prepare`) unless given.
PROFILE = dict(
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
VOCAB_SIZE = 512
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
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for split, rows in zip(("train", "test"), make_task(seed), strict=True):
            with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        _publish(tmp, folder)
    return str(folder)


def _publish(tmp, folder):
    try:
        tmp.rename(folder)
    except OSError:  # another process (a torchrun rank) finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def restyle(answer, rng, hash_share=HASH_SHARE):
    """A gold solution in one of the two answer styles the warm start mixes.

    >>> restyle("7 + 5 = 12\\n#### 12", random.Random(0), hash_share=0.0)
    '7 + 5 = 12\\nThe answer is 12.'
    """
    work, _, result = answer.rpartition("\n#### ")
    return answer if rng.random() < hash_share else f"{work}\nThe answer is {result}."


def build_tokenizer(texts):
    """A byte-level BPE tokenizer trained on `texts` (the rendered prompts and targets, so that the system prompt's
    words become single tokens), digits split one per token as Qwen's are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=smoke.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=smoke.CHAT_TEMPLATE,
        padding_side="left",
    )


def warm_start(folder, rows, seed, system_prompt=gsm8k.SYSTEM_PROMPT, steps=SFT_STEPS):
    """Train a tiny Qwen3 on `rows` (the train split, answers restyled) with SFTTrainer and save it to `folder`."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    rng = random.Random(seed)
    targets = [restyle(r["answer"], rng) for r in rows]
    # the chat roles' words and the system prompt in every text, so that BPE merges them into few tokens
    tokenizer = build_tokenizer(
        f"system\n{system_prompt}\nuser\n{r['question']}\nassistant\n{t}" for r, t in zip(rows, targets, strict=True)
    )
    model = smoke.build_model(tokenizer, seed=seed, **DEMO_QWEN3)

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
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    _publish(work / "model", Path(folder))
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
    args = sys.argv[1:]
    print(write_task(args[0] if args else "outputs/demo-task", int(args[1]) if len(args) > 1 else 0))
