"""Grading on the kinds of output real models write: one test per failure category found on real GSM8K completions.

The categories (A-F) are those of issue 11: LaTeX thousands grouping, a sentence after "Answer:", a marker followed by
a line break, the last-number fallback, cut-off completions and unclosed thinking, and smaller cases. Every example
is written for these tests in the styles of Qwen, DeepSeek-R1 distills, QwQ, Llama, Mistral and Gemma (no real model
output is stored here). Run:
    python -m pytest tests/test_grading.py -q
"""

import ast

import pytest
from conftest import REPO

from grpo import grading, reward_guard
from grpo.grading import extract_answer, grade
from rewards import REWARDS, correctness_reward

# Four completions whose grades are known by construction, gold "18" throughout unless noted:
CASES = [
    (
        "9 * 2 = 18\n#### 18",
        "18",
        {"extracted": "18", "correct": True, "strict_correct": True, "formatted": True, "padded": False},
    ),
    (
        "So she pays \\boxed{18}.",
        "18",
        {"extracted": "18", "correct": True, "strict_correct": False, "formatted": False, "padded": False},
    ),
    (
        "#### 17",
        "18",
        {"extracted": "17", "correct": False, "strict_correct": False, "formatted": True, "padded": False},
    ),
    (
        "I am not sure.",
        "18",
        {"extracted": None, "correct": False, "strict_correct": False, "formatted": False, "padded": False},
    ),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_grade_known_cases(completion, gold, expected):
    assert grading.grade(completion, gold) == expected


def test_grade_reads_chat_completions_like_plain_text():
    # TRL hands conversational completions as message lists; the grade must not depend on the wrapping.
    chat = [{"role": "assistant", "content": "9 * 2 = 18\n#### 18"}]
    assert grading.grade(chat, "18") == CASES[0][2]


R1_THINK = (
    "<think>\nOkay, so Tom buys 3 packs of 6 pens. That's 3 * 6 = 18 pens. He gives 4 away: 18 - 4 = 14.\n</think>\n\n"
)


# ----------------------------------------------------------------------------------------------------------------
# A. LaTeX thousands grouping: every way of grouping digits reads as one number


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"**Final Answer**" "\n" r"\[ \boxed{1,\!080} \]", "1080"),  # R1 distills write every 4+ digit number so
        (r"The house is worth \(\boxed{\$114,\!200}\).", "114200"),
        (r"She earns $\$1,\!250$ a month, so the answer is $\boxed{15,\!000}$.", "15000"),
        (r"\boxed{1,\!000,\!000}", "1000000"),
        (r"\boxed{12,\!345.50}", "12345.5"),
        (r"\boxed{1{,}080}", "1080"),
        (r"\boxed{\$1{,}080.00}", "1080"),
        (r"\boxed{1\,080}", "1080"),
        (r"\boxed{1\ 080}", "1080"),
        (r"\boxed{1\!080}", "1080"),
        (r"\boxed{1~080}", "1080"),
        ("\\boxed{1\u2009080}", "1080"),  # a thin space
        ("\\boxed{1\u202f080}", "1080"),  # a narrow no-break space
        (r"\boxed{1,\,080}", "1080"),
        (r"The total is $2,\!400 + 1,\!080 = 3,\!480$ dollars.", "3480"),  # the last number, grouped
        (r"So the answer is $1{,}080$.", "1080"),
        ("#### 1,080", "1080"),
        (r"\boxed{3,\!5}", "3"),  # not a thousands group: ",\!5" has one digit, so the box reads 3 ("3, 5")
        (r"\boxed{10,\!000\text{ dollars}}", "10000"),
    ],
)
def test_a_thousands_grouping(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# B. An answer phrase followed by a sentence: the sentence's answer, not its first number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: After 60 days, Cynthia will spend $16.00", "16"),
        (
            "She eats 1 carton every 15 days: 60 / 15 = 4 cartons, 4 * 4 = $16.\nAnswer: Cynthia will spend $16.00 "
            "after 60 days.",
            "16",
        ),  # the result computed above, not the restated 60
        ("**Answer:** In 3 years, Tom will be 18 years old.", "18"),
        ("Answer: Tom has 18 pens left.", "18"),
        ("Answer: Each of the 4 friends gets 6 cookies.", "6"),
        ("Answer: The total cost is 3 * $6 = $18.", "18"),  # a sum: its stated result
        ("The answer is: After giving 4 away, Tom has 14 pens.", "14"),
        ("Answer: Janet makes $18 every day at the farmers' market.", "18"),
        ("**Answer:** Mark needs to sell 25 more cupcakes to reach his goal of 100.", "25"),  # a purpose clause
        ("Answer: It takes 3 hours to fill the 300-gallon tank.", "3"),
        ("Final answer: Over 5 weeks, she saves a total of $250.", "250"),
        ("The answer is 18 pens, and 2 are left over.", "18"),  # a number first is the answer
        ("The answer is about 18 dollars for 3 days.", "18"),
        ("Answer: $16 (4 cartons at $4 each)", "16"),
        ("Answer: 5 times. Sandra needs to babysit 5 times.", "5"),
        ("Answer: the farmer has 120 - 45 = 75 sheep left after the sale of 45.", "75"),
    ],
)
def test_b_sentence_after_answer_phrase(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# C. A marker followed by a line break: JSON answers, the next line, or the final result of the working below


@pytest.mark.parametrize(
    "text, expected",
    [
        ('The final answer is:\n{"reasoning": "3 * 6 = 18 pens, plus 8 more is 26", "answer": "26"}', "26"),
        ('```json\n{\n  "reasoning": "She has 3 + 4 = 7 apples.",\n  "answer": 7\n}\n```', "7"),
        ('{"answer": "$1,080", "explanation": "40 boxes of 27 pens"}', "1080"),
        ('{"steps": ["12 / 3 = 4", "4 * 5 = 20"], "final_answer": "20"}', "20"),
        ("{'reasoning': '5 + 5 = 10', 'answer': 10}", "10"),
        (
            "Step by step answer:\n1. Tom buys 3 packs of 6: 3 * 6 = 18.\n2. He gives away 4: 18 - 4 = 14.\n"
            "So Tom has 14 pens.",
            "14",
        ),  # a heading for the working, not an answer
        ("Step-by-step answer:\nFirst, 3 * 6 = 18 pens.\nThen 18 - 4 = 14 pens.", "14"),
        ("Detailed answer:\nJanet gets 16 eggs and uses 7, so 16 - 7 = 9 are sold at $2: 9 * 2 = 18.", "18"),
        ("The final answer is:\n1. 3 * 6 = 18 pens\n2. 18 - 4 = 14 pens", "14"),  # working: its final result
        ("**Final Answer:**\n- Pens bought: 3 * 6 = 18\n- Pens left: 18 - 4 = 14", "14"),
        ("The final answer is:\n\n18", "18"),
        ("### Final Answer\nTom has **\\$18** left.", "18"),
        ("**Final Answer**\n\n$$\n18\n$$", "18"),
        ("The final answer is:\n\nTom has 14 pens left after giving 4 away.\n\nI hope this helps!", "14"),
        ("Final Answer:\n\\[ 3 \\times 6 = 18 \\]", "18"),
    ],
)
def test_c_marker_then_line_break(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# D. No marker: the answer number of the last sentence, times, and a sum after ####


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Each babysitting job pays $9, and she needs $45: 45 / 9 = 5.\n"
            "So, Sandra needs to babysit 5 times to earn enough to make 15 Spanish flans.",
            "5",
        ),
        ("So, Sandra needs to babysit 5 times to make 15 Spanish flans.", "5"),  # a purpose clause restates
        ("Tom needs 20 - 15 = 5 more dollars.\nSo Tom needs 5 more dollars to buy the $20 game.", "5"),
        ("It will take 100 / 20 = 5 weeks. She will have $100 in 5 weeks.", "5"),
        ("He bought 3 packs at 6 * 3 = $18. In total, he spent $18 on 3 packs.", "18"),  # computed, not restated
        ("3 friends share 18 cookies: 18 / 3 = 6.\nSo the 3 friends each get 6 cookies.", "6"),
        ("Janet sells 16 - 3 - 4 = 9 eggs. She makes 9 * 2 = 18 dollars every day.", "18"),
        ("So he has 18 - 4 = 14 pens left.", "14"),  # operands are passed over
        ("The movie ends at 2:00 pm.", "2"),  # a time: the hour, not the minutes
        ("They meet at 11:30.", "11"),
        ("It is 3 hours after 11:00, so they arrive at 2:00 PM.", "2"),
        ("#### 12.8 hectares / (1 - 3/5) = 12.8 / 0.4 = 32 hectares", "32"),  # a sum with units: its result
        ("#### 40 apples - 15 apples = 25 apples", "25"),
        ("#### 18 pens", "18"),  # a unit alone is no sum
        ("#### 6 apples/day", "6"),
        ("Tom has 18 pens.", "18"),
        ("After 3 years, the tree will be 18 feet tall.", "18"),
        ("Therefore, the total cost is $18 for 3 packs.", "18"),  # nothing computed: "for 3" restates
        ("She will reach her goal in 5 weeks.", "5"),  # one number: it is the answer, whatever precedes it
        ("3 * 6 = 18\nThe total is 20 + 30 = 50.", "50"),
        ("You will save $3 + $5 = $8 for 3 gallons of milk and 5 boxes of cereal.", "8"),  # "and 5" continues "for"
        ("Thus, Marlene will pay $40 x 6 = $240 for the 6 shirts.", "240"),
        ("He gets paid $10,000 because he averages 30 or more points that week.", "10000"),  # a reason restates
        ("If he sells 18 more pens, he will have 50 pens.", "50"),  # a condition restates
        ("He spends $50 on the cheapest flour because 50 < 52.", "50"),  # a comparison is no answer
        ("She runs 6 / 12 = 0.5 hour, which is 30 minutes.", "30"),  # a restatement of the result
        ("768 / 50 = 15.36 minutes, which rounds down to 15 minutes.", "15"),
        ("It would take 840 minutes to groom 5 dogs and 3 cats.", "840"),  # a purpose clause with a list
        ("Nine cheesecakes need 72 - 15 = 57 more eggs than 5 chocolate cakes.", "57"),
        ("Week 2: 300 - 90 = 210 pages remain\nWeek 3:210 pages", "210"),  # "3:210" is no time
        ("100/5 = 5A/5 or 20 = A.", "20"),  # "or" restates; "20 = A" is a result, not an operand
    ],
)
def test_d_no_marker(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# E. No final answer, no credit: unclosed thinking, and the fallback of a cut-off completion


@pytest.mark.parametrize(
    "text, thinking",
    [
        ("<think>\n3 * 6 = 18, so the answer is 18.", False),
        ("<think>\nSo the answer is \\boxed{18}. Wait, let me double-check", False),
        ("<think>\nI'll write it as:\n#### 18\nHmm, but maybe", False),
        ("<think>first</think>\n<think>\nthe answer is 18", False),  # the second block never closed
        ("<thinking>3 * 6 = 18, the answer is 18", False),
        ("Okay, 3 * 6 = 18 pens. So the answer is 18.", True),  # thinking mode, and no </think> at all
        ("#### 18", True),
        ("<think>So it is 18</think", False),  # a broken closing tag closes nothing
    ],
)
def test_e_unclosed_thinking_scores_zero(text, thinking):
    assert extract_answer(text, thinking=thinking) is None
    assert correctness_reward([text], answer=["18"], enable_thinking=thinking) == [0.0]
    assert grade(text, "18", thinking=thinking) == {
        "extracted": None,
        "correct": False,
        "strict_correct": False,
        "formatted": False,
        "padded": False,
    }


@pytest.mark.parametrize(
    "text, thinking, expected",
    [
        ("Okay, 3 * 6 = 18.\n</think>\n\nThe answer is 18.", True, "18"),  # the template put <think> in the prompt
        (R1_THINK + "Tom has **14** pens.", True, "14"),
        (R1_THINK + "Tom has **14** pens.", False, "14"),
        ("<think>\n\n</think>\n\n3 * 6 = 18\n#### 18", True, "18"),  # Qwen3 with thinking off: an empty block
    ],
)
def test_e_closed_thinking_is_read(text, thinking, expected):
    # closed thinking is skipped and the answer after it read, with thinking mode on or off
    assert extract_answer(text, thinking=thinking) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Tom buys 3 packs: 3 * 6 = 18 pens. Then he", None),  # cut off: the last number is no answer
        ("Let me compute: 3 * 6 = 18", None),
        (r"So the answer is $\boxed{18}$. Let me verify: 3 * 6 = 1", "18"),  # an answer it wrote still counts
        ("3 * 6 = 18\n#### 18\n#### 18\n#### 1", "1"),  # the last #### it wrote, even a cut one
        ("The answer is 18. Double-checking: 18 - 4 = 14 and", "18"),
        ("The final answer is:\n1. 3 * 6 = 18\n2. 18 - 4 =", None),  # working under a heading is a fallback too
    ],
)
def test_e_cut_off_gets_no_fallback(text, expected):
    assert extract_answer(text, truncated=True) == expected


