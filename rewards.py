"""GSM8K grading and the GRPO reward functions that grpotrainer.py selects by name from `REWARDS`.

The reward is what GRPO optimises, so the grader has to read a right answer as right in every format a model
writes it, and a wrong one as wrong:

    extract_answer(text)        the final number of a completion or a GSM8K gold solution ("1,080" -> "1080")
    answers_match(pred, gold)   equal by value, in exact decimal arithmetic ("18.00" == "18", "18.5" != "18")
    correctness_reward, format_reward, reasoning_reward, math_reward, OverlongReward: TRL reward functions

Where the answer is, in order of precedence (the last occurrence of each wins):
    1. `#### N`, GSM8K's own format and the one the prompt asks for (a markdown heading, `#### Step 2`, is not);
    2. `\\boxed{N}`;
    3. an answer phrase: "the answer is N", "Final answer: N", "Answer: N", "A: N", `<answer>N</answer>`;
    4. the last number in the text.
Text inside a closed `<think>...</think>` block is skipped when text follows the block. An answer that is an
expression (`#### 9*2`) is read as no answer unless it states its result (`9*2 = 18`): model output is never
evaluated. Every scan is linear in the length of the text, and nothing here raises on any text.

Run the examples in the docstrings and the tests:
    python -m pytest tests/test_rewards.py tests/test_rewards_gsm8k.py rewards.py -q
"""

import re
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from math import gcd

# ----------------------------------------------------------------------------------------------------------------
# Limits: they bound the work per completion, so that a 1 MB completion grades in milliseconds
MAX_NUMBER_CHARS = 100  # digits in one number; a longer run of digits is not an answer
SPAN_CHARS = 300  # characters read after an answer marker
MAX_BOX_CHARS = 1000  # characters searched for the closing brace of \boxed{
MAX_MARKERS = 64  # occurrences of one kind of marker tried, from the last, before giving up on that kind
MAX_FALLBACK_CHARS = 65536  # digit-bearing characters read back for the last number before giving up

# Every scan of a whole completion is a str.find/rfind for a literal (C speed); regular expressions only run on
# short spans around what those find, or are built so that each character is visited a bounded number of times.
_CTX = Context(prec=MAX_NUMBER_CHARS + 40)  # exact for every number we accept, scaled by up to 10**12
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_THINK_ENDS = ("</think>", "</thinking>", "</reasoning>")
_DIGITS = "0123456789"

# A number: optional sign and currency, thousands commas, decimals, an optional scale word. The look-behind (a
# number never starts inside a word or after a decimal point) and possessive quantifiers keep it linear.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<neg>-(?=\$?\.?[0-9]))?\$?"
    r"(?P<body>[0-9]{1,3}(?:,[0-9]{3})++(?![0-9])(?:\.[0-9]++)?|[0-9]++(?:\.[0-9]++)?|\.[0-9]++)"
    r"(?:[ \t]*+(?P<scale>(?i:thousand|million|billion|trillion))\b)?"
)
# After a number: an operator and another number (an expression), or "=" (the left side of an equation).
_EXPRESSION_TAIL = re.compile(r"[ \t]*+(?:=|(?:[-+*/^]|[xX](?=[ \t]*+[0-9]))[ \t]*+\(?[ \t]*+-?\$?\.?[0-9])")
_HEADING_TAIL = re.compile(r"[.):][ \t]++[A-Za-z]")  # "#### 2. Add the pens" is a numbered markdown heading
_HASH_LEAD = re.compile(r"[\s*(:=~]*+")  # what may stand between "####" and its number once LaTeX is cleaned
_ALNUM = re.compile(r"[0-9A-Za-z]")

