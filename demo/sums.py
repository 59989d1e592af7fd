"""`python grpotrainer.py --demo`: a run that visibly learns, offline on the CPU (docs/demo.md). GRPO needs a model
that sometimes solves the task, so the demo builds both from the seed, once: three-digit sums in words in GSM8K's
format, and a tiny Qwen3 warm-started on them by TRL's SFTTrainer.

    python -m demo.sums outputs/demo-task 0      # write the task's {train,test}.jsonl for a seed
"""

import json
import logging
import os
import random
import shutil
import sys
from pathlib import Path

from demo.smoke import CPU_SETTINGS, build_model, build_tokenizer
from grpo import generation, gsm8k, hardware
from grpo.files import publish_dir

log = logging.getLogger("grpotrainer.demo")

# The task: three-digit additions in words, each with a worked solution (the columns with their carries).
TRAIN_PROBLEMS = 8000
TEST_PROBLEMS = 256
DIGITS = 3  # both numbers have this many digits: too many for the tiny model to add in one shot, few to work out

NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eva", "Ben", "Lily", "Jack"]
PRONOUNS = {"Mia": "She", "Ava": "She", "Zoe": "She", "Ivy": "She", "Eva": "She", "Lily": "She"}
ITEMS = ["apples", "shells", "stickers", "marbles", "pencils", "cards", "coins", "books", "cookies", "stamps"]
TEMPLATES = [
    "{n} has {a} {item}. {p} buys {b} more. How many {item} does {n} have now?",
    "{n} has {a} {item} and {f} has {b} {item}. How many {item} do they have together?",
    "{n} had {a} {item}. {f} gave {o} {b} more. How many {item} does {n} have now?",
    "{n} collected {a} {item} on Monday and {b} on Tuesday. How many {item} did {n} collect?",
]

# A 0.64M-parameter Qwen3 with a 512-token BPE vocabulary, digits split one per token as Qwen's are.
DEMO_QWEN3 = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    initializer_range=0.02,  # Qwen's own; the smoke model's 0.2 is for LoRA on random weights
)
# The warm start (full fine-tuning) in two phases, every target a correct solution:
WORKED_STEPS = 600  # 1: worked solutions only; the column addition appears after ~400-450 steps (seed 0)
WORKED_LEARNING_RATE = 5e-3  # cosine, 5% warm-up
MIXED_STEPS = 40  # 2: a short tuning on answers mostly given in one shot, as terse instruct data gives them ...
MIXED_LEARNING_RATE = 3e-4  # constant: enough to set the style, too little to erase the working
ONE_SHOT_SHARE = 0.7  # ... this share of its targets are '#### N' alone, the rest worked solutions
SFT_BATCH_SIZE = 32

# `--demo`: these settings over the constants, then the command line's; `prepare` sets the task and model (after
# preflight's checks: a path not yet written would be refused).
SETTINGS = dict(
    OUTPUT_DIR="outputs/demo",
    SEED=0,
    SYSTEM_PROMPT="Solve it. End with '#### N'.",  # short: the prompt is most of a training sequence's tokens
    LORA_DROPOUT=0.0,
    MAX_COMPLETION_LENGTH=48,  # a worked solution is 40 tokens, a one-shot answer 6
    NUM_GENERATIONS=8,
    LEARNING_RATE=5e-4,
    PER_DEVICE_TRAIN_BATCH_SIZE=64,  # 8 problems x 8 completions per step
    GRADIENT_ACCUMULATION_STEPS=1,
    MAX_STEPS=40,
    SAVE_STEPS=40,
    EVAL_BEFORE=256,  # the whole test split, before and after
    EVAL_AFTER=256,
    EVAL_BATCH_SIZE=128,
    EVAL_SAMPLES=4,
    EVAL_STEPS=0,  # off until docs/demo.md's wall times are measured with a held-out curve
    EVAL_SUBSET=64,
    BETA=0.05,  # the values it always ran with, where the GPU defaults (sized for Qwen3-8B) differ
    WARMUP_STEPS=0,
    **CPU_SETTINGS,
)
FIXED = ()  # nothing the advice names is set on purpose