@pytest.mark.parametrize("name", ["correctness_reward", "math_reward"])
def test_e_cut_off_told_by_completion_ids(name):
    # TRL passes unpadded ids up to the EOS: as many as max_completion_length means the completion was cut off
    reward = reward_guard.bind(REWARDS[name], max_completion_length=8, enable_thinking=False)
    texts = ["3 * 6 = 18", "3 * 6 = 18", "3 * 6 = 18\n#### 18"]
    ids = [[5] * 8, [5] * 6 + [2], [5] * 8]  # cut off, ended by EOS 2, cut off
    out = reward(completions=texts, answer=["18"] * 3, completion_ids=ids)
    assert out == ([0.0, 1.0, 0.0] if name == "correctness_reward" else [0.0, 0.8, 0.0])  # a cut-off earns nothing


# ----------------------------------------------------------------------------------------------------------------
# F. Smaller cases: number words, scientific notation, a final answer that is no number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is eighteen.", "18"),
        ("The answer is twenty-five.", "25"),
        ("The answer is twenty five apples.", "25"),
        ("The answer is a dozen.", "12"),
        ("Answer: two dozen eggs", "24"),
        ("Answer: one hundred and five", "105"),
        ("The answer is three thousand four hundred.", "3400"),
        ("Answer: Tom has eighteen pens.", "18"),
        ("The answer is zero.", "0"),
        ("3 * 6 = 18. The answer is eighteen, since 3 * 6 = 18.", "18"),
        ("The answer is one of the 3 options: 18.", "18"),  # "one of" is no number
        (r"\boxed{2.4 \times 10^{3}}", "2400"),
        (r"\boxed{1.5 \cdot 10^{4}}", "15000"),
        (r"\boxed{3 \times 10^2}", "300"),
        ("\\boxed{2.4 \u00d7 10^3}", "2400"),
        ("3 * 6 = 18 ... Therefore, the answer cannot be determined.", None),
        ("3 * 6 = 18.\n\n**Final Answer:** Cannot be determined", None),
        ("3 * 6 = 18.\n\nThe answer is: not enough information to tell.", None),
        (r"3 * 6 = 18. So $\boxed{\text{Cannot be determined}}$", None),
        (r"3 * 6 = 18. \boxed{\text{No solution}}", None),
        ("We get 3 * 6 = 18, but the problem does not say how many were lost, so it cannot be determined.", None),
        ("Final Answer: The final answer is 18. I hope it is correct.", "18"),
        ("The answer is 18.\n\nNote: this cannot be determined exactly without rounding, but 18 is close.", "18"),
    ],
)
def test_f_smaller_cases(text, expected):
    assert extract_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# G. Past the final answer: text that repeats or pads it earns no reward (issue 30: a model learned to repeat its
