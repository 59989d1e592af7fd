"""Tests for rewards.py: answer extraction, the reward functions, the REWARDS registry contract, safety and speed.

Run:
    python -m pytest tests/test_rewards.py -q
Every example is written for these tests, except those marked gsm8k, which read the real data.
"""

import builtins
import json
import math
import pickle
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_grading import PADDED, STOPPED

import rewards
from grpo import grading, reward_guard
from grpo.grading import answers_match, completion_to_text, extract_answer, extract_hash_answer
from rewards import (
    REWARDS,
    correctness_reward,
    format_reward,
    math_reward,
    overlong_reward,
    reasoning_reward,
)

MB = 1_000_000


def chat(text):
    return [{"role": "assistant", "content": text}]


def make_reward(entry, max_completion_length=64, enable_thinking=False):
    """A registry entry ready to call, with the run's settings bound as the loader binds them."""
    return reward_guard.bind(entry, max_completion_length=max_completion_length, enable_thinking=enable_thinking)


@pytest.mark.parametrize(
    "text, expected",
    [
        # GSM8K's own format, as the prompt asks for it
        ("Tom buys 3 packs of 6 pens: 3 * 6 = <<3*6=18>>18 pens.\n#### 18", "18"),
        ("#### 1,080", "1080"),
        ("#### -7", "-7"),
        ("#### 18.00", "18"),
        ("#### $1,250.50", "1250.5"),
        ("#### 18 pens", "18"),
        ("####18", "18"),
        ("####\n18", "18"),  # the number on the line after a bare ####
        ("#### \u22127", "-7"),  # U+2212 MINUS SIGN
        ("#### 18\nI hope this helps!", "18"),
        ("#### 17\n#### 18", "18"),  # the last one wins
        # Qwen-style \boxed{}
        (r"So the total is $\boxed{18}$.", "18"),
        (r"Therefore, Tom has \(\boxed{18}\) pens left.", "18"),
        (r"\[\boxed{1{,}080}\]", "1080"),
        (r"\boxed{1\,080}", "1080"),
        (r"\boxed{\$18.00}", "18"),
        (r"\boxed{18 \text{ pens}}", "18"),
        (r"\boxed{25\%}", "25"),
        (r"\boxed{x = 18}", "18"),
        (r"\boxed{3 \times 6 = 18}", "18"),  # an equation states its result
        (r"\boxed{\frac{3}{4}}", "0.75"),
        (r"\boxed{2\frac{1}{2}}", "2.5"),  # a mixed number
        (r"\boxed{\boxed{18}}", "18"),
        (r"\boxed 18", "18"),  # valid LaTeX without braces
        (r"First \boxed{17}, no wait: \boxed{18}", "18"),
        (r"\boxed{} and then 18", "18"),  # an empty box is not an answer: fall back to the last number
        # Llama-style answer phrases
        ("## Step 2: Add them\n3 + 15 = 18\n\nThe final answer is: $\\boxed{18}$", "18"),
        ("Final Answer: The final answer is 18. I hope it is correct.", "18"),
        ("So the answer is 18 pens, and 2 are left over.", "18"),  # the number right after the phrase
        ("The answer is: 1,080", "1080"),
        ("The answer is -3 degrees.", "-3"),
        ("The answer to this question is 18.", "18"),
        ("The answer is 2.5 million.", "2500000"),
        ("The answer is 25%.", "25"),
        ("The answer isn't 17; Tom has 18.", "18"),  # "isn't" is no answer phrase: the last number
        # GPT-style markdown
        ("**Answer:** 18", "18"),
        ("ANSWER: 18", "18"),
        ("Answer (in dollars): 18", "18"),
        ("### Final Answer\nTom has **\\$18** left.", "18"),  # a heading: the answer is on the next line
        ("**Final Answer**\n\n$$\n18\n$$", "18"),
        ("So, Tom earns **$18** per day.", "18"),
        ("Let me check my answer: 3 * 6 = 18. Yes.", "18"),
        ("#### Step 1: Count\n3 + 4 = 7\n#### Step 2: Double\n7 * 2 = 14 pens", "14"),  # headings, not answers
        ("#### 1. Count the pens\nThere are 14.", "14"),  # a numbered heading, not an answer
        ("##### 5\nso 18", "18"),  # five hashes make a heading
        # few-shot and XML formats
        ("A: 18", "18"),
        ("Q: How many?\nA: Tom buys 3 * 6 = 18 pens.\nHe gives away 4, so 18 - 4 = 14.", "14"),  # A: starts working
        ("<reasoning>\n3 * 6 = 18\n</reasoning>\n<answer>\n18\n</answer>", "18"),
        ("<answer>18</answer>", "18"),
        # thinking blocks
        ("<think>Maybe 17? No: 3 * 6 = 18.</think>The answer is 18.", "18"),
        ("<think>3 * 6 = 18</think>\n\nTom has 18 pens.", "18"),
        ("<think>The answer is 17</think>\n\nTom has 18 pens.", "18"),  # the phrase inside the block is skipped
        ("<think>It is 18</think>", "18"),  # nothing follows the block: the block is all there is
        ("<think>It is 18</think>\n  \n", "18"),  # whitespace is not text
        ("<think>unfinished, 17 so far", None),  # thinking that never closed has no final answer
        # the last number
        ("Tom has 18.", "18"),
        ("costs $.50", "0.5"),
        ("0.50", "0.5"),
        ("-0", "0"),
        ("16-3 = 13", "13"),  # the minus of 16-3 is no sign
        ("007", "7"),
        ("18 " + "word " * 10_000, "18"),  # far back, read in widening windows
        # no answer
        ("", None),
        ("no numbers here", None),
        ("1" * 1000, None),  # longer than MAX_NUMBER_CHARS: not an answer
        # expressions are never evaluated
        ("#### 9*2", None),
        ("#### 9**2", None),
        ("#### 9 x 2", None),
        (r"\boxed{9 \times 2}", None),
        (r"\boxed{\frac{1}{3}}", None),  # no finite decimal
        ("The answer is 20 - 2", None),
        ("#### 9*2 = 18", "18"),  # the stated result, not an evaluation
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A third of 36 is 12.\n#### 12", "12"),
        ("#### 1,080", "1080"),
        ("#### -3", "-3"),
        ("The answer is 24.", None),  # no ####
        (r"\boxed{24}", None),
        ("#### Final answer\nThe answer is 24.", None),  # a heading
        ("#### 9*2", None),
        ("#### 24\n<think>x</think>", "24"),  # nothing follows the block, so the whole text is read
        ("<think>#### 23</think>The answer is 24", None),
    ],
)
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("18", "18", True),
        ("18", "18.00", True),
        ("1080", "1,080", True),
        ("$18", "18", True),
        ("-3", "-3.0", True),
        ("0.1", "0.10000000000000000000000000001", False),  # exact decimals: floats would call these equal
        ("18.5", "18", False),
        ("18", "-18", False),
        (None, "18", False),
        ("18", None, False),
        (None, None, False),
        ("NaN", "NaN", False),  # not finite
        ("Infinity", "Infinity", False),
        ("abc", "abc", False),
        ("9*2", "18", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("plain", "plain"),
        (chat("#### 18"), "#### 18"),
        ([{"content": "no role"}], "no role"),  # TRL's own rewards read message [0] whatever its role
        (
            [
                {"role": "assistant", "content": "a"},
                {"role": "tool", "content": "b"},
                {"role": "assistant", "content": "c"},
            ],
            "a\nc",
        ),
        ([{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}], "x"),
        ({"role": "assistant", "content": "one message"}, "one message"),
        (b"\xff18", "\ufffd18"),  # invalid UTF-8 becomes U+FFFD
        (None, ""),
        (42, ""),
        ([{"role": "assistant", "content": None}], ""),
    ],
)
def test_completion_to_text(completion, expected):
    assert completion_to_text(completion) == expected


