"""`python grpotrainer.py --real`: a real pretrained chat model learning through GRPO on the CPU (docs/real-model.md):
SmolLM2-135M-Instruct (`make real-model` builds its folder) on word problems in GSM8K's format that it partly solves,
one or two steps of arithmetic on small numbers generated from the seed.

    make real-model && make real-demo ARGS="--SEED=1 --OUTPUT_DIR=outputs/real-s1"   # ~30 min on 2 idle cores
    python -m demo.real outputs/real-task 0      # write the task's {train,test}.jsonl for a seed
"""

import functools
import random
import sys
from pathlib import Path

from demo import smoke, sums
from grpo import hardware

TRAIN_PROBLEMS = 2000  # the run reads 25 steps x 4 = 100 of them; the rest keep later, longer runs fresh
TEST_PROBLEMS = 256  # held out, scored before and after
MODEL = "outputs/real-model/SmolLM2-135M-Instruct"  # where bench/real_model.py (make real-model) puts it

# Each kind of problem: (question template, its solution's steps "xOy": x O y with r the step before's result, the
# operands' range). Small numbers: with operands up to 40 the model solved 2 of 24 (docs/real-model.md).
KINDS = [
    ("{n} has {a} {item}. {p} buys {b} more. How many {item} does {n} have now?", ["a+b"], (1, 10)),
    ("{n} has {a} {item} and gives {b} of them to {f}. How many {item} does {n} have left?", ["a-b"], (1, 10)),
    ("{n} buys {a} bags with {b} {item} in each bag. How many {item} does {n} buy?", ["a*b"], (2, 5)),
    (
        "{n} has {a} {item}. {p} buys {b} more, then gives {c} to {f}. How many {item} does {n} have now?",
        ["a+b", "r-c"],
        (1, 9),
    ),
    (
        "{n} buys {a} boxes of {b} {item} and {c} loose {item}. How many {item} does {n} buy in all?",
        ["a*b", "r+c"],
        (2, 5),
    ),
]
OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}

# `--real`: these settings over the constants, then the command line's (docs/real-model.md says why each was chosen,
# before the seeds were run); `prepare` writes the task after preflight (which refuses unwritten paths), sets bf16.
SETTINGS = dict(
    MODEL_NAME=MODEL,
    OUTPUT_DIR="outputs/real",
    SEED=0,
    # SYSTEM_PROMPT: the default; shorter ones with an example were copied ("End with '#### N'" gave "#### N")
    MAX_COMPLETION_LENGTH=64,  # a right answer takes 15-40 tokens; the base model's rambles are cut
    NUM_GENERATIONS=8,
    # 4 problems x 8 completions per step in one generation call; the loss in micro-batches of 8 (fp32 activations)
    PER_DEVICE_TRAIN_BATCH_SIZE=8,
    GRADIENT_ACCUMULATION_STEPS=4,
    LEARNING_RATE=2e-4,  # LoRA r16 on a 135M model: 1e-4 moved it too little in 4 steps (docs/real-model.md)
    MAX_STEPS=25,
    SAVE_STEPS=25,
    WARMUP_STEPS=0,
    BETA=0.0,  # no reference pass (TRL skips the reference model at 0)
    EVAL_BEFORE=TEST_PROBLEMS,
    EVAL_AFTER=TEST_PROBLEMS,
    EVAL_SAMPLES=1,  # one sampled answer per problem at TEMPERATURE: its flips give sampled accuracy a paired test
    EVAL_BATCH_SIZE=64,
    EVAL_STEPS=0,
    EVAL_SUBSET=64,
    **smoke.CPU_SETTINGS,
)
FIXED = ()


def solve(kind, numbers):
    """(the worked solution ending in '#### N', N) of problem `kind` on `numbers` {"a": .., "b": .., "c": ..}."""
    lines, result = [], None
    for left, op, right in KINDS[kind][1]:  # "a+b": a, +, b
        x = result if left == "r" else numbers[left]
        y = numbers[right]
        result = OPS[op](x, y)
        lines.append(f"{x} {op} {y} = {result}")
    return "\n".join(lines) + f"\n#### {result}", result


def make_problems(seed, n=TRAIN_PROBLEMS + TEST_PROBLEMS):
    """`n` distinct problems from `seed`: dicts with question, kind, numbers and value (the answer); every answer is
    a whole number above 0 (a difference never goes negative)."""
    rng = random.Random(seed)
    rows = {}  # by question: no problem twice
    while len(rows) < n:
        kind = rng.randrange(len(KINDS))
        template, steps, (low, high) = KINDS[kind]
        numbers = {k: rng.randint(low, high) for k in "abc"}
        if steps[0][1] == "-":  # take away fewer than there are
            numbers["a"], numbers["b"] = max(numbers["a"], numbers["b"]) + 1, min(numbers["a"], numbers["b"])
        if len(steps) > 1 and steps[1][1] == "-":
            numbers["c"] = rng.randint(1, numbers["a"] + numbers["b"] - 1)
        name, friend = rng.sample(sums.NAMES, 2)
        pronoun = sums.PRONOUNS.get(name, "He")
        question = template.format(n=name, f=friend, p=pronoun, item=rng.choice(sums.ITEMS), **numbers)
        value = solve(kind, numbers)[1]
        rows.setdefault(question, {"question": question, "kind": kind, "numbers": numbers, "value": value})
    return list(rows.values())


def make_task(seed):
    """(train_rows, test_rows) in GSM8K's format, the worked solution as gold; no question in both splits."""
    rows = [{"question": p["question"], "answer": solve(p["kind"], p["numbers"])[0]} for p in make_problems(seed)]
    return rows[:TRAIN_PROBLEMS], rows[TRAIN_PROBLEMS:]


write_task = functools.partial(sums.write_task, make=make_task)  # (folder, seed): the task's files, unless there


def prepare(s, given):
    """The settings with DATASET (unless given) at the task for SEED in OUTPUT_DIR, written once (milliseconds),
    and BF16 (unless given) on where this CPU computes in bf16."""
    s = dict(s)
    if "DATASET" not in given:
        s["DATASET"] = write_task(Path(s["OUTPUT_DIR"]) / f"real-task-seed{s['SEED']}", s["SEED"])
    if "BF16" not in given:
        s["BF16"] = hardware.cpu_bf16()
    return s


def build(s):
    """Nothing to build: `make real-model` writes the model's folder."""


def finish(output_dir):
    """No last line of its own."""


if __name__ == "__main__":
    folder, seed = (sys.argv[1:] + ["outputs/real-task", "0"])[:2]
    print(write_task(folder, int(seed)))