# `#### N` line to the token limit), while evaluation still judges the answer (issue 37). Gold 5 throughout.

PADDED = [
    "2 + 3 = 5\n#### 5\n#### 5\n#### 5",  # the answer line repeated
    "2 + 3 = 5\n" + "#### 5\n" * 40,  # ... to the limit
    "2 + 3 = 5\n#### 5 #### 5",  # on one line
    "2 + 3 = 5\n#### 4\n#### 5",  # two #### answers: lm-eval reads the first, we read the last
    "2 + 3 = 5\n#### 5" + "\n" * 30,  # a whitespace run
    "2 + 3 = 5\n#### 5" + " " * 30,
    "2 + 3 = 5\n#### 5\nThe answer is 5.",  # the answer restated
    "2 + 3 = 5\n#### 5\nfive",  # ... in words
    "2 + 3 = 5\n#### 5\nSo Sam has five pens.",
    "2 + 3 = 5\n#### 5\n\\boxed{5}",
    "2 + 3 = 5\n\\boxed{5}\n#### 5\n\\boxed{5}\n#### 5",  # boxed and hash, repeated
    "2 + 3 = 5\n#### 5\n#### 5\n####",  # cut off mid-repetition
    "2 + 3 = 5\n#### 5\n#### 5\n#### ",
    "2 + 3 = 5\n#### 5\n" + "I hope this helps. " * 12,  # filler past a sign-off's length
    "2 + 3 = 5\n#### 5\n\nQuestion: How many pens does Sam have?",  # another question
    "2 + 3 = 5\n#### 5\n\nQuestion: Sam has 4 pens and buys 1 more. How many?\nAnswer: 4 + 1 = 5\n#### 5",
    "2 + 3 = 5\n#### 5\nQ: What is 2 + 3?\nA: 5",
    "2 + 3 = 5\n#### 5\nUser: thanks!",
    "2 + 3 = 5, so \\boxed{5}\n\\boxed{5}\n\\boxed{5}",  # a box repeated
    "2 + 3 = 5, so \\boxed{5} \\boxed{5}",
    "2 + 3 = 5. The answer is 5. The answer is 5.",  # an answer phrase repeated
    "2 + 3 = 5.\nThe answer is 5.\nThe answer is 5.",
    "2 + 3 = 5.\nSo the answer is 5." + "\n" * 12,
]

