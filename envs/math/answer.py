"""Answer extraction and grading for math tasks.

Grading is symbolic through ``math-verify`` (so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree), with a
fast path first: when gold and prediction are both plain integers/decimals they are compared as
exact decimals, which is what almost every arithmetic and GSM8K answer is. ``math-verify`` costs
about a millisecond or more per call and imports sympy, so the fast path keeps the env cheap on the
CPU path (measure with ``python tests/bench/math_grading.py``).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

#: A plain number: optional sign, digits with optional thousands commas, optional decimals.
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$|^[+-]?\.\d+$")
#: The last number in free text (used when nothing better marks the answer).
_ANY_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:)\s*(.+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+)")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
#: Longest prediction handed to math-verify (off the main thread it runs without a timeout).
MAX_SYMBOLIC_CHARS = 300
#: A short line that reads as an expression rather than prose: at most this many words.
_MAX_BARE_WORDS = 3


@dataclass(frozen=True)
class Extraction:
    """What was taken as the answer, and how it was marked (boxed, answer, hashes, bare, none)."""

    answer: str | None
    style: str


def _boxed_contents(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def _clean(answer: str) -> str:
    """Drop the wrapping that surrounds an answer in prose: $...$, trailing period, spaces."""
    answer = answer.strip().rstrip(".").strip()
    if answer.startswith("$") and answer.endswith("$") and len(answer) >= 2:
        answer = answer.strip("$").strip()
    answer = answer.rstrip(".").strip()
    return answer


def extract_answer(text: str) -> Extraction:
    """The answer stated in ``text``.

    Accepted, in order of precedence: the last ``\\boxed{...}``; the last ``Answer: X`` (also
    "the answer is X", "Final answer: X"); the last ``#### X``; a bare short expression on the last
    line (the tiny built-in policy answers "47-11" with just "36"); else the last number in the text.
    """
    boxed = _boxed_contents(text)
    if boxed is not None:
        return Extraction(boxed, "boxed")
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for pattern, style in ((_ANSWER_LINE, "answer"), (_HASHES, "hashes")):
        for line in reversed(lines):
            matches = list(pattern.finditer(line))
            if matches:
                found = _clean(matches[-1].group(1))
                if found:
                    return Extraction(found, style)
    if not lines:
        return Extraction(None, "none")
    last = _clean(lines[-1])
    if (
        last
        and len(re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", "", last))) <= _MAX_BARE_WORDS
    ):
        if len(last.split()) <= 2 * _MAX_BARE_WORDS:
            return Extraction(last, "bare")
    numbers = _ANY_NUMBER.findall(text)
    if numbers:
        return Extraction(numbers[-1], "last_number")
    return Extraction(None, "none")


def plain_number(text: str) -> Decimal | None:
    """``text`` as an exact decimal if it is a plain number (``1,234``, ``-0.5``), else None."""
    text = text.strip()
    for prefix in ("\\$", "$"):  # currency, as in "$18"
        if text.startswith(prefix) and "$" not in text[len(prefix) :]:
            text = text[len(prefix) :].strip()
    for suffix in ("\\%", "%"):
        text = text.removesuffix(suffix).strip()
    if not _PLAIN_NUMBER.match(text):
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex admits only valid literals
        return None


def _as_latex(expr: str) -> str:
    """math-verify parses LaTeX reliably only inside math delimiters."""
    expr = expr.strip()
    if expr.startswith("$") or expr.startswith("\\(") or expr.startswith("\\["):
        return expr
    return f"${expr}$"


def _timeout() -> int | None:
    """math-verify's timeout uses SIGALRM, which only the main thread may set."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def symbolic_equal(gold: str, pred: str) -> bool:
    """Equivalence by ``math-verify`` (imported here: it pulls in sympy)."""
    from math_verify import parse, verify

    timeout = _timeout()
    gold_parsed = parse(_as_latex(gold), parsing_timeout=timeout)
    pred_parsed = parse(_as_latex(pred), parsing_timeout=timeout)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def answers_match(gold: str, pred: str | None) -> bool:
    """Whether the predicted answer equals the gold one (fast numeric path, then math-verify)."""
    if pred is None or not pred.strip():
        return False
    gold_num, pred_num = plain_number(gold), plain_number(pred)
    if gold_num is not None and pred_num is not None:
        return gold_num == pred_num
    if gold.strip() == pred.strip():
        return True
    if len(pred) > MAX_SYMBOLIC_CHARS:  # no real answer is this long; sympy could take minutes
        return False
    return symbolic_equal(gold, pred)
