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
#: An experience as a pattern a grammar-constrained server enforces: "When|For|If", a context clause of up to
#: CLAUSE_WORDS words, a comma, a strategy of up to STRATEGY_WORDS words (31 words in all: the seed's 32).
#: llama.cpp turns a pattern into grammar characters without JSON-escaping them (a `.` or `[^,]` lets a raw quote
#: end the string early, and the server then answers HTTP 500 "does not match the expected format"), and it
#: ignores maxLength when a pattern is given: so only characters a JSON string holds as they are, no digits or
#: operators (the seed: no problem-specific constants), and bounded repetitions, which close the string.
WORD_CHARS = 14
CLAUSE_WORDS = 11
STRATEGY_WORDS = 19
_WORD = f"[a-zA-Z][a-zA-Z'/-]{{0,{WORD_CHARS - 1}}}"
EXPERIENCE_CHARS = len("When") + CLAUSE_WORDS * (1 + WORD_CHARS) + len(", ") + STRATEGY_WORDS * (2 + WORD_CHARS)
EXPERIENCE_SCHEMA = {
    "type": "string",
    "maxLength": EXPERIENCE_CHARS,
    "pattern": f"^(When|For|If)( {_WORD}){{1,{CLAUSE_WORDS}}}, {_WORD}([,;]? {_WORD}){{5,{STRATEGY_WORDS - 1}}}[.]?$",
}
#: a final operation's reason: free text (llama.cpp escapes it properly when no pattern is given), bounded
REASON_SCHEMA = {"type": "string", "maxLength": 80}
#: characters of JSON per token that answer budgets assume: SmolLM2's critiques, pretty-printed, came to about
#: 4 (measured); 3 leaves room
CHARS_PER_TOKEN = 3


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


def operations_schema(
    options: Sequence[str],
    most: int,
    ids: Sequence[str],
    *,
    least: int = 0,
    reason: bool = False,
    merge_most: int = 16,
) -> dict[str, Any]:
    """The JSON the critique and consolidation prompts ask for, as a schema that bounds the answer.

    An object at the root, as hosted APIs require (the parser takes a bare array just as well). Each option
    is its own shape with every field it needs required and nothing else allowed, ids are the short ids the
    prompt showed, and every string and list has a bound, so a constrained answer closes before its token
    budget (`answer_tokens`) runs out instead of being cut off. Options that need ids the prompt did not show
    are left out."""
    target = {"type": "string", "enum": list(ids)}
    shapes: dict[str, dict[str, Any]] = {
        "add": {"experience": EXPERIENCE_SCHEMA},
        "modify": {"old_id": target, "experience": EXPERIENCE_SCHEMA},
        "merge": {
            "exp_ids": {
                "type": "array",
                "items": target,
                "minItems": 2,
                "maxItems": min(len(ids), merge_most),
                "uniqueItems": True,
            },
            "experience": EXPERIENCE_SCHEMA,
        },
        "delete": {"exp_id": target},
    }
    usable = [option for option in options if option == "add" or len(ids) >= (2 if option == "merge" else 1)]
    items = []
    for option in usable:
        properties = {"option": {"type": "string", "const": option}, **shapes[option]}
        if reason:
            properties["reason"] = REASON_SCHEMA
        items.append(
            {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
        )
    operations = {"type": "array", "items": {"anyOf": items}, "minItems": min(least, most), "maxItems": most}
    return {
        "type": "object",
        "properties": {"operations": operations},
        "required": ["operations"],
        "additionalProperties": False,
    }


def answer_tokens(schema: dict[str, Any]) -> int:
    """Tokens enough for the longest answer a schema allows, pretty-printed as models write JSON: its
    characters over CHARS_PER_TOKEN, plus a token of line break and indent before each key and item."""
    characters, breaks = _extent(schema)
    return -(-characters // CHARS_PER_TOKEN) + breaks


def answer_chars(schema: dict[str, Any]) -> int:
    """The most characters of an answer of a bounded schema, as compact JSON (strings that need no escapes)."""
    return _extent(schema)[0]


def _extent(schema: dict[str, Any]) -> tuple[int, int]:
    """(most characters of compact JSON, line breaks) of a value of a bounded schema."""
    if "anyOf" in schema:
        return max(_extent(option) for option in schema["anyOf"])
    kind = schema.get("type")
    if kind == "object":
        characters, breaks = 2 + max(0, len(schema["properties"]) - 1), 1
        for key, value in schema["properties"].items():
            inner, inner_breaks = _extent(value)
            characters, breaks = characters + len(json.dumps(key)) + 1 + inner, breaks + 1 + inner_breaks
        return characters, breaks
    if kind == "array":
        inner, inner_breaks = _extent(schema["items"])
        count = schema["maxItems"]
        return 2 + count * (inner + 1), 1 + count * (1 + inner_breaks)
    if "const" in schema:
        return len(json.dumps(schema["const"])), 0
    if "enum" in schema:
        return max(len(json.dumps(value)) for value in schema["enum"]), 0
    return 2 + schema["maxLength"], 0


def fitted_operations_schema(
    options: Sequence[str], most: int, ids: Sequence[str], cap: int | None, **shape: Any
) -> tuple[dict[str, Any], int]:
    """The operations schema with as many operations (up to `most`) as fit in `cap` tokens, and the max_tokens
    that answer needs; at least one operation is asked for whatever the cap (its answer may then be cut)."""
    count = most
    schema = operations_schema(options, count, ids, **shape)
    while count > 1 and cap is not None and answer_tokens(schema) > cap:
        count -= 1
        schema = operations_schema(options, count, ids, **shape)
    needed = answer_tokens(schema)
    return schema, needed if cap is None else min(needed, cap)