def test_correctness_reward_values():
    completions = ["3 * 6 = 18\n#### 18", "The answer is $18.00.", r"\boxed{18.5}", "#### 17", ""]
    assert correctness_reward(completions, answer=["18"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_correctness_reward_no_credit_cut_off_padded_or_unclosed():
    ids = [[1, 2], [1, 2, 3, 4]]  # token ids: the second used all 4 allowed, so it was cut off
    texts = ["#### 18\n#### 18", "#### 18"]  # the first repeats its answer
    assert correctness_reward(texts, answer=["18"] * 2, completion_ids=ids, max_completion_length=4) == [0.0, 0.0]
    # thinking on and never closed: no answer; no gold: None
    out = correctness_reward(["<think>So it is 18.", "#### 18"], answer=["18", None], enable_thinking=True)
    assert out == [0.0, None]


@pytest.mark.parametrize(
    "gold",
    [
        "1080",
        "1,080",
        "Tom counts 1,000 + 80 = <<1000+80=1080>>1080 pens.\n#### 1,080",
        1080,
        1080.0,
        Decimal("1080.00"),
    ],
)
def test_correctness_reward_gold_forms(gold):
    # the gold goes through the same extraction, so a GSM8K solution and a bare number are the same gold
    assert correctness_reward(["#### 1080", chat("#### 1080")], answer=[gold, gold]) == [1.0, 1.0]


def test_gold_value_reads_numpy_scalars():
    # a gold column read through numpy (pandas, a dataset in numpy format) holds numpy scalars, not ints and floats;
    # a float32 reads as its shortest form (0.1, not 0.100000001...), NaN is no gold
    np = pytest.importorskip("numpy")
    golds = [np.int64(18), np.float64(18.0), np.float32(0.1), np.int8(-3), np.uint64(2**63), np.float64("nan")]
    assert [grading.gold_value(gold) for gold in golds] == ["18", "18", "0.1", "-3", str(2**63), None]
    assert grading.gold_value(np.bool_(True)) is None  # like a bool: no number
    assert correctness_reward(["#### 18", "#### 18"], answer=[np.int64(18), np.float64(18.0)]) == [1.0, 1.0]


@pytest.mark.parametrize("answer", [None, [None, None], [], ["no number", "no number"], [True, True]])
def test_correctness_reward_missing_gold(answer):
    # a gold that is missing or unreadable gives None, which TRL skips (NaN, left out of the group's mean)
    assert correctness_reward(["#### 18", "#### 18"], answer=answer) == [None, None]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"solution": ["18", "17"]}, [1.0, 0.0]),  # TRL's and open-r1's column name
        ({"answer": ["18", "17"], "solution": ["17", "18"]}, [1.0, 0.0]),  # answer wins when both are there
        ({"answer": ["18", None], "solution": ["18", "18"]}, [1.0, None]),
    ],
)
def test_correctness_reward_reads_solution(kwargs, expected):
    assert correctness_reward(["#### 18", "#### 18"], **kwargs) == expected