STOPPED = [
    "2 + 3 = 5, so 5.\n#### 5",
    "2 + 3 = 5\n#### 5\n",  # a trailing line break (the EOS itself is no text)
    "2 + 3 = 5\n#### 5  \n\n",
    "So the answer is 5.\n#### 5",  # the answer stated once before the asked line
    "2 + 3 = 5\n\\boxed{5}\n#### 5",
    "2 + 3 = 5\n#### 5\nI hope this helps!",  # a short sign-off: no credit lost (format_reward gives 0.5)
    "2 + 3 = 5\n#### 5 pens",
    "So the answer is $\\boxed{5}$.",
    "Final Answer: The final answer is 5. I hope it is correct.",
    "The answer is 5 pens, and 2 are left over.",
    "Step by step: 2 + 3 = 5.\n\nThe answer is 5.",
]


@pytest.mark.parametrize("text", PADDED)
@pytest.mark.parametrize("form", ["plain", "chat"])
def test_g_padding_is_marked_but_the_answer_is_still_judged(text, form):
    completion = text if form == "plain" else [{"role": "assistant", "content": text}]
    assert grading.pads_answer(completion)
    # a careful grader reads the answer (5, right) and notes the padding beside it; the rewards pay it nothing
    assert grade(completion, "5") == {
        "extracted": "5",
        "correct": True,
        "strict_correct": "####" in text,
        "formatted": "####" in text,
        "padded": True,
    }


