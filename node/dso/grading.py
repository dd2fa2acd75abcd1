"""Grading a rollout against its ground truth: exact match and numeric match built in, any other pluggable.

A grader is a function `(response, answer) -> bool`; `--grader module:function` loads another.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from fractions import Fraction

from ledger.errors import LedgerError

Grader = Callable[[str, str], bool]

_ANSWER_LINE = re.compile(r"(?:final\s+)?answer\s*(?:is)?\s*[:=]?\s*(.+)", re.I)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
RELATIVE_TOLERANCE = Fraction(1, 10**6)


class GraderError(LedgerError):
    """A --grader that cannot be loaded."""


def final_answer(response: str) -> str:
    """What a response gives as its answer: its last 'Answer: …' line, else its last \\boxed{…}, else its last
    number, else its last line."""
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        found = _ANSWER_LINE.search(line)
        if found and found.group(1).strip():
            return found.group(1).strip()
    boxed = _BOXED.findall(response)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(response)
    if numbers:
        return numbers[-1]
    return lines[-1] if lines else ""


def _normal(text: str) -> str:
    text = _BOXED.sub(r"\1", text).strip().strip("$").strip()
    return " ".join(text.rstrip(".").lower().split())


def _number(text: str) -> Fraction | None:
    found = _NUMBER.fullmatch(_normal(text).replace(" ", ""))
    if not found:
        return None
    try:
        return Fraction(found.group().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def exact_match(response: str, answer: str) -> bool:
    return _normal(final_answer(response)) == _normal(answer)


def numeric_match(response: str, answer: str) -> bool:
    """Both are numbers (integers, decimals, fractions, with thousands separators) and equal within 10^-6."""
    given, expected = _number(final_answer(response)), _number(answer)
    if given is None or expected is None:
        return False
    return abs(given - expected) <= RELATIVE_TOLERANCE * max(1, abs(expected))


def default_grader(response: str, answer: str) -> bool:
    return exact_match(response, answer) or numeric_match(response, answer)


def load_grader(spec: str | None) -> Grader:
    """The default grader, or `module:function` imported from the Python path."""
    if not spec:
        return default_grader
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise GraderError("grader.spec", f"--grader {spec!r}: expected module:function")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise GraderError("grader.load", f"--grader {spec!r}: cannot load it ({exc})") from None
    if not callable(function):
        raise GraderError("grader.load", f"--grader {spec!r}: is not callable")
    return function