def test_correctness_reward_logs_extracted_and_gold():
    # TRL's log_extra adds columns to the completions table: what was read, and the gold it was compared with
    logged = []
    completions = ["#### 1,080", "The answer is 17.", "no answer", "#### 5"]
    out = correctness_reward(completions, answer=["1080", "18", "18", None], log_extra=lambda *a: logged.append(a))
    assert out == [1.0, 0.0, 0.0, None]
    assert logged == [("extracted", ["1080", "17", None, "5"]), ("gold", ["1080", "18", "18", None])]


@pytest.mark.parametrize("name", list(REWARDS))
def test_only_correctness_logs_columns(name):
    # two rewards logging the same column would give it twice as many values as rows
    logged = []
    make_reward(REWARDS[name])(completions=["#### 18"], answer=["18"], log_extra=lambda *a: logged.append(a[0]))
    assert logged == (["extracted", "gold"] if name == "correctness_reward" else [])


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("3 + 15 = 18\n#### 18", 1.0),
        ("#### 18", 1.0),
        ("#### 1,080\n\n", 1.0),  # trailing blank lines do not count
        ("#### -3.5", 1.0),
        ("#### $18", 0.5),  # decorated
        ("#### 18 pens", 0.5),
        ("#### 18\nDone!", 0.5),  # not last
        ("#### 18\n#### 18", 0.0),  # the last line is right, but it repeats the answer: grading.pads_answer
        ("#### 18.", 0.5),
        ("The answer is 18.", 0.0),
        (r"\boxed{18}", 0.0),
        ("#### Step 2", 0.0),  # a heading
        ("#### 9*2", 0.0),
        ("<think>#### 18</think>The answer is 18", 0.0),  # the #### is inside the thinking
        ("", 0.0),
    ],
)
def test_format_reward(completion, expected):
    assert format_reward([completion]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("He sells 20 - 5 - 3 = 12 pens.", 1.0),
        ("(3 + 4) x 2 = 14", 1.0),
        (r"$12 \times 2 = 24$", 1.0),
        ("36/3 = <<36/3=12>>12", 1.0),
        ("2 - .5 = 1.5", 1.0),
        ("3 * $4 = $12", 1.0),
        ("A third of them, 36 / 3, are blue.", 0.5),  # arithmetic without its result
        ("3 + 4 makes a week, and x = 7", 0.5),  # the = is not the result of the operation
        ("#### 24", 0.0),
        ("The answer is 24.", 0.0),
        ("x = 24", 0.0),  # an equation, but no arithmetic
        ("", 0.0),
    ],
)
def test_reasoning_reward(completion, expected):
    assert reasoning_reward([completion]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("36 / 3 = 12\n#### 12", 1.0),  # 0.2 #### + 0.2 arithmetic + 0.2 readable + 0.4 correct
        ("36 / 3 = 12\n#### 13", 0.6),  # wrong: no 0.4
        ("#### 12", 0.8),  # no arithmetic shown
        ("36 / 3 = 12, so the answer is 12.", 0.8),  # no ####
        ("The answer is 12.", 0.6),
        ("36 / 3", 0.4),  # 0.2 arithmetic + 0.2 readable (the last number, 3, which is wrong)
        ("no answer", 0.0),
    ],
)
def test_math_reward(completion, expected):
    assert math_reward([completion], answer=["12"]) == [expected]


