"""Grading speed and agreement: rewards.correctness_reward against TRL's accuracy_reward (math-verify) on GSM8K.

Both graders get the same completions in chat form, as GRPOTrainer passes them, and the same gold numbers (the text
after GSM8K's "####", commas removed, which math-verify can parse). Three sets of completions, all from GSM8K's
reference solutions (train + test, 8,792):
    hash      the solutions as they are, ending in "#### N" (the format our prompt asks for);
    boxed     the same with the last line rewritten as "The answer is $\\boxed{N}$." (the format math-verify reads);
    sentence  the working alone, without "#### N" and the <<calculator>> notes: the answer is only in the last
              sentence, as in a model's prose (our last-number fallback; math-verify needs an anchor, so it reads
              none of them).
For each grader: completions per CPU-second (best of --repeat runs for ours, one run for math-verify, which is slow;
wall-clock rates go to the JSON),
accuracy against the gold (every reference solution is right, so a correct grader scores 100%), and how often the
two graders agree.

Needs math-verify for TRL's reward: pip install math-verify==0.9.0 (in requirements-dev.txt). Takes about two
minutes on 2 CPU cores, nearly all of it math-verify; --limit N grades the first N problems only. Run:
    python bench/bench_rewards.py
    python bench/bench_rewards.py --limit 1000 --json outputs/bench_rewards.json
"""

import argparse
import json
import logging
import os
import platform
import re
import sys
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: rewards.py sits at the repo root

import rewards  # noqa: E402

DATA = REPO.parent / "shared/data/gsm8k"  # GSM8K (MIT), beside the checkout; never copied into it


def load_solutions(data: Path, limit: int) -> list[str]:
    solutions = []
    for split in ("train", "test"):
        path = data / f"{split}.jsonl"
        if not path.is_file():
            sys.exit(f"GSM8K not found: {path}. Put train.jsonl and test.jsonl there, or pass --data DIR.")
        solutions += [json.loads(line)["answer"] for line in path.read_text().splitlines()]
    return solutions[:limit] if limit else solutions


def completion_sets(solutions: list[str]) -> tuple[list[str], dict[str, list]]:
    """The gold numbers, and the completion sets in chat form."""
    golds, hashed, boxed, sentence = [], [], [], []
    for solution in solutions:
        working, _, gold = solution.rpartition("####")
        gold = gold.strip().replace(",", "")
        golds.append(gold)
        hashed.append([{"role": "assistant", "content": solution}])
        boxed.append([{"role": "assistant", "content": f"{working}The answer is $\\boxed{{{gold}}}$."}])
        sentence.append([{"role": "assistant", "content": re.sub(r"<<[^>]*>>", "", working).strip()}])
    return golds, {"hash": hashed, "boxed": boxed, "sentence": sentence}


def timed(func, repeat: int):
    """func()'s result and its best (CPU, wall) seconds over `repeat` runs. Both graders run on one thread, so CPU
    time is what they cost; unlike wall time it stays put when other jobs share the machine."""
    best_cpu, best_wall, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        result = func()
        best_cpu, best_wall = min(best_cpu, time.process_time() - cpu), min(best_wall, time.perf_counter() - wall)
    return result, best_cpu, best_wall


def run(solutions: list[str], repeat: int) -> dict:
    from trl.rewards import accuracy_reward

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeout warnings would drown the table
    golds, sets = completion_sets(solutions)
    results = {}
    for name, completions in sets.items():
        rewards.correctness_reward(completions[:20], answer=golds[:20])  # warm up both (math-verify compiles its
        accuracy_reward(completions[:20], solution=golds[:20])  # LaTeX grammar on first use) before timing
        ours, ours_cpu, ours_wall = timed(lambda c=completions: rewards.correctness_reward(c, answer=golds), repeat)
        trl, trl_cpu, trl_wall = timed(lambda c=completions: accuracy_reward(c, solution=golds), 1)
        trl_right = [r == 1.0 for r in trl]  # None (an unparseable gold) counts as not right
        ours_right = [r == 1.0 for r in ours]
        n = len(completions)
        results[name] = {
            "completions": n,
            "ours": {
                "per_cpu_second": n / ours_cpu,
                "per_wall_second": n / ours_wall,
                "accuracy": sum(ours_right) / n,
            },
            "trl": {
                "per_cpu_second": n / trl_cpu,
                "per_wall_second": n / trl_wall,
                "accuracy": sum(trl_right) / n,
                "gold_unparsed": trl.count(None),
            },
            "agreement": sum(a == b for a, b in zip(ours_right, trl_right, strict=True)) / n,
        }
    return results


def print_table(results: dict, n: int) -> None:
    print(f"GSM8K reference solutions as completions: {n:,} (chat form, gold = the number after ####)")
    print("completions/s: per CPU-second of one core (both graders are single-threaded); accuracy: against the gold")
    print(f"{'completions end':<16} {'grader':<42} {'completions/s':>13} {'accuracy':>9} {'agreement':>10}")
    for name, r in results.items():
        ending = {"hash": '"#### N"', "boxed": '"\\boxed{N}"', "sentence": "a sentence"}[name]
        ours, trl = r["ours"], r["trl"]
        ours_rate = ours["per_cpu_second"]
        print(f"{ending:<16} {'rewards.correctness_reward':<42} {ours_rate:>13,.0f} {ours['accuracy']:>9.2%}")
        print(f"{'':<16} {'trl.rewards.accuracy_reward (math-verify)':<42} {trl['per_cpu_second']:>13,.0f} "
              f"{trl['accuracy']:>9.2%} {r['agreement']:>10.2%}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with GSM8K's train.jsonl and test.jsonl")
    parser.add_argument("--limit", type=int, default=0, help="grade only the first N problems (0: all 8,792)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of our grader; the best time counts")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args()

    solutions = load_solutions(args.data, args.limit)
    results = run(solutions, args.repeat)
    print_table(results, len(solutions))
    env = {
        "python": platform.python_version(),
        "trl": version("trl"),
        "math_verify": version("math-verify"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    print("; ".join(f"{k} {v}" for k, v in env.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "environment": env}, indent=2) + "\n")


if __name__ == "__main__":
    main()
