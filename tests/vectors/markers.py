"""The JSON form of DAG-CBOR values that tests/vectors/reference/generate.mjs reads.

CIDs are {"/": "bafy…"}, bytes {"/": {"bytes": base64}}, floats {"/float": x} (JS cannot tell 1.0 from 1).
"""

from __future__ import annotations

import base64
from typing import Any

from ledger.cid import CID


def to_marked(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: to_marked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_marked(item) for item in value]
    if isinstance(value, CID):
        return {"/": str(value)}
    if isinstance(value, bytes):
        return {"/": {"bytes": base64.b64encode(value).decode().rstrip("=")}}
    if isinstance(value, float):
        return {"/float": value}
    return value


def from_marked(value: Any) -> Any:
    if isinstance(value, list):
        return [from_marked(item) for item in value]
    if not isinstance(value, dict):
        return value
    if value.keys() == {"/float"}:
        return float(value["/float"])
    if value.keys() == {"/"}:
        link = value["/"]
        if isinstance(link, str):
            return CID.parse(link)
        encoded = link["bytes"]
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4))
    return {key: from_marked(item) for key, item in value.items()}