def test_math_reward_missing_gold_is_none():
    # the combined reward needs the gold, so without it the item is skipped, as TRL does with None
    assert math_reward(["36 / 3 = 12\n#### 12"], answer=[None]) == [None]


def soft_overlong(length, max_len, cache):
    """DAPO Eq. 13, written out independently of TRL."""
    if length <= max_len - cache:
        return 0.0
    return (max_len - cache - length) / cache if length <= max_len else -1.0


@pytest.mark.parametrize("max_len", [100, 7, 4])
def test_overlong_reward_matches_dapo(max_len):
    cache = max_len // 4
    lengths = [0, 1, max_len - cache - 1, max_len - cache, max_len - cache + 1, max_len - 1, max_len, max_len + 1]
    lengths = [n for n in lengths if n >= 0]
    out = overlong_reward(
        ["x"] * len(lengths), completion_ids=[[7] * n for n in lengths], max_completion_length=max_len
    )
    assert out == pytest.approx([soft_overlong(n, max_len, cache) for n in lengths])
    assert overlong_reward(["a", "b"], max_completion_length=max_len) == [0.0, 0.0]  # no token ids, no penalty


COMPLETIONS = ["3 * 6 = 18\n#### 18", r"So $\boxed{17}$.", "The answer is 18.", "", "#### 9*2", "<think>18</think>x"]


GOLDS = ["18", "18", "1,080", None, "18", "18"]


TRL_KWARGS = {
    "prompts": ["q"] * len(COMPLETIONS),
    "completion_ids": [[1] * n for n in (10, 50, 60, 0, 64, 99)],
    "trainer_state": object(),
    "log_extra": lambda *a: None,
    "log_metric": lambda *a: None,
    "question": ["q"] * len(COMPLETIONS),
}