# LaTeX and markdown around a number, removed before reading it.
_FRAC = re.compile(
    r"\\[dt]?frac[ \t]*+(?:\{[ \t]*+(?P<num>-?[0-9]{1,30})[ \t]*+\}|(?P<num1>[0-9]))"
    r"[ \t]*+(?:\{[ \t]*+(?P<den>[0-9]{1,30})[ \t]*+\}|(?P<den1>[0-9]))"
)
_WHOLE_BEFORE = re.compile(r"(?<![0-9.])[0-9]{1,30}[ \t]*+$")  # the 2 of a mixed number, 2\frac{1}{2}
_THOUSANDS_SEP = re.compile(r"(?<=[0-9])(?:\\,|~|[\u00a0\u2009\u202f])(?=[0-9]{3}(?![0-9]))")
_ESCAPED = re.compile(r"\\([$%{}#&_])")
_TIMES = re.compile(r"\\(?:times|cdot|ast)(?![a-zA-Z])")
_DIV = re.compile(r"\\div(?![a-zA-Z])")
_APPROX = re.compile(r"\\(?:approx|simeq|thickapprox)(?![a-zA-Z])")
_COMMAND = re.compile(r"\\(?:[a-zA-Z]++|[,;:! ()\[\]])")
_POWER = re.compile(r"(?<=[0-9])[ \t]*+\*\*[ \t]*+(?=[0-9(])")  # Python's 9**2 is an expression, not bold
_CHARS = str.maketrans(
    "\u2212\u00d7\u00b7\u2217\u00f7\u2248\u00a0\u2009\u202f", "-***/=   ", "${}\u20ac\u00a3\u00a5\u20b9"
)

# Answer markers, each matched where str.rfind found its literal.
_HASH_LINE = re.compile(r"[ \t]*+####[ \t]*+-?(?:[0-9]{1,3}(?:,[0-9]{3})++|[0-9]++)(?:\.[0-9]++)?[ \t]*+")
_BOX_OPEN = re.compile(r"[ \t]{0,8}\{")
_BOX_BARE = re.compile(r"[ \t]{1,8}([^\s$]{1,50})")  # \boxed 18, valid LaTeX without braces
_BRACE = re.compile(r"\\[{}]|[{}]")
_PHRASE_AT = re.compile(
    r"answer(?:[ \t]++(?:to|for|of)\b[^.\n]{0,60}?)?[ \t*_]++"
    r"(?:is|was|would[ \t]+be|should[ \t]+be|will[ \t]+be)\b[ \t*_:]*+"  # the (final) answer is N
    r"|answer(?:[ \t]*+\([^)\n]{0,40}\))?[ \t*_]*+[:=\uff1a]"  # Answer: N, Final answer (in $): N
    r"|answer(?P<heading>[ \t*_:]*+)(?=\r?\n)",  # a "### Final Answer" heading, N on a following line
    re.IGNORECASE,
)
_HEADING_PREFIX = re.compile(r"[ \t#*>_]*+(?:final[ \t]++)?", re.IGNORECASE)
_A_PREFIX = re.compile(r"[ \t*>_]*+")

# Shown working, for reasoning_reward: an operation "36 / 3", then the rest of its chain and an "= result".
_OPS = r"(?:[-+*/^xX\u2212\u00d7\u00f7\u00b7\u2217]|\\(?:times|cdot|div)(?![a-zA-Z]))"
_OPERATION = re.compile(rf"[0-9%][ \t]?+{_OPS}[ \t]?+\(?+[ \t]?+\$?+\.?[0-9]")
_CHAIN = re.compile(r"(?:[-+*/^xX\u2212\u00d7\u00f7\u00b7\u2217 \t0-9.,%$()]++|\\(?:times|cdot|div)(?![a-zA-Z]))*+")
_RESULT = re.compile(r"[ \t]*+\)?[ \t]*+=[ \t]*+(?:<<)?\$?-?\.?[0-9]")  # GSM8K writes "5 x 3 =<<15=15>>15"
_OP_CHARS = "-+*/^xX\\\u2212\u00d7\u00f7\u00b7\u2217"


# ----------------------------------------------------------------------------------------------------------------
# Text in, number out


