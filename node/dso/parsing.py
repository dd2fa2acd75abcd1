"""Model output is untrusted input: find the JSON in it, and check each proposed operation.

What is safe to repair is repaired: JSON inside a code fence, prose before or after it, an object
that wraps the array. Everything else is rejected with a stable reason code, counted by the
caller: an unknown option, an id the prompt never showed, a missing text or target, too many
operations, a text the ledger's own rules refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ledger.cid import CID
from ledger.params import NetworkParams
from ledger.validation import check_text

_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.S)
_ID_KEYS = ("old_id", "exp_id", "id")


class Rejected(Exception):
    """One proposal (or a whole answer) refused; `code` is the counted reason."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def json_value(text: str) -> Any:
    """The first JSON array or object in a model's answer: bare, fenced, or surrounded by prose."""
    text = text.strip()
    candidates = [text, *(block.strip() for block in _FENCE.findall(text))]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for start in (index for index, char in enumerate(candidate) if char in "[{"):
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except ValueError:
                continue
            if isinstance(value, (list, dict)):
                return value
    raise Rejected("parse.no_json", f"no JSON array or object in the answer ({_excerpt(text)})")


def operation_items(text: str) -> list[Any]:
    """The list of proposed operations in an answer: an array, or an object holding one (or being one)."""
    value = json_value(text)
    if isinstance(value, dict):
        if "option" in value:
            return [value]
        lists = [item for item in value.values() if isinstance(item, list)]
        if len(lists) != 1:
            raise Rejected("parse.shape", f"a JSON object without one list of operations ({_excerpt(text)})")
        value = lists[0]
    return list(value)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A checked operation proposed by the model: targets are CIDs the prompt showed."""

    option: str
    text: str | None
    targets: tuple[CID, ...]
    reason: str


class ShortIds:
    """Experiences appear in prompts as `exp_` plus a few characters of their CID; this maps them back."""

    def __init__(self) -> None:
        self._by_short: dict[str, CID] = {}
        self._by_cid: dict[CID, str] = {}

    def name(self, cid: CID) -> str:
        if cid in self._by_cid:
            return self._by_cid[cid]
        text = str(cid)
        for width in range(6, len(text) + 1):
            short = f"exp_{text[-width:]}"
            if short not in self._by_short:
                break
        self._by_short[short], self._by_cid[cid] = cid, short
        return short

    def resolve(self, name: Any) -> CID | None:
        if not isinstance(name, str):
            return None
        name = name.strip().strip("[]").lower()
        if name in self._by_short:
            return self._by_short[name]
        return next((cid for cid in self._by_cid if str(cid) == name), None)  # the full CID also names it


def check_proposal(
    item: Any, options: Collection[str], ids: ShortIds, shown: Collection[CID], params: NetworkParams
) -> Proposal:
    """One proposed operation, checked; raises Rejected with the first reason it cannot be used."""
    if not isinstance(item, Mapping):
        raise Rejected("op.not_object", f"expected a JSON object, got {_excerpt(json.dumps(item))}")
    option = item.get("option")
    option = option.strip().lower() if isinstance(option, str) else option
    if option not in options:
        raise Rejected("op.unknown_option", f"option {option!r} is not one of {', '.join(options)}")
    targets: list[CID] = []
    if option in ("modify", "delete"):
        name = next((item[key] for key in _ID_KEYS if key in item), None)
        if name is None:
            raise Rejected("op.missing_id", f"{option}: names no experience (old_id or exp_id)")
        targets.append(_known(name, ids, shown))
    if option == "merge":
        names = item.get("exp_ids")
        if not isinstance(names, list):
            raise Rejected("op.missing_id", "a merge names no experiences (exp_ids)")
        targets = sorted({_known(name, ids, shown) for name in names}, key=lambda cid: cid.raw)
        if len(targets) < 2:
            raise Rejected("op.merge_targets", "a merge needs two different experiences")
        if len(targets) > params.max_merge_targets:
            raise Rejected("op.merge_targets", f"a merge of more than {params.max_merge_targets} experiences")
    text = None
    if option != "delete":
        text = item.get("experience")
        if not isinstance(text, str) or not text.strip():
            raise Rejected("op.missing_text", f"{option}: no experience text")
        text = " ".join(text.split())
        errors = check_text(text, params, "experience")
        if errors:
            raise Rejected(errors[0].code, f"{errors[0].message} ({_excerpt(text)})")
    reason = item.get("reason")
    reason = " ".join(reason.split())[: params.max_reason_chars] if isinstance(reason, str) else ""
    return Proposal(option, text, tuple(targets), reason)


def _known(name: Any, ids: ShortIds, shown: Collection[CID]) -> CID:
    cid = ids.resolve(name)
    if cid is None or cid not in shown:
        raise Rejected("op.unknown_id", f"{_excerpt(str(name))} is not an experience the prompt showed")
    return cid


def _excerpt(text: str, width: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[: width - 1] + "…")