RANGES = {"overlong_reward": (-1.0, 0.0)}


NEEDS_GOLD = {"correctness_reward", "math_reward"}  # these return None where the gold is missing


def in_range(name, reward, gold):
    """Whether one reward value keeps the contract: None exactly where a gold-dependent reward has no gold."""
    if name in NEEDS_GOLD and gold is None:
        return reward is None
    low, high = RANGES.get(name, (0.0, 1.0))
    return type(reward) is float and low <= reward <= high


def test_registry_names():
    assert list(REWARDS) == [
        "correctness_reward",
        "format_reward",
        "reasoning_reward",
        "math_reward",
        "overlong_reward",
    ]


@pytest.mark.parametrize("name", list(REWARDS))
def test_registry_contract(name):
    reward = make_reward(REWARDS[name])
    assert reward.__name__ == name  # TensorBoard tag train/rewards/<name>/mean
    plain = reward(completions=COMPLETIONS, answer=GOLDS, **TRL_KWARGS)
    chats = reward(completions=[chat(c) for c in COMPLETIONS], answer=GOLDS, **TRL_KWARGS)
    assert len(plain) == len(COMPLETIONS)
    assert all(in_range(name, r, gold) for r, gold in zip(plain, GOLDS, strict=True))
    assert plain == chats
    assert reward(completions=COMPLETIONS, solution=GOLDS, **TRL_KWARGS) == plain  # the gold as `solution`
    assert reward(completions=COMPLETIONS, answer=GOLDS, unknown_column=[1] * 6, **TRL_KWARGS) == plain
    assert reward(completions=COMPLETIONS, answer=GOLDS) == reward(completions=COMPLETIONS, answer=GOLDS)
    assert reward(completions=[], answer=[]) == []


@pytest.mark.parametrize("name", list(REWARDS))
def test_registry_pickles(name):
    reward = make_reward(REWARDS[name])
    copy = pickle.loads(pickle.dumps(reward))
    assert copy(completions=COMPLETIONS, answer=GOLDS, **TRL_KWARGS) == reward(
        completions=COMPLETIONS, answer=GOLDS, **TRL_KWARGS
    )
    assert pickle.loads(pickle.dumps(REWARDS[name])) is REWARDS[name]  # functions pickle by reference
    assert repr(copy) == repr(reward)  # the bound settings survive the round trip


@pytest.mark.parametrize("name", list(REWARDS))
def test_registry_no_credit_for_unclosed_thinking(name):
    # thinking mode on and no </think>: no reward pays for an answer inside the thinking
    reward = make_reward(REWARDS[name], max_completion_length=64, enable_thinking=True)
    thinking = ["Okay, 3 * 6 = 18.\n#### 18", "<think>3 * 6 = 18, so the answer is \\boxed{18}"]
    closed = ["Okay, 3 * 6 = 18.\n</think>\n\n3 * 6 = 18\n#### 18"]
    out = reward(completions=thinking + closed, answer=["18"] * 3, completion_ids=[[1] * 10] * 3)
    expected = {
        "correctness_reward": [0.0, 0.0, 1.0],
        "format_reward": [0.0, 0.0, 1.0],
        "reasoning_reward": [1.0, 1.0, 1.0],  # shown working, wherever it is, is shown working
        "math_reward": [0.0, 0.0, 1.0],
        "overlong_reward": [0.0, 0.0, 0.0],
    }
    assert out == expected[name]


CREDIT = [name for name in REWARDS if name != "overlong_reward"]  # the rewards that pay; overlong only punishes


@pytest.mark.parametrize("text", PADDED)
@pytest.mark.parametrize("name", CREDIT)
def test_registry_no_credit_for_padding_past_the_answer(name, text):
    # each shape reads the right answer (5) with working shown: only the text past the answer costs the credit
    reward = make_reward(REWARDS[name])
    assert reward(completions=[text, chat(text)], answer=["5", "5"]) == [0.0, 0.0]


