"""The GSM8K answer reader: the final answer of a completion, judged as a careful human grader would.

extract_answer's reading rules (answers_match then compares by value), for writing a reward of your own:
- The answer, by precedence (the last of each kind wins; nothing after a next "Question:" or turn): `#### N`;
  `\\boxed{N}`; an answer phrase ("the answer is N", "Answer: N", `<answer>N</answer>`); a bold first line ("**18
  pens**"); else the last sentence with a number, in digits or words, passing over operands, purpose clauses
  ("to make 15 flans") and conditions.
- A hedge ("18 or 20") is no answer; the same quantity in other units ("2 hours, or 120 minutes") counts either way.
- LaTeX and markdown are read (`1,\\!080`, `\\frac{3}{4}`); an expression (`#### 9*2`) is never evaluated.
- No final answer, no credit: unclosed thinking reads nothing; a cut-off completion gets none from its last number.
"""

import re
from decimal import Context, Decimal, InvalidOperation
from functools import lru_cache
from math import gcd
from numbers import Integral, Number

# ----------------------------------------------------------------------------------------------------------------
# Limits: they bound the work per completion, so that a 1 MB completion grades in milliseconds
MAX_NUMBER_CHARS = 100  # digits in one number; a longer run of digits is not an answer
SPAN_CHARS = 300  # characters read after an answer marker
SENTENCE_CHARS = 400  # characters read back from the last number for its sentence
MAX_BOX_CHARS = 1000  # characters searched for the closing brace of \boxed{
MAX_MARKERS = 64  # occurrences of one kind of marker tried, from the last, before giving up on that kind
MAX_FALLBACK_CHARS = 65536  # characters read back for the last number when the last digits are none ("x2")
MAX_TAIL_CHARS = 1000  # characters after the final answer's line: an explanation or a sign-off; more is filler
MAX_BLANK_CHARS = 8  # whitespace in a row from the final answer on: a line break or two, not a run to the limit

# Whole texts are scanned with str.find/rfind (C speed); regexes run on short spans or visit each character boundedly.
_CTX = Context(prec=MAX_NUMBER_CHARS + 40)  # exact for every number we accept, scaled by up to 10**12
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_THINK_OPENS = ("<think>", "<thinking>")
_THINK_CLOSES = ("</think>", "</thinking>")
_BLOCK_ENDS = (*_THINK_CLOSES, "</reasoning>")  # text after the last of these is the answer region
_DIGITS = "0123456789"

_NUMBER = re.compile(  # sign, currency, thousands, decimals, scale; never in a word, after a point, in "2:00"
    r"(?<![\w.])(?!(?<=[0-9]:)[0-5][0-9](?![0-9]))(?P<neg>-(?=\$?\.?[0-9]))?\$?"
    r"(?P<body>[0-9]{1,3}(?:,[0-9]{3})++(?![0-9])(?:\.[0-9]++)?|[0-9]++(?:\.[0-9]++)?|\.[0-9]++)"
    r"(?:[ \t]*+(?P<scale>(?i:thousand|million|billion|trillion))\b)?"
)
# After a number: an operator and another number (an expression), or "=" (the left side of an equation).
_EXPRESSION_TAIL = re.compile(r"[ \t]*+(?:=|(?:[-+*/^]|[xX](?=[ \t]*+[0-9]))[ \t]*+\(?[ \t]*+-?\$?\.?[0-9])")
_UNIT_EXPRESSION_TAIL = re.compile(  # ... or a unit first, "12.8 hectares / (1 - 3/5) = 32", when an "=" follows
    r"[ \t]*+(?:[A-Za-z%]++[ \t]*+){1,3}(?:[-+*/]|[xX](?=[ \t]*+[0-9]))[ \t]*+\(?[ \t]*+-?\.?[0-9]"
)
_HEADING_TAIL = re.compile(r"[.):][ \t]++[A-Za-z]")  # "#### 2. Add the pens" is a numbered markdown heading
_HASH_LEAD = re.compile(r"[\s*(:=~]*+")  # what may stand between "####" and its number once LaTeX is cleaned
_LEAD = re.compile(  # what may stand before a phrase's first number: markup, "about", "exactly", "a total of"
    r"[\s*_(:=~\"'`\[]*+(?:(?i:approximately|approx\.|about|around|roughly|exactly|only|just|nearly|almost"
    r"|(?:a[ \t]++)?total[ \t]++of)[\s*_(:=~\"'`]*+)?"
)
_ALNUM = re.compile(r"[0-9A-Za-z]")
_LETTER = re.compile(r"[A-Za-z]")
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)|\n")
_RAW_SENTENCE_ENDS = (". ", ".\t", "\n", "! ", "? ", "; ")  # the same, as literals for str.rfind