@pytest.mark.parametrize("text", STOPPED)
def test_g_an_answer_that_stops_keeps_its_credit(text):
    out = grade(text, "5")
    assert not grading.pads_answer(text) and not out["padded"]
    assert out["extracted"] == "5" and out["correct"]
    assert out["strict_correct"] == out["formatted"] == ("####" in text)


@pytest.mark.parametrize("text", ["2 + 3 = 5\n#### 5", "So the answer is $\\boxed{5}$.", "#### 5\n" * 30])
def test_g_a_cut_off_completion_is_judged_by_the_answer_it_wrote(text):
    # cut off at the token limit: an answer it wrote is still its answer (truncated_rate reports the cut); the
    # rewards pay it nothing (test_rewards.py)
    out = grade(text, "5", truncated=True)
    assert (out["extracted"], out["correct"]) == ("5", True)


def test_g_padding_inside_closed_thinking_is_not_padding():
    # the answer region is what follows the thinking; repeats inside the thinking are drafts
    text = "<think>#### 4\n#### 4\n#### 5</think>\n2 + 3 = 5\n#### 5"
    assert not grading.pads_answer(text) and grade(text, "5")["correct"]


# ----------------------------------------------------------------------------------------------------------------
# grade(): evaluate.py's verdicts, with the same rule


@pytest.mark.parametrize(
    "completion, gold, kwargs, expected",
    [
        ("9 * 2 = 18\n#### 18", "18", {}, ("18", True, True, True)),
        ("So the answer is \\boxed{18}.", "18", {}, ("18", True, False, False)),
        ("#### 17", "18", {}, ("17", False, False, True)),
        ("#### 1,080", "Tom packs 40 * 27 = 1080 pens.\n#### 1,080", {}, ("1080", True, True, True)),
        ("3 * 6 = 18", "18", {"truncated": True}, (None, False, False, False)),
        ("3 * 6 = 18\n#### 18", "18", {"truncated": True}, ("18", True, True, True)),  # cut off after its answer
        ("</think>\n#### 18", "18", {"thinking": True}, ("18", True, True, True)),
        ("#### 18", None, {}, ("18", False, False, True)),  # no gold: nothing is correct
    ],
)
def test_grade(completion, gold, kwargs, expected):
    out = grade(completion, gold, **kwargs)
    assert (out["extracted"], out["correct"], out["strict_correct"], out["formatted"]) == expected