@pytest.mark.parametrize("name", CREDIT)
def test_registry_no_credit_for_a_cut_off_completion(name):
    # as many token ids as the limit: cut off, whatever it wrote; one token fewer and it finished
    reward = make_reward(REWARDS[name], max_completion_length=8)
    texts = ["2 + 3 = 5\n#### 5"] * 2
    out = reward(completions=texts, answer=["5"] * 2, completion_ids=[[1] * 8, [1] * 7])
    assert out[0] == 0.0 and out[1] > 0.0


@pytest.mark.parametrize("name", CREDIT)
def test_registry_logs_the_padded_share(name):
    # TRL's log_metric hook: the share of completions padded past their answer, for train/completions/padded_ratio
    logged = []
    texts = [PADDED[0], STOPPED[0], PADDED[1], "no answer"]
    make_reward(REWARDS[name])(completions=texts, answer=["5"] * 4, log_metric=lambda *a: logged.append(a))
    assert logged == [("completions/padded_ratio", 0.5)]


@pytest.mark.parametrize("text", STOPPED)
def test_correctness_pays_an_answer_that_stops(text):
    assert correctness_reward([text, chat(text)], answer=["5", "5"]) == [1.0, 1.0]


# Issue 37's shapes, gold 18: the answer repeated with the same marker or another (no reward), and an explanation, a
# check with other numbers or a sign-off after `#### 18` (full reward).
REPEATED = [
    "9 * 2 = 18\n#### 18\n#### 18",
    "9 * 2 = 18\n#### 18\n\n#### <answer>18</answer>",
    "9 * 2 = 18\n#### 18 ... The answer is 18.\n#### 18",
]
EXPLAINED = [
    "9 * 2 = 18\n#### 18\n\nCheck: 18 / 6 = 3, as given.",
    "9 * 2 = 18\n#### 18\nThanks for the 2 questions!",
    "9 * 2 = 18\n#### 18\n\nExplanation: she sells 16 - 3 - 4 = 9 eggs at $2 each, so 9 * 2 = 18 dollars.",
]


@pytest.mark.parametrize("name", CREDIT)
@pytest.mark.parametrize("text", REPEATED)
def test_a_repeated_final_answer_earns_nothing(name, text):
    assert make_reward(REWARDS[name])(completions=[text, chat(text)], answer=["18", "18"]) == [0.0, 0.0]


@pytest.mark.parametrize("text", EXPLAINED)
def test_text_after_the_answer_that_repeats_nothing_keeps_its_reward(text):
    # right and shown: full correctness and math reward; format_reward's 0.5 is for a `#### N` that is not last
    assert correctness_reward([text, chat(text)], answer=["18", "18"]) == [1.0, 1.0]
    assert math_reward([text], answer=["18"]) == [1.0]
    assert format_reward([text]) == [0.5]


@pytest.mark.parametrize("name", ["correctness_reward", "format_reward", "math_reward"])
def test_configured_rewards(name):
    # the loader binds the run's settings to the registry's function; unbound it is the same reward
    reward = make_reward(REWARDS[name], max_completion_length=16, enable_thinking=True)
    function = getattr(rewards, name)
    assert reward(["</think>#### 18"], answer=["18"]) == function(["</think>#### 18"], answer=["18"])
    assert reward(["#### 18"], answer=["18"]) != function(["#### 18"], answer=["18"])  # thinking on: no </think>


