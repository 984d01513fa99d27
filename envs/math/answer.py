"""Answer extraction and grading for math tasks.

Grading is symbolic through ``math-verify`` (so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree), with a
fast path first: when gold and prediction are both plain integers/decimals they are compared as
exact decimals, which is what almost every arithmetic and GSM8K answer is. ``math-verify`` costs
about a millisecond or more per call and imports sympy, so the fast path keeps the env cheap on the
CPU path (measure with ``python bench/math_grading.py``).
"""

from __future__ import annotations

import ctypes
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
#: Longest prediction handed to math-verify (longer ones are never real answers).
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


#: Seconds one math-verify ``parse`` or ``verify`` may take before the answer counts as wrong.
SYMBOLIC_TIMEOUT_S = 5.0


class _Watchdog:
    """Raises math-verify's ``TimeoutException`` in one thread after ``seconds``, and again every
    ``refire_s`` until the guarded block exits.

    Why: math-verify bounds sympy with ``signal.alarm``, which only the main thread may use, so
    off the main thread (a rollout node steps envs in worker threads) it must run with its own
    timeout off. sympy is pure Python, so an asynchronous exception
    (``PyThreadState_SetAsyncExc``) stops it at the next bytecode boundary, exactly where a
    SIGALRM handler would have raised; math-verify catches its ``TimeoutException`` (a
    ``BaseException``, so sympy's ``except Exception`` blocks let it through) and reports "no
    match". One delivery is not enough: when the bytecode boundary happens to be inside a
    weakref callback or a ``__del__`` (sympy's caches drop objects all the time), Python prints
    "Exception ignored" and the computation goes on unbounded, so the watchdog fires again until
    the block has exited. Like the signal, it cannot interrupt one long C call (a huge integer power).
    """

    def __init__(self, seconds: float, exc: type[BaseException], refire_s: float = 0.05):
        self.ident = threading.get_ident()
        self.exc = exc
        self.seconds = seconds
        self.refire_s = refire_s
        self.fired = False
        self._armed = True
        self._lock = threading.Lock()
        self._exited = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="math-verify-watchdog", daemon=True
        )

    def _watch(self) -> None:
        wait = self.seconds
        while not self._exited.wait(wait):
            with self._lock:
                if not self._armed:
                    return
                self.fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.ident), ctypes.py_object(self.exc)
                )
            wait = self.refire_s

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            self._armed = False
            fired = self.fired
        self._exited.set()
        if fired:  # delivered already (and caught), or still pending: clear a pending one
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), None)


def _bounded(fn, *args, **kwargs):
    """``fn(*args, timeout=...)`` bounded by ``SYMBOLIC_TIMEOUT_S`` on any thread; None when cut."""
    from math_verify.errors import TimeoutException

    if threading.current_thread() is threading.main_thread():
        # math-verify's own SIGALRM timeout (whole seconds)
        return fn(*args, **kwargs, timeout=max(1, round(SYMBOLIC_TIMEOUT_S)))
    _quiet_timeout_warning()
    try:
        with _Watchdog(SYMBOLIC_TIMEOUT_S, TimeoutException):
            return fn(*args, **kwargs, timeout=None)
    except TimeoutException:
        return None


def _quiet_timeout_warning() -> None:
    """math-verify warns once that "timeout is disabled" when called with None; here it is not
    disabled (the watchdog bounds the call), so the warning would only mislead."""
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


def _parse(expr: str, timeout: int | None):
    from math_verify import parse

    return parse(_as_latex(expr), parsing_timeout=timeout)


def _verify(gold, pred, timeout: int | None) -> bool:
    from math_verify import verify

    return bool(verify(gold, pred, timeout_seconds=timeout))


def symbolic_equal(gold: str, pred: str) -> bool:
    """Equivalence by ``math-verify`` (imported lazily: it pulls in sympy), each parse and the
    comparison bounded by ``SYMBOLIC_TIMEOUT_S`` on the main thread and in worker threads alike."""
    gold_parsed = _bounded(_parse, gold)
    pred_parsed = _bounded(_parse, pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(_bounded(_verify, gold_parsed, pred_parsed))


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
