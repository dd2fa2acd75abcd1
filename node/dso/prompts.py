"""The prompt-templates seed's three prompts, verbatim (templates/*.txt), with their placeholders filled.

The templates hold JSON examples with braces, so placeholders are replaced by name, not with
str.format; a template whose placeholder was not filled is a bug, caught before any call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

#: stage 2's placeholder for the G summaries: the first, an ellipsis line, the last
SUMMARIES_BLOCK = "{summary_1}\n...\n{summary_G}"
PLACEHOLDERS = {
    "summarize": ("{experience_library}", "{query}", "{full_trajectory}", "{correct/wrong}", "{answer}"),
    "critique": ("{query}", "{answer}", "{experience_library}", SUMMARIES_BLOCK),
    "consolidate": ("{experience_library}", "{all_group_operations}"),
}
_LEFT_OVER = re.compile(
    r"\{(experience_library|query|full_trajectory|correct/wrong|answer|summary_\w+|all_group_\w+)\}"
)
EMPTY_LIBRARY = "(none yet)"
#: what the policy model is told besides the context template, so its final answer can be graded
ANSWER_INSTRUCTION = "Solve the problem step by step. End with a last line of the form 'Answer: <final answer>'."
#: the experience field: at most one sentence opening with a context clause (the ledger checks the rest)
EXPERIENCE_SCHEMA = {"type": "string", "minLength": 10, "maxLength": 300, "pattern": "^(When|For|If) [^,]+, .+$"}


@cache
def template(name: str) -> str:
    return resources.files("node.dso").joinpath("templates", f"{name}.txt").read_text(encoding="utf-8")


def fill(name: str, values: Mapping[str, str]) -> str:
    """The named template with each placeholder replaced by its value; every placeholder must be given."""
    text = template(name)
    missing = set(PLACEHOLDERS[name]) - set(values)
    if missing:
        raise ValueError(f"{name}: no value for {sorted(missing)}")
    for placeholder in PLACEHOLDERS[name]:
        if placeholder not in text:
            raise ValueError(f"{name}: the template has no {placeholder}")
    # one pass over the template: a value that happens to contain "{query}" is not filled again
    pattern = re.compile("|".join(re.escape(placeholder) for placeholder in PLACEHOLDERS[name]))
    return pattern.sub(lambda match: values[match.group()], text)


def unfilled(prompt: str) -> list[str]:
    """Placeholders of the templates still present in a prompt (none, in a prompt that was sent)."""
    return _LEFT_OVER.findall(prompt)


@dataclass(frozen=True, slots=True)
class Shown:
    """An experience as a prompt shows it: under a short id that maps back to its CID."""

    short_id: str
    text: str


def library_block(shown: Sequence[Shown]) -> str:
    return "\n".join(f"[{item.short_id}] {item.text}" for item in shown) or EMPTY_LIBRARY


def summarize(shown: Sequence[Shown], query: str, trajectory: str, correct: bool, answer: str) -> str:
    return fill(
        "summarize",
        {
            "{experience_library}": library_block(shown),
            "{query}": query,
            "{full_trajectory}": trajectory,
            "{correct/wrong}": "correct" if correct else "wrong",
            "{answer}": answer,
        },
    )


def critique(query: str, answer: str, shown: Sequence[Shown], summaries: Sequence[tuple[str, bool]]) -> str:
    block = "\n\n".join(
        f"Trajectory {index} ({'correct' if correct else 'wrong'}):\n{summary.strip()}"
        for index, (summary, correct) in enumerate(summaries, 1)
    )
    return fill(
        "critique",
        {"{query}": query, "{answer}": answer, "{experience_library}": library_block(shown), SUMMARIES_BLOCK: block},
    )


def consolidate(shown: Sequence[Shown], group_operations: Sequence[tuple[int, list[dict[str, Any]]]]) -> str:
    block = "\n".join(
        f"Group {group}: {json.dumps(operations, ensure_ascii=False)}" for group, operations in group_operations
    )
    return fill("consolidate", {"{experience_library}": library_block(shown), "{all_group_operations}": block})


def operations_schema(options: Sequence[str], most: int) -> dict[str, Any]:
    """The JSON the critique and consolidation prompts ask for, as a schema (an object at the root, as
    hosted APIs require; the parser takes a bare array just as well)."""
    item = {
        "type": "object",
        "properties": {
            "option": {"type": "string", "enum": list(options)},
            "experience": EXPERIENCE_SCHEMA,
            "old_id": {"type": "string"},
            "exp_id": {"type": "string"},
            "exp_ids": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
            "reason": {"type": "string", "maxLength": 300},
        },
        "required": ["option"],
    }
    return {
        "type": "object",
        "properties": {"operations": {"type": "array", "items": item, "maxItems": most}},
        "required": ["operations"],
    }