def test_import_is_light():
    # grpotrainer's preflight imports rewards; it must not pull in torch, transformers or TRL
    heavy = "{'torch', 'transformers', 'trl', 'math_verify', 'sympy'}"
    code = f"import sys, rewards; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_code_in_completions_runs_nothing(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("model output was evaluated")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}')\n#### eval('9*2')"
    completions = [attack, "#### __import__('os')", "```python\nprint(9*2)\n```\n#### 9*2"]
    for name in REWARDS:
        make_reward(REWARDS[name])(completions=completions, answer=["18"] * 3)
    assert not marker.exists()
    assert correctness_reward(completions, answer=["18"] * 3) == [0.0, 0.0, 0.0]  # 9*2 is not 18 unless stated


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", None),
        ("\ufffd\ufffd 18 \ufffd", "18"),  # invalid UTF-8, decoded with errors="replace"
        ("\ud800 18 \x00", "18"),  # a lone surrogate and a NUL byte
        ("7" * MB, None),  # 1 MB of digits is one number, too long to be an answer
        (r"\boxed{18", "18"),  # an unclosed box is not a box: the last number
        ("}}}{{{ 18 }", "18"),
        (r"\boxed{\boxed{\boxed{7}}}", "7"),
        (r"\boxed{" * 1000 + "7" + "}" * 1000, "7"),
        (r"\boxed{\frac{1}{0}}", None),  # a zero denominator reads as an expression, 1/0
        ("#" * 10_000 + " 18", "18"),  # a run of # is a heading, not the marker
    ],
)
def test_hostile_inputs(text, expected):
    assert extract_answer(text) == expected


FRAGMENTS = [
    "####", "#", " ", "\n", "\\boxed{", "\\fbox", "{", "}", "\\frac{1}{3}", "\\frac{", "\\dfrac12", "$", "\\$", ",",
    ".", "-", "\u2212", "18", "1,080", "0", "9", "*", "**", "=", "+", "/", "x", "The answer is ", "Answer:", "A:",
    "### Final Answer\n", "<think>", "</think>", "<answer>", "</answer>", "\ufffd", "\\text{", "%", " million", "é",
    "\\,", "{,}", "~", "\\", "(", ")", "<<", ">>", "\u00a0", "\x00", "\ud800",
]  # fmt: skip


texts = st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))


NORMALISED = r"-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?"


@settings(max_examples=300, deadline=None)
@given(texts)
def test_extract_answer_never_raises_and_normalises(text):
    answer = extract_answer(text)
    assert answer is None or (re.fullmatch(NORMALISED, answer) and answer != "-0")
    assert answer is None or extract_answer(answer) == answer  # normalising is idempotent
    assert extract_hash_answer(text) in (None, answer)  # a #### answer, when there is one, is the answer


@settings(max_examples=150, deadline=None)
@given(st.lists(texts, min_size=1, max_size=4), st.one_of(st.none(), texts))
def test_rewards_never_raise(completions, gold):
    gold_value = grading.extract_answer(gold) if gold is not None else None
    for name in REWARDS:
        for thinking in (False, True):
            reward = make_reward(REWARDS[name], max_completion_length=1, enable_thinking=thinking)
            for form in (completions, [chat(c) for c in completions]):
                ids = [[1]] * len(completions)  # every completion cut off at one token
                out = reward(completions=form, answer=[gold] * len(completions), completion_ids=ids)
                assert len(out) == len(completions) and all(in_range(name, r, gold_value) for r in out)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=-(10**15), max_value=10**15))
def test_a_final_hash_line_wins(prefix, n):
    # whatever comes before it (but an unclosed thinking block, or another #### line), a last line "#### N" is the
    # answer
    assume("<think" not in prefix and "####" not in prefix)
    assert extract_answer(f"{prefix}\n#### {n}") == str(n)
    assert correctness_reward([f"{prefix}\n#### {n:,}"], answer=[str(n)]) == [1.0]


@settings(max_examples=200, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9))
def test_numbers_compare_by_value(value):
    # however a number is written, it grades equal to itself: "18", "18.000", "$18", "1,080"
    assert answers_match(extract_answer(f"The answer is {value:,f}."), format(value, "f"))
    assert answers_match(extract_answer(f"#### ${value:f}"), str(value))