# LaTeX and markdown around a number, removed before reading it.
_FRAC = re.compile(
    r"\\[dt]?frac[ \t]*+(?:\{[ \t]*+(?P<num>-?[0-9]{1,30})[ \t]*+\}|(?P<num1>[0-9]))"
    r"[ \t]*+(?:\{[ \t]*+(?P<den>[0-9]{1,30})[ \t]*+\}|(?P<den1>[0-9]))"
)
_WHOLE_BEFORE = re.compile(r"(?<![0-9.])[0-9]{1,30}[ \t]*+$")  # the 2 of a mixed number, 2\frac{1}{2}
_THOUSANDS_SEP = re.compile(  # thousands as LaTeX and typography group them: 1,\!080 1{,}080 1\,080 1~080
    r"(?<=[0-9])(?:(?:,|\{,\})(?:\\[!,;: ]|~)*+|(?:\\[!,;: ]|~|[\u00a0\u2009\u202f])++)(?=[0-9]{3}(?![0-9]))"
)
_SCIENTIFIC = re.compile(  # 2.4 \times 10^{3}, 2.4 x 10^3: a way of writing one number, not a sum to evaluate
    r"(?<![0-9.])(?P<mantissa>[0-9]{1,30}(?:\.[0-9]{1,30})?)[ \t]*+(?:\\times|\\cdot|\u00d7|\*|x)[ \t]*+10[ \t]*+"
    r"\^[ \t]*+(?:\{[ \t]*+(?P<exp>-?[0-9]{1,2})[ \t]*+\}|(?P<exp1>[0-9]))"
)
_ESCAPED = re.compile(r"\\([$%{}#&_])")
_TIMES = re.compile(r"\\(?:times|cdot|ast)(?![a-zA-Z])")
_DIV = re.compile(r"\\div(?![a-zA-Z])")
_APPROX = re.compile(r"\\(?:approx|simeq|thickapprox)(?![a-zA-Z])")
_COMMAND = re.compile(r"\\(?:[a-zA-Z]++|[,;:! ()\[\]])")
_POWER = re.compile(r"(?<=[0-9])[ \t]*+\*\*[ \t]*+(?=[0-9(])")  # Python's 9**2 is an expression, not bold
_CHARS = str.maketrans(
    "\u2212\u00d7\u00b7\u2217\u00f7\u2248\u00a0\u2009\u202f", "-***/=   ", "${}\u20ac\u00a3\u00a5\u20b9"
)
_MONEY_CHARS = _CHARS | str.maketrans("$\u20ac\u00a3\u00a5\u20b9", "$$$$$")  # the same, keeping money's "$"

# Answer markers, each matched where str.rfind found its literal.
_HASH_LINE = re.compile(r"[ \t]*+####[ \t]*+-?(?:[0-9]{1,3}(?:,[0-9]{3})++|[0-9]++)(?:\.[0-9]++)?[ \t]*+")
_BOX_OPEN = re.compile(r"[ \t]{0,8}\{")
_BOX_BARE = re.compile(r"[ \t]{1,8}([^\s$]{1,50})")  # \boxed 18, valid LaTeX without braces
_BRACE = re.compile(r"(?<!\\)[{}]")  # \{ and \} are literal braces
_PHRASE_AT = re.compile(
    r"(?i)answer(?P<json>[\"'][ \t]*+:)[ \t]*+"  # {"reasoning": "...", "answer": "26"}
    r"|answer(?:[ \t]++(?:to|for|of)\b[^.\n]{0,60}?)?[ \t*_]++"
    r"(?:is|was|would[ \t]+be|should[ \t]+be|will[ \t]+be)\b[ \t*_:]*+"  # the (final) answer is N
    r"|answer(?:[ \t]*+\([^)\n]{0,40}\))?[ \t*_]*+[:=\uff1a]"  # Answer: N, Final answer (in $): N
    r"|answer(?P<heading>[ \t*_:]*+)(?=\r?\n)"  # a "### Final Answer" heading, N on a following line
)
_HEADING_PREFIX = re.compile(r"[ \t#*>_]*+(?:final[ \t]++)?", re.IGNORECASE)
_A_PREFIX = re.compile(r"[ \t*>_]*+")
_WORKING_HEADING = re.compile(  # "Step by step answer:", "Detailed answer:" head the working, not the answer
    r"(?i:step[- ]by[- ]step|detailed|worked|full|complete|explained|long)[ \t*_]*+(?:final[ \t]++)?$"
)
# A line of working rather than an answer: a list item, a "Step", or a sum.
_WORKING_LINE = re.compile(r"[ \t>*_]*+(?:[-*\u2022][ \t]|[0-9]{1,2}[.)][ \t]|(?i:step)\b)")
_NO_ANSWER = re.compile(  # a statement that there is no numeric answer
    r"(?i:can(?:not|'t|[ \t]++not)[ \t]++be[ \t]++(?:determined|calculated|computed|found|answered|solved)"
    r"|not[ \t]++enough[ \t]++information|insufficient[ \t]++(?:information|data)|no[ \t]++(?:valid[ \t]++"
    r"|possible[ \t]++|unique[ \t]++)?solution|unsolvable|indeterminate|undetermined)"
)
_PURPOSE = re.compile(  # a purpose clause restates the question: "to make 15 flans", "to reach his goal of 100"
    r"\bto[ \t]++(?!(?:be|the|a|an|his|her|their|its|each|every|this|that|me|him|them|us)\b)[a-z]++"
    r"(?:[ \t]++(?!(?:is|are|was|were|has|have|had|will|would|can|so|which|then|but|he|she|they|it|we|i|you)\b)"
    r"[a-z0-9'.]++){0,3}[ \t]++$"
)
_MODAL_TO = re.compile(  # ... unless "to" belongs to the main verb: "needs to babysit 5 times", "has to pay 18"
    r"(?i)\b(?:needs?|needed|has|have|had|going|wants?|wanted|able|used|ought|plans?|planned|decides?|decided"
    r"|tries|tried|expects?|expected|hopes?|hoped|likes?|liked|wish(?:es)?|got)[ \t]++$"
)
_CONTEXT = re.compile(  # a number after these may restate a condition: "$16 after 60 days"
    r"(?i)(?:\b(?:after|before|for|per|each|every|in|within|over|during|on|above|below|until|than)"
    r"|(?<!total )\bof)[ \t]++(?:[a-z]{1,20}?ing[ \t]++(?:away[ \t]++)?)?"
    r"(?:(?:(?P<det>the|its|his|her|their|those|these|this|that|all|both)|a|an|another|next|first|last)[ \t]++)?$"
)
_OPERAND_TAIL = re.compile(  # an operand: an operator or "=" and a number follow, or a comparison ("50 < 52")
    r"[ \t]*+(?:(?:[-+*/^=<>]|[xX](?=[ \t]*+[0-9]))[ \t]*+\(?[ \t]*+-?\$?\.?[0-9]|[<>\u2264\u2265])"
)
_COMPARED = re.compile(r"(?:[<>\u2264\u2265]|[0-9%)][ \t]*+(?:[-+*/^]|[xX]))[ \t]*+\(?[ \t]*+$")  # "50 < 52", "1 - 3"
_RESULT_BEFORE = re.compile(r"=[ \t]*+$")
_AND_BEFORE = re.compile(r"\band[ \t]++(?:[a-z]++[ \t]++){0,2}$")
_RESTATED = re.compile(  # restates the result before it: "which is 30 minutes", "or 20 = A", "rounds down to 15"
    r"(?i:\b(?:which|that)[ \t]++(?:is|are|makes|means|equals|comes[ \t]++to)|\bor|\bi\.e\.,?"
    r"|\brounds?[ \t]++(?:down|up)?[ \t]*+to|\brounded[ \t]++(?:down|up)?[ \t]*+to)[ \t]++$"
)
# A reason or a condition, to the next comma: its numbers restate the question.
_CONDITION = re.compile(r"(?i:\b(?:because|since|if|given[ \t]++that|assuming|when|whenever)\b)")
_DIGIT = re.compile(r"[0-9]")
_CLAUSE_END = re.compile(r"[,;:=]")  # "... when she started = 90 more pounds": the result is no condition
_RESULT_AT = re.compile(r"(?:=|>>)[ \t]*+")  # where a computed result follows: "= 18", GSM8K's "<<3*6=18>>18"
# Past the final answer: a run of whitespace, and another question or turn starting on a line of its own.
_BLANK_RUN = re.compile(rf"\s{{{MAX_BLANK_CHARS + 1}}}")
_NEW_TURN = re.compile(
    r"\n[ \t*#>]*+(?:question|problem|q|user|human)(?:[ \t]*+#?[0-9]++)?[ \t*]*+:|<\|im_start\|>", re.IGNORECASE
)
_UNIT_PRICE = re.compile(r"[ \t]*+(?:each|apiece|per|a[ \t]++piece)\b", re.IGNORECASE)  # "for $2 each"
_LINK = re.compile(  # between two numbers: a unit, then "or" (a hedge, or the same quantity) or "which is"
    r"(?i)[ \t]*+(?P<unit>(?!(?:or|and|but|which|that|it|i)\b)[A-Za-z]++|%)?[ \t]*+[,;]?[ \t]*+"
    r"(?:(?P<hedge>(?:either[ \t]++)?or(?:[ \t]++(?:maybe|possibly|perhaps|even))?"
    r"|(?:but[ \t]++)?(?:it[ \t]++)?(?:might|could|may)(?:[ \t]++also)?[ \t]++be)"
    r"|(?P<restated>which[ \t]++(?:is|equals)|that[ \t]++is|that's|i\.e\.,?|\())?"
    r"[ \t]*+\(?[ \t]*+(?:about[ \t]++)?"
)
_LINK_WORDS = (" or ", "might", "could", "may ", "which", "that is", "that's", "i.e", "(")  # what _LINK needs
_UNIT_WORD = re.compile(r"[ \t]*+([A-Za-z]++|%)")
_OPERATOR_END = re.compile(r"(?:[-+*/^]|(?<![A-Za-z])[xX])[ \t]*+$")  # a right operand: "3 x 20 hours = 60 hours"
_UNIT_SIZES = {  # a unit (singular: "hours" is looked up as "hour") -> what it measures, its size in the smallest
    word: (kind, size)
    for kind, sizes in {
        "time": {"second sec": 1, "minute min": 60, "hour hr": 3600, "day": 86400, "week": 604800},
        "months": {"month": 1, "year": 12},
        "money": {"cent": 1, "dollar $": 100},
        "length": {"inch inche": 1, "foot feet ft": 12, "yard yd": 36, "mile": 63360},
        "metres": {"centimeter cm": 1, "meter metre": 100, "kilometer km": 10**5},
        "weight": {"ounce oz": 1, "pound lb": 16},
        "grams": {"gram g": 1, "kilogram kg": 1000},
        "volume": {"cup": 1, "pint": 2, "quart": 4, "gallon": 16},
        "litres": {"milliliter ml": 1, "liter litre": 1000},
        "share": {"% percent": 1},
    }.items()
    for names, size in sizes.items()
    for word in names.split()
}
_UNIT_SIZES[None] = ("share", 100)  # a bare number: "0.6, or 60%"
# A bold line that opens the answer region, "**18 pens**", answers first when the explanation after it has no marker.
_BOLD_FIRST = re.compile(r"\s*+(?:#{1,6}[ \t]++)?(\*\*|__)(?P<body>[^\n*_]{1,100}?)\1[ \t.!]*+(?:\n|$)")