def worked(a, b):
    """The written column addition of a + b, units first, each column 'x+y+carry=two-digit sum', then '#### N'."""
    lines, carry = [f"{a}+{b}"], 0
    for x, y in zip(str(a)[::-1], str(b)[::-1], strict=True):
        total = int(x) + int(y) + carry
        lines.append(f"{x}+{y}+{carry}={total:02d}")  # fixed width: every column the same number of tokens
        carry = total // 10
    return "\n".join(lines) + f"\n#### {a + b}"


def style(completion):
    """'one-shot' for a completion that starts with its '#### N' answer, else 'worked'."""
    return "one-shot" if completion.lstrip().startswith("####") else "worked"


def make_problems(seed, n=TRAIN_PROBLEMS + TEST_PROBLEMS):
    """`n` distinct word problems from `seed`: dicts with question, a and b (the two numbers to add)."""
    rng = random.Random(seed)
    low, high = 10 ** (DIGITS - 1), 10**DIGITS - 1
    rows = {}  # by question: no problem twice
    while len(rows) < n:
        template = rng.choice(TEMPLATES)
        name, friend = rng.sample(NAMES, 2)
        a, b = rng.randint(low, high), rng.randint(low, high)
        pronoun = PRONOUNS.get(name, "He")
        fields = dict(n=name, f=friend, p=pronoun, o="her" if pronoun == "She" else "him", item=rng.choice(ITEMS))
        question = template.format(a=a, b=b, **fields)
        rows.setdefault(question, {"question": question, "a": a, "b": b})
    return list(rows.values())


def make_task(seed):
    """(train_rows, test_rows) in GSM8K's format, the worked solution as gold; no question in both splits."""
    rows = [{"question": r["question"], "answer": worked(r["a"], r["b"])} for r in make_problems(seed)]
    return rows[:TRAIN_PROBLEMS], rows[TRAIN_PROBLEMS:]


def write_task(folder, seed, make=None):
    """Write make_task(seed) (`make`'s, if given) as folder/{train,test}.jsonl, unless there; return the folder."""
    folder = Path(folder)
    if not (folder / "test.jsonl").is_file():
        with publish_dir(folder) as tmp:
            for split, rows in zip(("train", "test"), (make or make_task)(seed), strict=True):
                with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(folder)


def warm_start_targets(seed):
    """The train split's questions and the two phases' targets: (questions, worked_targets, mixed_targets)."""
    problems = make_problems(seed)[:TRAIN_PROBLEMS]
    rng = random.Random(seed + 1)
    worked_targets = [worked(r["a"], r["b"]) for r in problems]
    one_shot = [f"#### {r['a'] + r['b']}" for r in problems]  # the answer alone, as a terse model states it
    mixed = [o if rng.random() < ONE_SHOT_SHARE else w for o, w in zip(one_shot, worked_targets, strict=True)]
    return [r["question"] for r in problems], worked_targets, mixed