# ----------------------------------------------------------------------------------------------------------------
# Safety: model output is never evaluated, and no text makes a reward raise


@pytest.mark.parametrize("path", ["grpo/grading.py", "rewards.py"])
def test_no_evaluation_in_source(path):
    # nothing that reads model output can run it: grading.py reads the answers, rewards.py scores them; no eval-like
    # call, no symbolic-maths parser imported
    tree = ast.parse((REPO / path).read_text())
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = {func.id for func in calls if isinstance(func, ast.Name)}
    attributes = {func.attr for func in calls if isinstance(func, ast.Attribute)}  # re.compile is one of these
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not names & {"eval", "exec", "compile", "__import__"}
    assert not (names | attributes) & {"sympify", "parse_expr", "literal_eval", "simplify", "evalf", "parse"}
    assert not imported & {"sympy", "math_verify", "latex2sympy2_extended", "ast", "numexpr"}


# ----------------------------------------------------------------------------------------------------------------
# H. Issue 37: evaluation judges the answer as a careful human grader would; padding costs only the reward.
# (completion, gold, correct, padded). Written in the styles of Qwen2.5/Qwen3 and SmolLM2 on GSM8K test problems.

JUDGED = [
    # The final answer repeated, with the same marker or another: right, and padded
    ("Janet sells 16 - 3 - 4 = 9 eggs.\n9 * 2 = 18\n#### 18\n#### 18", "18", True, True),
    ("### Final Answer:\n\n#### 18\n\n#### <answer>18</answer>", "18", True, True),
    ("#### 18 ... The answer is 18.\n#### 18", "18", True, True),
    ("It takes 2 + 1 = 3 bolts.\n#### 3\n\n#### 3\n\n#### 3", "3", True, True),
    ("It takes 2 + 1 = 3 bolts.\n#### 3\n\\boxed{3}", "3", True, True),
    ("It takes 2 + 1 = 3 bolts.\n#### 4\n\n#### 4", "3", False, True),  # repeated, and wrong
    ("He made 200,000 - 130,000 = $70,000.\n#### 70000\nThe answer is 70000.", "70000", True, True),
    ("He made 200,000 - 130,000 = $70,000.\n#### 70000\nSo Josh made seventy thousand dollars.", "70000", True, True),
    ("So the answer is \\boxed{70000}.\n\n\\boxed{70000}", "70000", True, True),
    # After `#### N`: an explanation or check with other numbers, or a sign-off, is no padding
    ("9 * 2 = 18\n#### 18\n\nCheck: 18 / 6 = 3, as given.", "18", True, False),
    ("#### 18\n\nExplanation: she sells 16 - 3 - 4 = 9 eggs at $2 each, so 9 * 2 = 18 dollars.", "18", True, False),
    ("#### 18\n\nI hope this helps! Let me know if you have any other questions.", "18", True, False),
    ("#### 18\n\nThanks for the 2 questions today, happy to help.", "18", True, False),  # a sign-off with a number
    ("#### 3\n\nVerification: 2 bolts of blue plus half of 2, which is 1 bolt of white.", "3", True, False),
    ("#### 17\n\nCheck: 18 / 6 = 3, as given.", "18", False, False),  # wrong, explained
    # 1. An answer written in words after </think>
    ("<think>16 - 3 - 4 = 9, 9 * 2 = 18</think>\n\nJanet makes eighteen dollars every day.", "18", True, False),
    ("<think>2 + 1 = 3</think>\n\nThe robe takes three bolts in total.", "3", True, False),
    ("<think>2 + 1 = 3</think>\n\nThree bolts.", "3", True, False),
    ("<think>2 + 1 = 3</think>\n\nIt takes three bolts of fiber. I hope this helps!", "3", True, False),
    ("<think>2 + 2 = 4</think>\n\nThe robe needs four bolts.", "3", False, False),  # in words, and wrong
    ("<think>2 + 1 = 3</think>\n\nI am not sure how to answer this one.", "3", False, False),  # "this one" is no 1
    # 2. A base model that answers, then starts a new few-shot question: right, and padded
    (
        "2 + 1 = 3 bolts.\n#### 3\n\nQuestion: Tom has 5 apples and eats 2. How many are left?\nAnswer: 5 - 2 = 3",
        "3",
        True,
        True,
    ),
    (
        "She makes 9 * 2 = $18.\n#### 18\n\nQuestion: A farmer has 12 cows and buys 7.\nAnswer: 12 + 7 = 19\n#### 19",
        "18",
        True,
        True,
    ),
    (
        "She makes 9 * 2 = 18 dollars. The answer is 18.\n\nQ: A farmer has 12 cows and buys 7. How many?\nA: 19",
        "18",
        True,
        True,
    ),
    ("So he made a profit of $70,000.\n\nQuestion 2: Sam reads 20 pages a day for 5 days.", "70000", True, True),
    (
        "So she makes 16 - 3 - 4 = 9 dollars.\n\nQuestion: Tom has 18 pens.\nAnswer: 18",
        "18",
        False,
        True,
    ),  # wrong first
    (
        "Question: Janet's ducks lay 16 eggs.\nAnswer: 16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars.\n#### 18",
        "18",
        True,
        False,
    ),
    # 3. An answer sentence that gives a count first, then the amount asked
    ("Each shirt is $40, and she pays 40 times 6, which is 240.\nMarlene buys 6 shirts for $240.", "240", True, False),
    ("In total, Tom sold 12 cupcakes for $36.", "36", True, False),
    ("So Carla bought 3 boxes for $27 in total.", "27", True, False),
    ("So Carla bought 3 boxes for $9 each.", "27", False, False),  # a unit price is no total
    ("She will be paid 18 - 4 = 14 dollars for 3 days.", "14", True, False),  # "for 3 days" is still a condition
    # 4. The answer followed by the same quantity in other units: either is the answer
    ("It takes him 120 / 60 = 2 hours, or 120 minutes.", "2", True, False),
    ("It takes him 120 / 60 = 2 hours, or 120 minutes.", "120", True, False),
    ("So she spends 90 minutes, which is 1.5 hours.", "90", True, False),
    ("The answer is 1.5 hours (90 minutes).", "1.5", True, False),
    ("#### 2 hours (120 minutes)", "120", True, False),
    ("So the candy costs $1.50, or 150 cents.", "150", True, False),
    ("The board is 3 feet, i.e. 36 inches long.", "36", True, False),
    ("So 0.25 of the class, or 25%, walks to school.", "25", True, False),
    (
        "It takes him 2 hours, or 100 minutes.",
        "100",
        False,
        False,
    ),  # not the same quantity: the restated 100 is no answer
    # 5. A bold answer first, then an explanation holding numbers
    (
        "**$18**\n\nJanet's ducks lay 16 eggs. She eats 3 and bakes with 4, so she sells 9 eggs at $2 each.",
        "18",
        True,
        False,
    ),
    ("**Tom has 14 pens left.**\n\nHe buys 3 packs of 6 pens (18 pens) and gives 4 to his friend.", "14", True, False),
    ("**3 bolts**\n\nThe robe takes 2 bolts of blue fiber and half of 2 bolts of white fiber.", "3", True, False),
    ("**$17**\n\nJanet's ducks lay 16 eggs, she eats 3 and bakes with 4, and 9 * 2 = 18.", "18", False, False),
    (
        "**Step 1: Eggs sold**\n16 - 3 - 4 = 9 eggs.\n**Step 2: Money**\n9 * 2 = 18 dollars.",
        "18",
        True,
        False,
    ),  # headings
    # 6. An answer in words, with digits only for the given quantities
    (
        "Janet's ducks lay 16 eggs, she eats 3 and uses 4, so she sells nine eggs and makes eighteen dollars.",
        "18",
        True,
        False,
    ),
    ("Tom buys 3 packs of 6 pens and gives away 4, so he has fourteen pens left.", "14", True, False),
    ("The robe takes 2 bolts of blue and 1 of white, so it takes three bolts in total.", "3", True, False),
    ("Tom buys 3 packs of 6 pens and gives away 4, so he has twelve pens left.", "14", False, False),
    (
        "There are 160 + 32 = 192 cows after he adds four into each of the eight stalls.",
        "192",
        True,
        False,
    ),  # given words
    # 7. Hedging between two answers: wrong, even when one of them is the gold
    ("The answer is 18 or 20.", "18", False, False),
    ("So Tom has either 14 or 16 pens.", "14", False, False),
    ("#### 12 or 13", "12", False, False),
    ("The answer is $18, but it might be $20.", "18", False, False),
    ("Janet makes $18 or maybe $20 a day.", "18", False, False),
    ("So she saved $210 / $350 = 0.60 or 60% off.", "60", True, False),  # one quantity twice: no hedge
    ("100/5 = 5A/5 or 20 = A.", "20", True, False),  # an operand and a result: no hedge
    # 8. A wrong answer, after which the gold appears as a restated quantity: wrong
    ("He sold 3 * 6 = 18 pens. So he has 12 pens left out of the 18.", "18", False, False),
    ("She sells 16 - 3 - 4 = 9 eggs, so she makes $9 from her 16 eggs.", "16", False, False),
    ("So Tom has 12 pens, because he started with 18 pens.", "18", False, False),
    ("The answer is 12 pens, since he bought 18.", "18", False, False),
]