# Numbers written as words, read after an answer phrase: "eighteen", "twenty-five", "a dozen".
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
_UNITS += " seventeen eighteen nineteen"
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
_WORD_VALUES = {word: value for value, word in enumerate(_UNITS.split())}
_WORD_VALUES |= {word: 20 + 10 * i for i, word in enumerate(_TENS.split())}
_WORD_SCALES = {"dozen": 12, "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NUMBER_WORD = rf"(?:{'|'.join(sorted([*_WORD_VALUES, *_WORD_SCALES], key=len, reverse=True))})\b"
_WORD_NUMBER = re.compile(
    rf"(?i)(?<![\w-])(?:an?[ \t]++(?=(?:dozen|hundred|thousand|million)\b))?{_NUMBER_WORD}"
    rf"(?:(?:[ \t]*+-[ \t]*+|[ \t]++(?:and[ \t]++)?){_NUMBER_WORD})*+(?![ \t]++of\b)"
)
_WORD_CUE = re.compile(  # before number words that state a number: a verb, or a sentence's start
    r"(?:(?i:\b(?:is|are|was|were|be|has|have|had|gets?|got|makes?|made|needs?|costs?|spends?|spent|pays?|paid"
    r"|earns?|earned|equals?|totals?|of|takes?|took|sells?|sold|buys?|bought|saves?|saved|uses?|used)|=)[ \t]++"
    r"|(?:^|[.!?:\n])[ \t*_#>]*+)$"
)

# Shown working, for reasoning_reward: an operation "36 / 3", then the rest of its chain and an "= result".
_OPS = r"(?:[-+*/^xX\u2212\u00d7\u00f7\u00b7\u2217]|\\(?:times|cdot|div)(?![a-zA-Z]))"
_OPERATION = re.compile(rf"[0-9%][ \t]?+{_OPS}[ \t]?+\(?+[ \t]?+\$?+\.?[0-9]")
_CHAIN = re.compile(r"(?:[-+*/^xX\u2212\u00d7\u00f7\u00b7\u2217 \t0-9.,%$()]++|\\(?:times|cdot|div)(?![a-zA-Z]))*+")
_RESULT = re.compile(r"[ \t]*+\)?[ \t]*+=[ \t]*+(?:<<)?\$?-?\.?[0-9]")  # GSM8K writes "5 x 3 =<<15=15>>15"
_OP_CHARS = "-+*/^xX\\\u2212\u00d7\u00f7\u00b7\u2217"


def completion_to_text(completion) -> str:
    """A completion's text: a string, or the text of its assistant (or, as in TRL, role-less) messages; else ""."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, bytes | bytearray):
        return bytes(completion).decode("utf-8", "replace")
    if isinstance(completion, dict):
        completion = [completion]
    parts = []
    for content in completion if isinstance(completion, list | tuple) else ():  # anything else: ""
        if isinstance(content, dict) and content.get("role", "assistant") == "assistant":
            content = content.get("content")
            if isinstance(content, list | tuple):  # multimodal parts: keep the text ones
                texts = (p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
                content = "\n".join(text for text in texts if isinstance(text, str) and text)
        if isinstance(content, str):
            parts.append(content)
    return "\n".join(part for part in parts if part)


def extract_answer(text: str, *, truncated: bool = False, thinking: bool = False) -> str | None:
    """The final answer of a completion or a GSM8K solution as a decimal string ("1080", "-3", "18.5"), or None.
    `truncated` (cut off): no answer from its last number; `thinking` (mode on): none unless the thinking closed."""
    return read_answer(text, truncated=truncated, thinking=thinking, pads=False)[0]


def extract_hash_answer(text: str, *, thinking: bool = False) -> str | None:
    """The number after the last `####` (GSM8K's format; not a heading, `#### Final answer`), else None."""
    return read_answer(text, thinking=thinking, strict=True, pads=False)[0]


def answers_match(pred: str | None, gold: str | None) -> bool:
    """Whether two answers are the same number, compared exactly as Decimals; `pred` may be a tuple of values that
    all count as the answer (`read_answer`'s third part). None never matches."""
    if isinstance(pred, tuple):
        return any(answers_match(value, gold) for value in pred)
    a, b = _to_decimal(pred), _to_decimal(gold)
    return a is not None and b is not None and a == b


def grade(completion, gold, *, truncated: bool = False, thinking: bool = False) -> dict:
    """One completion against its gold answer (a number, or a GSM8K solution): the evaluation's verdicts.

    Returns `extracted` (`extract_answer`'s reading), `correct` (it equals the gold), `strict_correct` (the `#### N`
    answer does), `formatted` (there is a `#### N`), `padded` (`pads_answer`; the verdicts judge the answer alone).
    """
    gold = gold_value(gold)
    region = answer_region(completion_to_text(completion), thinking)  # read once for both readings
    extracted, padded, accepted = _read(region, truncated)
    strict, _, strict_accepted = _read(region, strict=True, pads=False)
    return {
        "extracted": extracted,
        "correct": answers_match(accepted, gold),
        "strict_correct": answers_match(strict_accepted, gold),
        "formatted": strict is not None,
        "padded": padded,
    }


def pads_answer(text, *, truncated: bool = False, thinking: bool = False) -> bool:
    """Whether the completion goes on past its final answer (docs/rewards.md): the answer said again, filler, a run of
    whitespace, another question or turn; not an explanation, a check with other numbers or a sign-off."""
    return read_answer(text, truncated=truncated, thinking=thinking)[1]


def read_answer(
    text, *, truncated=False, thinking=False, strict=False, pads=True
) -> tuple[str | None, bool, tuple[str, ...]]:
    """`extract_answer`'s answer (strict: `extract_hash_answer`'s), `pads_answer`'s verdict (False unasked, `pads`),
    and the values that count as the answer: it, and the same quantity in other units. A hedge ("18 or 20") is no
    answer."""
    return _read(answer_region(completion_to_text(text), thinking), truncated, strict, pads)


def _read(region, truncated=False, strict=False, pads=True):
    head = None if region is None else region[: _turn_at(region)]  # a base model's next question is no answer
    found = None if head is None else (_hash_answer(head) if strict else _final_answer(head, truncated))
    if found is None:
        return None, False, ()
    value, accepted = _statement(head, *found)
    return value, pads and _pads(region, *found), accepted


def _pads(region: str, value: str | None, start: int, end: int) -> bool:
    """pads_answer's rules, for the final answer `value` whose marker starts at `start`, its line ending at `end`."""
    tail = region[end:]
    if len(tail) > MAX_TAIL_CHARS or _BLANK_RUN.search(region, max(start, end - SPAN_CHARS)):
        return True  # filler, or a run of whitespace from the answer's number on
    if tail.strip() and ("####" in tail or "\\boxed" in tail or _NEW_TURN.search(tail) or _repeats(tail, value)):
        return True  # another answer marker, another question or turn, the answer said again, filler
    if region.startswith("####", start) and _hash_answer(region[:start]):
        return True  # an earlier `#### N`: this one repeats it
    # The statement of the final answer (from its marker, or its sentence) said just before it: `\\boxed{5} \\boxed{5}`
    if region.startswith(("answer", "Answer", "ANSWER", "A:"), start):  # a phrase: its sentence
        start = _sentence_start(region, start)
    statement = region[start : min(end, start + 2 * SPAN_CHARS)].strip().rstrip(".!")  # a longer one repeats none
    before = region[max(0, start - 2 * SPAN_CHARS) : start].rstrip(" \t\n.!")
    return 0 < len(statement) <= SPAN_CHARS and before.endswith(statement)


def _repeats(tail: str, value: str | None) -> bool:
    """Whether the text after the answer says it again (a phrase, a sentence with it alone) or a sentence twice."""
    if (found := _phrase_answer(tail, tail)) is not None and found[0] is not None:
        return True
    previous = None
    for sentence in _SENTENCE_END.split(tail):
        numbers = [_normalise(n) for n in _NUMBER.finditer(_digits_for_words(_clean(sentence)))]
        if numbers == [value] or (sentence.strip() and sentence.strip() == previous):
            return True
        previous = sentence.strip()
    return False


def _statement(text: str, value: str | None, start: int, end: int) -> tuple[str | None, tuple[str, ...]]:
    """The answer and the values that restate it in other units ("2 hours (120 minutes)"); None for a hedge."""
    lowered = text[start : min(end, start + SPAN_CHARS)].lower()
    if value is None or not any(word in lowered for word in _LINK_WORDS):
        return value, () if value is None else (value,)
    statement = _clean(text[start : min(end, start + SPAN_CHARS)], money=True)
    numbers = list(_NUMBER.finditer(statement))
    accepted = [value]
    for a, b in zip(numbers, numbers[1:], strict=False):
        link = _LINK.fullmatch(statement, a.end(), b.start())
        if link is None or not (link.group("hedge") or link.group("restated")):
            continue
        pair = (_normalise(a), _normalise(b))
        operand = _is_operand(statement, b) or _OPERATOR_END.search(statement, max(0, a.start() - 8), a.start())
        if value not in pair or pair[0] == pair[1] or operand:  # "250 days = 5 hours", "5A/5 or 20 = A": sums
            continue
        after_b = _UNIT_WORD.match(statement, b.end())
        units = [_unit(a, link.group("unit")), _unit(b, after_b and after_b.group(1))]
        sizes = [_UNIT_SIZES.get(unit) for unit in units]
        same_kind = None not in sizes and sizes[0][0] == sizes[1][0] and units[0] != units[1]
        if same_kind and _CTX.multiply(Decimal(pair[0]), sizes[0][1]) == _CTX.multiply(Decimal(pair[1]), sizes[1][1]):
            accepted.append(pair[1] if pair[0] == value else pair[0])  # the same quantity in other units
            continue
        if same_kind or (link.group("hedge") and units[0] in (None, units[1])):
            return None, ()  # two answers ("18 or 20"), or two quantities said to be one ("2 hours, or 100 minutes")
    return value, tuple(accepted)


def _unit(number: re.Match, word: str | None) -> str | None:
    """The unit after a number, as `_UNIT_SIZES` names it: "$" for money, "hour" for "hours"; None for none."""
    word = "$" if "$" in number.group() else word.lower() if word else None
    return word if word in _UNIT_SIZES or word is None else word.removesuffix("s")


def _to_decimal(value) -> Decimal | None:
    if not isinstance(value, str) or len(value) > 4 * MAX_NUMBER_CHARS:
        return None
    try:
        number = Decimal(value.strip().replace(",", "").removeprefix("$"))
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def answer_region(text: str, thinking: bool = False) -> str | None:
    """The text after the last closed thinking block if any follows it, else all; None where thinking never closed."""
    if "<" not in text:  # no tag at all: the common case, at str.find speed
        return None if thinking else text
    close = max((text.rfind(tag) for tag in _THINK_CLOSES), default=-1)
    opened = max((text.rfind(tag) for tag in _THINK_OPENS), default=-1)
    if opened > close or (thinking and close < 0):
        return None
    cut = max((i + len(tag) for tag in _BLOCK_ENDS if (i := text.rfind(tag)) >= 0), default=0)
    return text[cut:] if cut and not text[cut:].isspace() and len(text) > cut else text


@lru_cache(maxsize=4)  # asked for rarely, and then for one text over and over
def _computed(source: str) -> frozenset[str | None]:
    """The numbers that the text states as computed results ("= 18", "<<3*6=18>>18")."""
    clean = _clean(source[-MAX_FALLBACK_CHARS:])
    results = (_NUMBER.match(clean, at.end()) for at in _RESULT_AT.finditer(clean))
    return frozenset(_normalise(number) for number in results if number is not None)


def _final_answer(text: str, truncated: bool = False) -> tuple[str | None, int, int] | None:
    """The first kind's last answer: (value or None for no number, where its marker starts, where its line ends).
    Each finder reads `text`; a number the `source` text states as computed ("= 18") is no restated quantity."""
    for find in (_hash_answer, _boxed_answer, _phrase_answer, _bold_answer, _last_answer):
        if (found := find(text, text, truncated)) is not None:
            return found
    return None


def _turn_at(region: str) -> int:
    """Where a next question or turn starts after the first digit (a base model's next few-shot question)."""
    first_digit = _DIGIT.search(region)
    if first_digit is None or (region.find(":", first_digit.start()) < 0 and "<|im_start|>" not in region):
        return len(region)
    turn = _NEW_TURN.search(region, first_digit.start())
    return len(region) if turn is None else turn.start()


def _sentence_start(text: str, pos: int) -> int:
    """Where the sentence that holds `pos` starts, at its first non-space, read back SENTENCE_CHARS at most."""
    low = max(0, pos - SENTENCE_CHARS)
    start = max((i + len(end) for end in _RAW_SENTENCE_ENDS if (i := text.rfind(end, low, pos)) >= 0), default=low)
    return pos - len(text[start:pos].lstrip())


def _last_number_at(text: str) -> int:
    """Where the text's last number is: its last digit, or a number word after it ("so he has fourteen"); else -1."""
    last_digit = max(text.rfind(digit) for digit in _DIGITS)
    pos = max(last_digit + 1, len(text) - 2 * SENTENCE_CHARS)
    words = _WORD_NUMBER.search(text, pos) and max(_spelled(text, pos), key=re.Match.start, default=None)
    return last_digit if words is None else words.start()


def _says_number(words: re.Match) -> bool:
    """Whether number words state a number: after a verb ("has six", not "in eight stalls") or opening a sentence."""
    return _WORD_CUE.search(words.string, max(0, words.start() - 12), words.start()) is not None


def _spelled(text: str, pos: int = 0):
    return (words for words in _WORD_NUMBER.finditer(text, pos) if _says_number(words))


def _digits_for_words(text: str) -> str:
    """The text with its stated number words as digits: "he has fourteen pens" -> "he has 14 pens"."""
    return _WORD_NUMBER.sub(lambda words: _word_value(words.group()) if _says_number(words) else words.group(), text)


def _bold_answer(text: str, source: str, truncated: bool = False) -> tuple[str | None, int, int] | None:
    """A bold line that opens the text with a number ("**18 pens**"); not a heading ("**Step 1:**") nor working."""
    bold = _BOLD_FIRST.match(text)
    if bold is None or bold.group("body").rstrip().endswith(":") or _is_working(bold.group("body")):
        return None
    found, value = _read_span(bold.group("body"), source=source)
    return (value, bold.start("body"), len(text)) if found and value is not None else None


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _hash_answer(text: str, source: str = "", truncated: bool = False) -> tuple[str | None, int, int] | None:
    for pos, _ in _rfind_all(text, ("####",)):
        if pos > 0 and text[pos - 1] == "#":  # "#####" is a markdown heading, not the answer marker
            continue
        span, line = _span_after(text, pos + 4)
        found, value = _read_span(span, lead=True)
        if found:
            return value, pos, _line_end(text, line)
    return None


def _boxed_answer(text: str, source: str, truncated: bool = False) -> tuple[str | None, int, int] | None:
    for pos, marker in _rfind_all(text, ("\\boxed", "\\fbox")):
        content = _box_content(text, pos + len(marker))
        if content is not None:
            end = _line_end(text, pos + len(marker) + len(content))
            found, value = _read_span(content, source=source)
            if found or _LETTER.search(_clean(content)):  # or no number: \boxed{\text{Cannot be determined}}
                return value, pos, end
    return None


def _box_content(text: str, pos: int) -> str | None:
    opening = _BOX_OPEN.match(text, pos)
    if opening is None:
        bare = _BOX_BARE.match(text, pos)
        return bare.group(1) if bare else None
    depth, start = 1, opening.end()
    for brace in _BRACE.finditer(text, start, min(len(text), start + MAX_BOX_CHARS)):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[start : brace.start()]
    return None  # unbalanced within reach: not a box


def _phrase_answer(text: str, source: str, truncated: bool = False) -> tuple[str | None, int, int] | None:
    last_digit = max(text.rfind(digit) for digit in _DIGITS)
    for pos, marker in _rfind_all(text, ("answer", "Answer", "ANSWER", "A:")):
        if marker == "A:":  # a weak marker (few-shot prompts start whole solutions with it): a line "A: N" only
            if _at_line_start(text, pos, _A_PREFIX):
                span, line = _span_after(text, pos + 2)
                found, value = _read_span(span, single=True)
                if found:
                    return value, pos, _line_end(text, line)
            continue
        phrase = _PHRASE_AT.match(text, pos)
        json_key = phrase is not None and phrase.group("json") is not None
        if pos > 0 and (text[pos - 1].isalnum() or text[pos - 1] == "_") and not json_key:  # "final_answer": ok
            continue
        if _WORKING_HEADING.search(text, max(0, pos - 40), pos):  # "Step by step answer:" heads the working
            continue
        if pos > 0 and text[pos - 1] == "<" and text.startswith(">", pos + 6):  # <answer>N</answer>
            span, line = _span_after(text, pos + 7)
            span = span.split("</", 1)[0]
        elif phrase is None or (
            phrase.group("heading") is not None and not _at_line_start(text, pos, _HEADING_PREFIX)
        ):
            continue
        else:
            span, line = _span_after(text, phrase.end())
            if json_key and span[:1] and span[0] in "\"'":  # the quoted value only
                span = span[1:].split(span[0], 1)[0]
            if line > phrase.end() and _is_working(span):  # a heading over working: the block's final result
                found = _last_answer(text[line:], source, truncated)
                if found is not None and found[0] is not None:
                    return found[0], pos, len(text)
                continue
        found, value = _read_span(span, source=source)
        if found or _NO_ANSWER.search(_clean(span)) or last_digit < pos:
            # a number, or a final answer that is no number: "The answer cannot be determined." (value None)
            return value, pos, _line_end(text, line)
    return None


def _is_working(line: str) -> bool:
    return _WORKING_LINE.match(line) is not None or _OPERATION.search(_clean(line)) is not None


def _last_answer(text: str, source: str, truncated: bool = False) -> tuple[str | None, int, int] | None:
    """The answer of the sentence that holds the text's last number (none when cut off), as the finders give it."""
    last_digit = -1 if truncated else _last_number_at(text)
    if last_digit < 0:
        return None
    start = _sentence_start(text, last_digit)  # "  Therefore, ... = $350.": its sentence
    where = start, _line_end(text, last_digit)
    window = _clean(text[start : last_digit + SPAN_CHARS], money=True)
    window = window if text[last_digit].isdigit() else _digits_for_words(window)  # "so he has fourteen pens"
    numbers = list(_NUMBER.finditer(window))
    if numbers and not (numbers[0].start() == 0 and start > 0 and not text[start - 1].isspace()):
        last = numbers[-1]
        sentence = window[: last.end()]
    else:  # digits but no number here ("x2"): the last number before them, read back MAX_FALLBACK_CHARS at most
        window = _clean(text[max(0, last_digit - MAX_FALLBACK_CHARS) : last_digit], money=True)
        last = max(_NUMBER.finditer(window), key=re.Match.start, default=None)
        if last is None:
            return None, *where
        sentence = window[_sentence_start(window, last.start()) : last.end()]
        numbers = list(_NUMBER.finditer(sentence))
    if _NO_ANSWER.search(window, last.end()):  # "... so the answer cannot be determined." after the last number
        return None, *where
    return _sentence_answer(sentence, numbers, source), *where


def _sentence_answer(sentence: str, numbers: list[re.Match], source: str) -> str | None:
    """The answer among a sentence's numbers: an equation's result, else the last not restating a given quantity."""
    if len(numbers) <= 1:
        return _normalise(numbers[0]) if numbers else None
    if _RESULT_BEFORE.search(sentence, max(0, numbers[-1].start() - 12), numbers[-1].start()):
        return _normalise(numbers[-1])  # the sentence ends with an equation: "... because 20 - 6 = 14"
    kept = [n for n in numbers if not _is_operand(sentence, n)] or numbers
    clauses = [(c.start(), _clause_end(sentence, c.end())) for c in _CONDITION.finditer(sentence)]
    kept = [
        n
        for n in kept
        if not _in_purpose_clause(sentence, n.start()) and not any(a <= n.start() < b for a, b in clauses)
    ] or kept
    last = kept[-1]
    if len(kept) == 1 or _RESTATED.search(sentence, max(0, last.start() - 30), last.start()):
        return _normalise(last)
    if results := [n for n in kept if _RESULT_BEFORE.search(sentence, max(0, n.start() - 12), n.start())]:
        return _normalise(results[-1])  # "will pay $40 x 6 = $240 for the 6 shirts"
    context, previous = [], False
    for n in kept:  # a number after "and" continues the list before it: "for 3 gallons of milk and 5 boxes"
        before = sentence[max(0, n.start() - 30) : n.start()]
        found = _CONTEXT.search(before)
        if found and found.group().strip() == "for" and "$" in n.group() and not _UNIT_PRICE.match(sentence, n.end()):
            found = None  # "6 shirts for $240": the amount paid, not a condition
        previous = bool(found) or (previous and _AND_BEFORE.search(before) is not None)
        context.append(previous)
    # A restated number ("after 60 days") gives way, unless computed and not a given one ("of the 18 he bought").
    if context[-1] and (_normalise(last) not in _computed(source) or found and found.group("det")):
        earlier = [n for n in kept[:-1] if _normalise(n) in _computed(source)]
        plain = [n for n, c in zip(kept, context, strict=True) if not c]
        last = (earlier or plain or [last])[-1]
    return _normalise(last)


def _clause_end(sentence: str, pos: int) -> int:
    """Where a reason or condition clause ends: at a comma, or at an "=" when no number stands before it."""
    digit = _DIGIT.search(sentence, pos)
    for end in _CLAUSE_END.finditer(sentence, pos):
        if end.group() != "=" or digit is None or digit.start() > end.start():  # "because 12/15=.8" runs on
            return end.start()
    return len(sentence)


def _is_operand(sentence: str, number: re.Match) -> bool:
    """Whether the number is an operand of a sum or a side of a comparison, not a stated result."""
    operand = _OPERAND_TAIL.match(sentence, number.end()) is not None
    return operand or _COMPARED.search(sentence, max(0, number.start() - 8), number.start()) is not None


def _in_purpose_clause(sentence: str, pos: int) -> bool:
    purpose = _PURPOSE.search(sentence, max(0, pos - 60), pos)
    return purpose is not None and not _MODAL_TO.search(sentence, max(0, purpose.start() - 30), purpose.start())


def _rfind_all(text: str, needles: tuple[str, ...]):
    """(position, needle) of the last MAX_MARKERS occurrences of the needles, last first, found with str.rfind."""
    heads = {needle: text.rfind(needle) for needle in needles}
    for _ in range(MAX_MARKERS):
        needle = max(heads, key=heads.__getitem__)
        pos = heads[needle]
        if pos < 0:
            return
        yield pos, needle
        heads[needle] = text.rfind(needle, 0, pos + len(needle) - 1)


def _at_line_start(text: str, pos: int, prefix: re.Pattern) -> bool:
    """Whether only `prefix` (markdown such as '### ' or '**') stands between the start of the line and pos."""
    line_start = text.rfind("\n", max(0, pos - 100), pos) + 1
    return (line_start > 0 or pos <= 100) and prefix.fullmatch(text, line_start, pos) is not None


def _span_after(text: str, pos: int) -> tuple[str, int]:
    """The rest of the line after a marker, or the next line with a letter or digit; and where the one read starts."""
    limit, start = min(len(text), pos + SPAN_CHARS), pos
    while pos < limit:
        newline = text.find("\n", pos, limit)
        line = text[pos : newline if newline >= 0 else limit]
        if _ALNUM.search(line) or newline < 0:
            return line, pos
        pos = newline + 1
    return "", start


def _read_span(span: str, lead: bool = False, single: bool = False, source: str = "") -> tuple[bool, str | None]:
    """(found, the answer or None) of a marker's span: its number first (`lead`), alone (`single`), or a sentence's."""
    span = _clean(span)
    number = _NUMBER.search(span)
    head = 0 if lead or single else _LEAD.match(span).end()
    words = None if lead or single else _WORD_NUMBER.match(span, head)
    first_end = _SENTENCE_END.search(span, head)
    if words is not None and (number is None or (first_end is not None and first_end.end() <= number.start())):
        return True, _word_value(words.group())  # "The answer is eighteen."
    if number is None:  # a number word stated in the first sentence: "Answer: Tom has eighteen pens."
        end = _SENTENCE_END.search(span)
        words = None if lead or single else next(_spelled(span[: end.start() if end else len(span)]), None)
        return words is not None, words and _word_value(words.group())
    if lead and (_HASH_LEAD.fullmatch(span, 0, number.start()) is None or _HEADING_TAIL.match(span, number.end())):
        return False, None
    if single and _NUMBER.search(span, number.end()) is not None:
        return False, None
    if not (lead or single) and number.start() > head:  # a sentence: "After 60 days, she will spend $16"
        boundary = max(_SENTENCE_END.finditer(span, 0, number.start()), key=re.Match.start, default=None)
        start = boundary.end() if boundary else 0
        end = _SENTENCE_END.search(span, number.end())
        # the sentence, or all of the span when an "=" follows: "... = $70. So for five days he earns 5 x 70 = $350."
        sentence = span[start : len(span) if end is None or "=" in span[end.start() :] else end.start()]
        return True, _sentence_answer(sentence, list(_NUMBER.finditer(sentence)), source)
    return True, _stated(span, number)


def _stated(span: str, number: re.Match) -> str | None:
    """The number, or when it starts a sum or an equation, the result stated after the last "=" (else None)."""
    tail = _EXPRESSION_TAIL.match(span, number.end())
    if tail is None and _UNIT_EXPRESSION_TAIL.match(span, number.end()) and "=" in span[number.end() :]:
        tail = True  # "12.8 hectares / (1 - 3/5) = 32 hectares"
    if tail:
        equals = span.rfind("=", number.end())
        number = _NUMBER.search(span, equals + 1) if equals >= 0 else None
        if number is None or _EXPRESSION_TAIL.match(span, number.end()):
            return None  # an expression without its result: never evaluated
    return _normalise(number)


def _word_value(words: str) -> str:
    """The value of a run of number words: "twenty-five" -> "25", "a dozen" -> "12", "one hundred and one" -> "101"."""
    total = current = 0
    for word in re.findall(r"[a-z]+", words.lower()):
        if word in _WORD_VALUES or word in ("a", "an"):
            current += _WORD_VALUES.get(word, 1)  # "a" and "an" are one
        elif word in ("dozen", "hundred"):
            current = max(current, 1) * _WORD_SCALES[word]
        elif word in _WORD_SCALES:
            total, current = total + max(current, 1) * _WORD_SCALES[word], 0
    return str(total + current)


def _clean(text: str, money: bool = False) -> str:
    """Strip LaTeX and markdown around numbers: \\frac{1}{2} -> 0.5, 1,\\!080 -> 1,080, \\$18 -> 18, **18** -> 18."""
    if "\\" in text:
        text = _ESCAPED.sub(r"\1", _replace_fractions(text))
    if "^" in text:
        text = _SCIENTIFIC.sub(_scientific_text, text)
    if "\\" in text:
        text = _APPROX.sub("=", _DIV.sub("/", _TIMES.sub("*", text)))
    if any(sep in text for sep in ("\\", "{,}", "~", "\u00a0", "\u2009", "\u202f")):
        text = _THOUSANDS_SEP.sub(",", text)
    if "\\" in text:
        text = _COMMAND.sub(" ", text)
    if "**" in text:
        text = _POWER.sub("^", text).replace("**", " ")
    return text.translate(_MONEY_CHARS if money else _CHARS)


def _scientific_text(match: re.Match) -> str:
    exponent = int(match.group("exp") or match.group("exp1"))
    return _decimal_text(Decimal(match.group("mantissa")).scaleb(exponent, _CTX))


def _replace_fractions(text: str) -> str:
    """LaTeX fractions as decimals (3/4 -> 0.75, 2\\frac{1}{2} -> 2.5), or as "p/q", an expression, when infinite."""
    parts, done = [], 0
    for frac in _FRAC.finditer(text):
        whole = _WHOLE_BEFORE.search(text, max(done, frac.start() - 40), frac.start())
        head = frac.start() if whole is None else whole.start()
        num, den = int(frac.group("num") or frac.group("num1")), int(frac.group("den") or frac.group("den1"))
        parts += [text[done:head], _fraction_text(int(whole.group().strip()) if whole else 0, num, den)]
        done = frac.end()
    return "".join(parts) + text[done:]


def _fraction_text(whole: int, num: int, den: int) -> str:
    reduced = den // gcd(num, den) if den else 0
    # A finite decimal needs a denominator of 2s and 5s only: one that divides 10**100 (den has at most 30 digits).
    if not reduced or 10**100 % reduced:
        return f"{whole}+{num}/{den}" if whole else f"{num}/{den}"
    return _decimal_text(_CTX.add(Decimal(whole), _CTX.divide(Decimal(num), Decimal(den))))


def _normalise(match: re.Match) -> str | None:
    body = match.group("body").replace(",", "")
    if len(body) > MAX_NUMBER_CHARS:
        return None
    value = Decimal(body)
    if match.group("scale"):
        value = value.scaleb(_SCALES[match.group("scale").lower()], _CTX)
    return _decimal_text(value.copy_negate() if match.group("neg") else value)


def _decimal_text(value: Decimal) -> str:
    return "0" if value.is_zero() else format(value.normalize(_CTX), "f")


def gold_value(gold) -> str | None:
    """A gold answer as a normalised decimal string: a number, or a GSM8K solution ("... #### 1,080"); else None."""
    if isinstance(gold, bool) or not isinstance(gold, Number):
        return extract_answer(gold)  # a GSM8K solution; None for None, a bool or anything unreadable
    try:  # numpy's scalars too: str(np.float64(18.0)) is "18.0", its shortest form, as for a float
        value = Decimal(int(gold)) if isinstance(gold, Integral) else Decimal(str(gold))
    except (InvalidOperation, ValueError):
        return None
    return _decimal_text(value) if value.is_finite() else None


def working_score(text: str) -> float:
    """1.0 for an operation chain with its "= result", 0.5 for an operation alone, 0.0 for none; linear time."""
    if not any(op in text for op in _OP_CHARS):
        return 0.0
    pos, score = 0, 0.0
    while (operation := _OPERATION.search(text, pos)) is not None:
        chain_end = _CHAIN.match(text, operation.end()).end()  # the rest of "3 + 4 * 2", consumed once
        if _RESULT.match(text, chain_end):
            return 1.0
        pos, score = chain_end, 0.5
    return score


def ends_with_hash_line(text: str) -> bool:
    """Whether the last non-blank line of `text` is exactly `#### N`, N a plain number (the asked format)."""
    text = text.rstrip()
    return _HASH_LINE.fullmatch(text[text.rfind("\n") + 1 :]) is not None