def completion_to_text(completion) -> str:
    """The text of one completion: a plain string, or chat messages whose assistant content(s) are joined.

    Args:
        completion: a `str`, or a list of `{"role", "content"}` messages (content a string or a list of
            `{"type": "text", "text": ...}` parts). Messages without a role count as the assistant's, as in TRL.

    Returns:
        `str`: the text, `""` for anything else (never raises).

    >>> completion_to_text([{"role": "assistant", "content": "#### 18"}])
    '#### 18'
    >>> completion_to_text([{"role": "tool", "content": "42"}, {"content": [{"type": "text", "text": "18"}]}])
    '18'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, bytes | bytearray):
        return bytes(completion).decode("utf-8", "replace")
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, list | tuple):
        return ""
    parts = []
    for message in completion:
        if isinstance(message, str):
            parts.append(message)
        elif isinstance(message, dict) and message.get("role", "assistant") == "assistant":
            parts.append(_content_text(message.get("content")))
    return "\n".join(part for part in parts if part)


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):  # multimodal parts: keep the text ones
        texts = (part.get("text") for part in content if isinstance(part, dict) and part.get("type", "text") == "text")
        return "\n".join(text for text in texts if isinstance(text, str) and text)
    return ""


def extract_answer(text: str) -> str | None:
    """The final numeric answer of a completion or of a GSM8K gold solution, as a normalised decimal string.

    Normalised: no `$`, thousands commas, units or `%`, no trailing zeros after the point; a leading `-` kept.
    Precedence: the last `#### N`, else the last `\\boxed{N}`, else the last answer phrase, else the last number.
    An expression is not a number: `#### 9*2` gives None, `#### 9*2 = 18` gives "18".

    Args:
        text (`str`): a completion or a gold solution (chat messages are accepted too).

    Returns:
        `str | None`: e.g. "1080", "-3", "18.5"; None when there is no readable answer.

    >>> extract_answer("Tom sells 20 - 5 - 3 = 12 pens at $1.50: 12 * 1.5 = $18.\\n#### 18")
    '18'
    >>> extract_answer("He packs 40 boxes of 27: 40 * 27 = <<40*27=1080>>1080 pens.\\n#### 1,080")
    '1080'
    >>> extract_answer(r"So she pays $\\boxed{\\$18.00}$ in total.")
    '18'
    >>> extract_answer("The temperature dropped by 5, so the answer is -3 degrees.")
    '-3'
    >>> extract_answer("<think>Is it 17? 9 * 2 = 18.</think>The answer is 18.")
    '18'
    >>> extract_answer("#### 9*2") is None
    True
    """
    text = _answer_region(text if isinstance(text, str) else completion_to_text(text))
    for find in (_hash_answer, _boxed_answer, _phrase_answer):
        found, value = find(text)
        if found:
            return value
    return _last_number(text)


def extract_hash_answer(text: str) -> str | None:
    """The number after the last `#### ` (GSM8K's official format), normalised like `extract_answer`; else None.

    `####` followed by words (a markdown heading) or by an expression does not count.

    >>> extract_hash_answer("A third of 36 is 12.\\n#### 12")
    '12'
    >>> extract_hash_answer("#### Final answer\\nThe answer is 12.") is None
    True
    """
    text = _answer_region(text if isinstance(text, str) else completion_to_text(text))
    return _hash_answer(text)[1]


def answers_match(pred: str | None, gold: str | None) -> bool:
    """Whether two answers are the same number, compared with `decimal.Decimal` (exact, no float rounding).

    None, and anything that is not a finite number, never matches.

    >>> answers_match("18", "18.00"), answers_match("1,080", "1080"), answers_match("18.5", "18")
    (True, True, False)
    >>> answers_match(None, None)
    False
    """
    a, b = _to_decimal(pred), _to_decimal(gold)
    return a is not None and b is not None and a == b


def _to_decimal(value) -> Decimal | None:
    if not isinstance(value, str) or len(value) > 4 * MAX_NUMBER_CHARS:
        return None
    try:
        number = Decimal(value.strip().replace(",", "").removeprefix("$"))
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def _answer_region(text: str) -> str:
    """The text after the last closed thinking block, when any text follows it; else the whole text."""
    cut = max((i + len(tag) for tag in _THINK_ENDS if (i := text.rfind(tag)) >= 0), default=0)
    return text[cut:] if cut and not text[cut:].isspace() and len(text) > cut else text


def _hash_answer(text: str) -> tuple[bool, str | None]:
    for tries, (pos, _) in enumerate(_rfind_all(text, ("####",))):
        if tries >= MAX_MARKERS:
            break
        if pos > 0 and text[pos - 1] == "#":  # "#####" is a markdown heading, not the answer marker
            continue
        found, value = _read_span(_span_after(text, pos + 4), lead=True)
        if found:
            return True, value
    return False, None


def _boxed_answer(text: str) -> tuple[bool, str | None]:
    for tries, (pos, marker) in enumerate(_rfind_all(text, ("\\boxed", "\\fbox"))):
        if tries >= MAX_MARKERS:
            break
        content = _box_content(text, pos + len(marker))
        if content is not None:
            found, value = _read_span(content)
            if found:
                return True, value
    return False, None


def _box_content(text: str, pos: int) -> str | None:
    opening = _BOX_OPEN.match(text, pos)
    if opening is None:
        bare = _BOX_BARE.match(text, pos)
        return bare.group(1) if bare else None
    depth, start = 1, opening.end()
    for brace in _BRACE.finditer(text, start, min(len(text), start + MAX_BOX_CHARS)):
        if brace.group() in ("{", "}"):  # \{ and \} are literal braces
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[start : brace.start()]
    return None  # unbalanced within reach: not a box


def _phrase_answer(text: str) -> tuple[bool, str | None]:
    for tries, (pos, marker) in enumerate(_rfind_all(text, ("answer", "Answer", "ANSWER", "A:"))):
        if tries >= MAX_MARKERS:
            break
        if marker == "A:":  # a weak marker (few-shot prompts start whole solutions with it): a line "A: N" only
            if _at_line_start(text, pos, _A_PREFIX):
                found, value = _read_span(_span_after(text, pos + 2), single=True)
                if found:
                    return True, value
            continue
        if pos > 0 and (text[pos - 1].isalnum() or text[pos - 1] == "_"):
            continue
        if pos > 0 and text[pos - 1] == "<" and text.startswith(">", pos + 6):  # <answer>N</answer>
            span = _span_after(text, pos + 7).split("</", 1)[0]
        elif phrase := _PHRASE_AT.match(text, pos):
            if phrase.group("heading") is not None and not _at_line_start(text, pos, _HEADING_PREFIX):
                continue
            span = _span_after(text, phrase.end())
        else:
            continue
        found, value = _read_span(span)
        if found:
            return True, value
    return False, None


def _last_number(text: str) -> str | None:
    """The last number in the text, read in windows from the end that double in size.

    Windows without a digit are skipped at str.find speed; at most MAX_FALLBACK_CHARS characters of windows with
    digits but no number in them ("x2", "v1.3") are read before giving up.
    """
    end, size, budget = len(text), 1024, MAX_FALLBACK_CHARS
    while end > 0 and budget > 0:
        start = max(0, end - min(size, budget))
        if start > 0:  # begin the window after a space, so that it cuts no number in two
            low = max(0, start - 256)
            start = max(text.rfind(" ", low, start), text.rfind("\n", low, start), start - 1) + 1
        if not any(text.find(digit, start, end) >= 0 for digit in _DIGITS):
            end, size = start, size * 2
            continue
        budget -= end - start
        last = None
        for last in _NUMBER.finditer(_clean(text[start:end])):  # noqa: B007 - the last one is wanted
            pass
        if last is None:  # digits, but none of them a number: read further back
            end, size = start, size * 2
        elif last.start() == 0 and start > 0 and not text[start - 1].isspace():
            size *= 2  # the number may begin before the window: read it again in a wider one
        else:
            return _normalise(last)  # None when it is too long to be an answer
    return None


def _rfind_all(text: str, needles: tuple[str, ...]):
    """(position, needle) of every occurrence of the needles, from the last to the first, found with str.rfind."""
    heads = {needle: text.rfind(needle) for needle in needles}
    while True:
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


def _span_after(text: str, pos: int) -> str:
    """The rest of the line after a marker or, when that holds no letter or digit, the next line that does."""
    limit = min(len(text), pos + SPAN_CHARS)
    while pos < limit:
        newline = text.find("\n", pos, limit)
        line = text[pos : newline if newline >= 0 else limit]
        if _ALNUM.search(line) or newline < 0:
            return line
        pos = newline + 1
    return ""


def _read_span(span: str, lead: bool = False, single: bool = False) -> tuple[bool, str | None]:
    """Read the answer after a marker: (whether it holds a number at all, the normalised answer or None).

    lead: the number must come first (after `####`); single: the span must hold exactly one number ("A:").
    A number that starts an expression or an equation is replaced by the result after the last "=", if any.
    """
    span = _clean(span)
    number = _NUMBER.search(span)
    if number is None:
        return False, None
    if lead and (_HASH_LEAD.fullmatch(span, 0, number.start()) is None or _HEADING_TAIL.match(span, number.end())):
        return False, None
    if single and _NUMBER.search(span, number.end()) is not None:
        return False, None
    if _EXPRESSION_TAIL.match(span, number.end()):
        equals = span.rfind("=", number.end())
        number = _NUMBER.search(span, equals + 1) if equals >= 0 else None
        if number is None or _EXPRESSION_TAIL.match(span, number.end()):
            return True, None  # an expression without its result: never evaluated
    return True, _normalise(number)


def _clean(text: str) -> str:
    """Strip LaTeX and markdown around numbers: \\frac{1}{2} -> 0.5, 1{,}080 -> 1,080, \\$18 -> 18, **18** -> 18."""
    if "\\" in text:
        text = _replace_fractions(text)
        text = _ESCAPED.sub(r"\1", text)
        text = _APPROX.sub("=", _DIV.sub("/", _TIMES.sub("*", text)))
    if "{,}" in text:
        text = text.replace("{,}", ",")
    if any(sep in text for sep in ("\\,", "~", "\u00a0", "\u2009", "\u202f")):
        text = _THOUSANDS_SEP.sub(",", text)
    if "\\" in text:
        text = _COMMAND.sub(" ", text)
    if "**" in text:
        text = _POWER.sub("^", text).replace("**", " ")
    return text.translate(_CHARS)


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
    while reduced and reduced % 2 == 0:
        reduced //= 2
    while reduced and reduced % 5 == 0:
        reduced //= 5
    if reduced != 1:  # no finite decimal (or a zero denominator)
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


# ----------------------------------------------------------------------------------------------------------------
# Reward functions: TRL calls them as f(prompts=..., completions=..., completion_ids=..., answer=..., ...)


def _golds(answer, n: int) -> list[str | None]:
    """The gold answers, one per completion, normalised; a missing or unreadable gold is None."""
    if not isinstance(answer, list | tuple):  # one gold for every completion, or None
        answer = [answer] * n
    cache = {}  # a GRPO batch repeats each gold once per generation
    golds = []
    for i in range(n):
        gold = answer[i] if i < len(answer) else None
        if isinstance(gold, str):
            golds.append(cache[gold] if gold in cache else cache.setdefault(gold, _gold_value(gold)))
        else:
            golds.append(_gold_value(gold))
    return golds


def _gold_value(gold) -> str | None:
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, int | float | Decimal):
        try:
            value = Decimal(repr(gold)) if isinstance(gold, float) else Decimal(gold)
        except (InvalidOperation, ValueError):
            return None
        return _decimal_text(value) if value.is_finite() else None
    return extract_answer(gold)


def correctness_reward(completions, answer=None, **kwargs) -> list[float]:
    """1.0 when the completion's final answer equals the gold answer by value, else 0.0.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer (`list[str]`, *optional*): the gold answers, a number ("1080") or a GSM8K solution ("... #### 1,080").
            TRL passes the dataset's `answer` column here. A missing gold scores 0.0.
        **kwargs: the other columns and trainer arguments TRL passes (prompts, completion_ids, trainer_state, ...);
            unused, and there so that any call from GRPOTrainer works.

    Returns:
        `list[float]`: one reward per completion, `float(answers_match(extract_answer(c), extract_answer(gold)))`.

    >>> correctness_reward(["9 * 2 = 18\\n#### 18", "The answer is $18.00.", "#### 17"], answer=["18", "18", "18"])
    [1.0, 1.0, 0.0]
    >>> correctness_reward([[{"role": "assistant", "content": "#### 1080"}]], answer=["... #### 1,080"])
    [1.0]
    """
    completions = list(completions or [])
    golds = _golds(answer, len(completions))
    return [
        float(answers_match(extract_answer(completion_to_text(c)), gold))
        for c, gold in zip(completions, golds, strict=True)
    ]


def format_reward(completions, answer=None, **kwargs) -> list[float]:
    """How well the completion follows the asked format: a last line `#### N`.

    1.0: the last non-blank line is `#### N`, N a plain number (sign, thousands commas and decimals allowed).
    0.5: a `#### N` answer is there but decorated or not last (`#### $18`, `#### 18 pens`, text after it).
    0.0: no `#### N` (a `\\boxed{}` or "The answer is" answer gets nothing here; correctness_reward credits it).

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (the format does not depend on them).
        **kwargs: the other arguments TRL passes (prompts, completion_ids, trainer_state, ...); unused.

    >>> format_reward(["2 + 2 = 4\\n#### 4", "#### 4 apples", "#### 4\\nDone!", "The answer is 4."])
    [1.0, 0.5, 0.5, 0.0]
    """
    rewards = []
    for completion in completions or []:
        text = completion_to_text(completion).rstrip()
        last_line = text[text.rfind("\n") + 1 :]
        if _HASH_LINE.fullmatch(last_line):
            rewards.append(1.0)
        else:
            rewards.append(0.5 if extract_hash_answer(text) is not None else 0.0)
    return rewards


def reasoning_reward(completions, answer=None, **kwargs) -> list[float]:
    """Whether the completion shows its working: arithmetic on numbers, and equations with their results.

    1.0: an equation with a result, `36 / 3 = 12`, `(3 + 4) x 2 = 14`, `12 \\times 2 = 24`, `<<36/3=12>>`.
    0.5: arithmetic without a stated result, `36 / 3`.
    0.0: neither (a bare answer). The check reads the whole completion, thinking included.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer: the gold answers; unused (shown working does not depend on them).
        **kwargs: the other arguments TRL passes (prompts, completion_ids, trainer_state, ...); unused.

    >>> reasoning_reward(["He sells 20 - 5 - 3 = 12 pens.", "A third of them, 36 / 3, are blue.", "#### 12"])
    [1.0, 0.5, 0.0]
    """
    rewards = []
    for completion in completions or []:
        text = completion_to_text(completion)
        rewards.append(_working_score(text))
    return rewards


def math_reward(completions, answer=None, **kwargs) -> list[float]:
    """The GSM8K tutorial's combined reward, made whole: partial credit that sums to 1.0 for a right, shown answer.

    0.2 for a `#### N` answer, + 0.2 for shown arithmetic (reasoning_reward > 0), + 0.2 for a readable answer
    (`extract_answer` is not None), + 0.4 when that answer is right. A missing gold scores 0.0 for the item.

    Args:
        completions (`list[str]` or `list[list[dict]]`): plain or chat completions.
        answer (`list[str]`, *optional*): the gold answers, as for correctness_reward.
        **kwargs: the other arguments TRL passes; unused.

    >>> math_reward(["36 / 3 = 12\\n#### 12", "36 / 3 = 12\\n#### 13", "The answer is 12.", "12"], answer=["12"] * 4)
    [1.0, 0.6, 0.6, 0.6]
    """
    completions = list(completions or [])
    golds = _golds(answer, len(completions))
    rewards = []
    for completion, gold in zip(completions, golds, strict=True):
        if gold is None:
            rewards.append(0.0)
            continue
        text = completion_to_text(completion)
        pred = extract_answer(text)
        tenths = (
            2 * (extract_hash_answer(text) is not None)
            + 2 * (_working_score(text) > 0)
            + 2 * (pred is not None)
            + 4 * answers_match(pred, gold)
        )
        rewards.append(tenths / 10)
    return rewards


def _working_score(text: str) -> float:
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


class OverlongReward:
    """DAPO's soft overlong punishment: 0 up to `max - soft_cache` tokens, then down linearly to -1 at `max`.

    A thin, picklable wrapper around TRL's `get_soft_overlong_punishment` (imported when first called, so that
    `import rewards` stays light). It reads the token counts from the `completion_ids` TRL passes; called without
    them it returns 0.0 for every completion.

    R(y) = 0 for |y| <= L - C;  (L - C - |y|) / C for L - C < |y| <= L;  -1 for |y| > L,
    with L = max_completion_length and C = soft_cache.

    Args:
        max_completion_length (`int`): GRPOConfig's max_completion_length, in tokens.
        soft_cache (`int`, *optional*): the length of the penalised band; defaults to a quarter of
            max_completion_length.

    >>> reward = OverlongReward(max_completion_length=100)  # soft_cache = 25: the penalty starts after 75 tokens
    >>> reward(completions=["a", "b", "c"], completion_ids=[[1] * 50, [1] * 90, [1] * 100])
    [0.0, -0.6, -1.0]
    >>> reward.__name__
    'overlong_reward'
    """

    __name__ = "overlong_reward"  # TRL logs it as rewards/overlong_reward/mean

    def __init__(self, max_completion_length: int, soft_cache: int | None = None):
        if not _is_int(max_completion_length) or max_completion_length < 1:
            raise ValueError(f"max_completion_length must be a positive int, got {max_completion_length!r}")
        soft_cache = max_completion_length // 4 if soft_cache is None else soft_cache
        if not _is_int(soft_cache) or not 0 <= soft_cache <= max_completion_length:
            raise ValueError(f"soft_cache must be an int in [0, {max_completion_length}], got {soft_cache!r}")
        self.max_completion_length = max_completion_length
        self.soft_cache = soft_cache

    def __call__(self, completions=None, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            return [0.0] * len(completions or [])
        from trl.rewards import get_soft_overlong_punishment

        punish = get_soft_overlong_punishment(self.max_completion_length, self.soft_cache)
        return [float(r) for r in punish(list(completion_ids))]

    def __repr__(self) -> str:
        return f"OverlongReward(max_completion_length={self.max_completion_length}, soft_cache={self.soft_cache})"


def load(names, max_completion_length, enable_thinking=False) -> list[Callable]:
    """Reward callables for REWARD_FUNCS entries: registry names or "module:function" strings.

    A class (a registry entry or a user's) is built with the run's `max_completion_length` and `enable_thinking`,
    where its __init__ takes them. A module that fails to import is reported as a ConfigError naming the entry.
    """
    import importlib
    import inspect

    from cli import ConfigError

    funcs = []
    for name in names:
        if name in REWARDS:
            func = REWARDS[name]
        else:  # "module:function" (preflight has already rejected unknown plain names)
            module, _, attr = name.partition(":")
            try:
                func = getattr(importlib.import_module(module), attr)
            except Exception as err:  # a user's module can fail to import in any way
                raise ConfigError(
                    f"REWARD_FUNCS entry {name!r} cannot be imported: {type(err).__name__}: {err}"
                ) from None
        if isinstance(func, type):
            run = {"max_completion_length": max_completion_length, "enable_thinking": enable_thinking}
            accepted = inspect.signature(func).parameters
            func = func(**{key: value for key, value in run.items() if key in accepted})
        funcs.append(func)
    return funcs


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Name -> reward. grpotrainer.py instantiates classes with max_completion_length=<its config value>.
REWARDS: dict[str, Callable] = {
    "correctness_reward": correctness_reward,
    "format_reward": format_reward,
    "reasoning_reward": reasoning_reward,
    "math_reward": math_reward,
    "overlong_reward": OverlongReward,
}