@pytest.mark.parametrize(("text", "gold", "correct", "padded"), JUDGED)
def test_h_evaluation_judges_the_answer(text, gold, correct, padded):
    out = grade(text, gold)
    assert (out["correct"], out["padded"]) == (correct, padded)
    # the rewards pay only an answer that is right and stops there
    assert correctness_reward([text], answer=[gold]) == [float(correct and not padded)]


@pytest.mark.parametrize(
    "text",
    [
        "<think>3 * 6 = 18, so the answer is 18.\n#### 18",
        "<think>The answer is eighteen",
        "<think>\n**18**\n\n3 * 6 = 18",
        "<think>18 or 20",
    ],
)
def test_h_unclosed_thinking_is_never_credited(text):
    # by the grader or by the reward, whatever the thinking says
    assert grade(text, "18")["correct"] is False
    assert correctness_reward([text], answer=["18"]) == [0.0]


# ----------------------------------------------------------------------------------------------------------------
# The public readers' contracts (once grading.py's doctests)


def test_completion_to_text_keeps_the_assistant_text_parts():
    assert grading.completion_to_text([{"role": "assistant", "content": "#### 18"}]) == "#### 18"
    chat = [{"role": "tool", "content": "42"}, {"content": [{"type": "text", "text": "18"}]}]
    assert grading.completion_to_text(chat) == "18"


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [
        ("12 * 1.5 = $18.\n#### 18", {}, "18"),
        ("#### 9*2", {}, None),  # an expression is never evaluated
        (r"So he packs $\boxed{1,\!080}$ pens.", {}, "1080"),
        ("Answer: After 60 days, Cynthia will spend $16.00", {}, "16"),
        ("<think>Is it 17?</think>The answer is 18.", {}, "18"),
        ("<think>So the answer is 18", {}, None),
        ("9 * 2 = 18, and then", {"truncated": True}, None),  # cut off: no last-number fallback
    ],
)
def test_extract_answer_contract(text, kwargs, expected):
    assert extract_answer(text, **kwargs) == expected