BIG = {
    "digits": "7" * MB,
    "digits and spaces": "1 " * (MB // 2),
    "open boxes": "\\boxed{" * (MB // 7),
    "nested boxes": "\\boxed{" * (MB // 14) + "}" * (MB // 14),
    "braces": "{" * MB,
    "hashes": "#" * MB,
    "heading lines": "#### Step\n" * (MB // 10),
    "answer phrases": "the answer is " * (MB // 14),
    "operators": "1+" * (MB // 2),
    "words with digits": "a1" * (MB // 2),
    "replacement characters": "\ufffd" * MB,
    "a long think": "<think>" + "x" * MB + "</think> 18",
}


def best_ms(func, *args, repeat=3, **kwargs):
    best = math.inf
    for _ in range(repeat):
        start = time.process_time()  # CPU time: the machine's load does not count
        func(*args, **kwargs)
        best = min(best, time.process_time() - start)
    return best * 1000


@pytest.mark.parametrize("name", list(BIG))
def test_one_megabyte_grades_fast(name):
    text = BIG[name]
    assert best_ms(correctness_reward, [text], answer=["18"]) < 50  # the spec's bound for grading
    for reward_name in REWARDS:  # every reward is linear too: a quadratic scan would take seconds here
        assert best_ms(make_reward(REWARDS[reward_name]), [text], answer=["18"], repeat=1) < 250, reward_name


DATA = Path(__file__).resolve().parents[1].parent / "shared/data/gsm8k"


SPLIT_SIZES = {"train": 7473, "test": 1319}


@pytest.fixture(scope="module")
def solutions():
    """The reference solutions of both splits, in file order: train then test."""
    missing = [DATA / f"{split}.jsonl" for split in SPLIT_SIZES if not (DATA / f"{split}.jsonl").is_file()]
    if missing:
        pytest.skip(f"GSM8K data not found: {', '.join(map(str, missing))} (put train.jsonl and test.jsonl there)")
    rows = {split: (DATA / f"{split}.jsonl").read_text().splitlines() for split in SPLIT_SIZES}
    assert {split: len(lines) for split, lines in rows.items()} == SPLIT_SIZES
    return [json.loads(line)["answer"] for lines in rows.values() for line in lines]


@pytest.fixture(scope="module")
def golds(solutions):
    return [extract_answer(solution) for solution in solutions]


@pytest.mark.gsm8k
def test_every_gold_parses(solutions, golds):
    assert len(solutions) == 8792
    unparsed = [solution[-60:] for solution, gold in zip(solutions, golds, strict=True) if gold is None]
    assert unparsed == []
    # the strict GSM8K-format extractor that evaluate.py uses reads the same golds
    assert [extract_hash_answer(solution) for solution in solutions] == golds


@pytest.mark.gsm8k
@pytest.mark.parametrize("form", ["plain", "chat"])
def test_each_solution_scores_one_against_its_own_gold(solutions, form):
    completions = solutions if form == "plain" else [[{"role": "assistant", "content": s}] for s in solutions]
    scores = correctness_reward(completions, answer=solutions)
    failed = [solution[-60:] for solution, score in zip(solutions, scores, strict=True) if score != 1.0]
    assert failed == []


@pytest.mark.gsm8k
def test_each_solution_scores_zero_against_a_different_gold(solutions, golds):
    # pair solution i with the gold of solution i+1 (rotate by one); where the two golds differ by value, 0.0
    rotated = solutions[1:] + solutions[:1]
    scores = correctness_reward(solutions, answer=rotated)
    differ = [not answers_match(a, b) for a, b in zip(golds, golds[1:] + golds[:1], strict=True)]
    assert sum(differ) > 8600  # neighbouring problems rarely share an answer
    wrong = [i for i, (score, d) in enumerate(zip(scores, differ, strict=True)) if d and score != 0.0]
    assert wrong == []


@pytest.mark.gsm8k
def test_each_solution_has_the_asked_format(solutions):
    # every reference ends with a "#### N" line, the format the prompt asks for
    assert set(format_reward(solutions)) == {1.0}


def test_correctness_reward_bound_reads_cut_offs():
    reward = make_reward(correctness_reward, max_completion_length=4)
    texts = ["3 * 6 = 18", "3 * 6 = 18", "3 * 6 = 18\n#### 18"]
    out = reward(completions=texts, answer=["18"] * 3, completion_ids=[[1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4]])
    assert out == [0.0, 1.0, 0.0]  # cut off at 4 tokens earns nothing, a #### answer included; 3 tokens is whole