def warm_start(folder, seed, system_prompt=gsm8k.DEFAULT_PROMPT):
    """Train a tiny Qwen3 on the train split in the two phases above and save it to `folder`."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    questions, worked_targets, mixed_targets = warm_start_targets(seed)
    # the chat roles' words and the system prompt in every text, so that BPE merges them into few tokens
    pairs = zip(questions, worked_targets, strict=True)
    texts = (f"system\n{system_prompt}\nuser\n{q}\nassistant\n{t}" for q, t in pairs)
    tokenizer = build_tokenizer(texts, split_digits=True)
    model = build_model(tokenizer, seed=seed, **DEMO_QWEN3)
    # rendered exactly as GRPO and the evaluation render them
    prompts = generation.render(tokenizer, [gsm8k.make_prompt(q, system_prompt) for q in questions])
    work = Path(folder).with_name(Path(folder).name + f".sft{os.getpid()}")
    phases = [
        (worked_targets, WORKED_STEPS, WORKED_LEARNING_RATE, "cosine"),
        (mixed_targets, MIXED_STEPS, MIXED_LEARNING_RATE, "constant"),
    ]
    for number, (targets, steps, learning_rate, schedule) in enumerate(phases, 1):
        log.info("warm start, phase %d of 2: %d supervised steps", number, steps)
        config = SFTConfig(
            output_dir=str(work),
            max_steps=steps,
            per_device_train_batch_size=SFT_BATCH_SIZE,
            learning_rate=learning_rate,
            lr_scheduler_type=schedule,
            warmup_steps=round(0.05 * steps) if schedule == "cosine" else 0,
            seed=seed,
            logging_steps=100,
            save_strategy="no",
            use_cpu=True,
            bf16=False,  # SFTConfig's default is bf16
        )
        data = datasets.Dataset.from_dict({"prompt": prompts, "completion": targets})
        trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
        trainer.train()
        model = trainer.model
    model = model.eval()
    model.generation_config.do_sample = False
    with publish_dir(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(work, ignore_errors=True)
    return str(folder)


def prepare(s, given):
    """The settings with DATASET and MODEL_NAME (unless given) at the demo's task and model in OUTPUT_DIR, named
    once per SEED (`build` warm-starts the model): after changing SYSTEM_PROMPT or this module, use a new
    OUTPUT_DIR."""
    hardware.one_cpu_thread()  # the warm start, too
    s = dict(s)
    out, seed = Path(s["OUTPUT_DIR"]), s["SEED"]
    if "DATASET" not in given:
        s["DATASET"] = write_task(out / f"demo-sums-seed{seed}", seed)
    if "MODEL_NAME" not in given:
        s["MODEL_NAME"] = str(out / f"demo-sums-model-seed{seed}")
    return s


def build(s):
    """The demo's warm-started model, when MODEL_NAME is its folder and it is not there yet (a few minutes)."""
    model_dir = Path(s["MODEL_NAME"])
    if model_dir.name == f"demo-sums-model-seed{s['SEED']}" and not (model_dir / "config.json").is_file():
        log.info("warm-starting the demo model in %s (a few minutes; cached for later runs)", model_dir)
        warm_start(model_dir, s["SEED"], s["SYSTEM_PROMPT"])


def style_stats(predictions):
    """The share of worked solutions among `predictions` (evaluation records) and the accuracy of each style."""
    stats = {"worked_share": sum(style(p["completion"]) == "worked" for p in predictions) / len(predictions)}
    for name in ("one-shot", "worked"):
        graded = [p["correct"] for p in predictions if style(p["completion"]) == name]
        stats[f"{name}_accuracy"] = sum(graded) / len(graded) if graded else None
    return stats


def finish(output_dir):
    """The demo's one before -> after line, from OUTPUT_DIR/eval_test_{before,after}.json and their predictions."""
    run = Path(output_dir)
    if not all((run / f"eval_test_{when}.json").is_file() for when in ("before", "after")):
        return "demo: no before -> after line without EVAL_BEFORE and EVAL_AFTER"
    parts = {}
    for when in ("before", "after"):
        metrics = json.loads((run / f"eval_test_{when}.json").read_text(encoding="utf-8"))
        with open(run / f"eval_test_{when}_predictions.jsonl", encoding="utf-8") as f:
            metrics |= style_stats([json.loads(line) for line in f])
        parts[when] = metrics
    keys = ("lenient_accuracy", "sampled_accuracy", "worked_share", "mean_completion_tokens")
    changes = (f"{k} {parts['before'][k]:.3f} -> {parts['after'][k]:.3f}" for k in keys)
    return "demo, before -> after GRPO: " + ", ".join(changes)


if __name__ == "__main__":
    folder, seed = (sys.argv[1:] + ["outputs/demo-task", "0"])[:2]
    print(write_task(folder, int(seed)))