def test_extract_hash_answer_skips_a_heading():
    assert grading.extract_hash_answer("A third of 36 is 12.\n#### 12") == "12"
    assert grading.extract_hash_answer("#### Final answer\nIt is 12.") is None


def test_answers_match_compares_values():
    assert (grading.answers_match("18", "18.00"), grading.answers_match("1,080", "1080")) == (True, True)
    assert grading.answers_match("18.5", "18") is False
    assert grading.answers_match(("120", "2"), "2") is True  # any of the values that count as the answer
    assert grading.answers_match(None, None) is False


def test_read_answer_gives_the_answer_padding_and_accepted_values():
    assert grading.read_answer("#### 18\n#### 18") == ("18", True, ("18",))
    # the same quantity in other units counts either way
    assert grading.read_answer("It takes 2 hours, or 120 minutes.") == ("120", False, ("120", "2"))


def test_ends_with_hash_line():
    assert grading.ends_with_hash_line("2 + 2 = 4\n#### 4\n") is True
    assert grading.ends_with_hash_line("#### 4 apples") is False


def test_grade_a_boxed_answer():
    expected = {"extracted": "18", "correct": True, "strict_correct": False, "formatted": False, "padded": False}
    assert grade("So the answer is \\boxed{18}.", "18") == expected


def test_grade_a_right_padded_answer():
    expected = {"extracted": "18", "correct": True, "strict_correct": True, "formatted": True, "padded": True}
    assert grade("9 * 2 = 18\n#### 18\n#### 18", "18") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 18\n", False),
        ("#### 18\nCheck: 18 / 6 = 3. Thanks!", False),  # a check with other numbers, a sign-off
        ("#### 18\nThe answer is 18.", True),
        ("#### 18 #### 18", True),
        ("#### 18" + " " * 40, True),
        ("#### 18\nQ: Why?", True),
    ],
)
def test_pads_answer_contract(text, expected):
    assert grading.pads_answer(text) is expected
