"""Typed records of the node's derived state: what the fold made of operations and experiences.

Each record has one compact stored form (`pack`/`unpack`, local state only) and a JSON form for
people and the RPC. Statuses are enums, so a misspelt status is an error, not a silent mismatch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ledger import codec
from ledger.cid import CID

#: a record keeps up to this many ids in its list of absorbed experiences, and in its list of deletes, itself. A
#: longer list is kept beside it, one key per id (the U table), and the record holds the list's SHA-256 in its place
#: (`list_digest`): a popular experience absorbs thousands of copies and hundreds of deletes name it, and rewriting
#: its whole lists whenever a batch changed it was a ninth of the bytes written at 1M operations, which LevelDB's
#: compaction writes again and again.
INLINE_LIST = 32
#: the lists a record may keep outside it: the byte that tags each in the U table, its field's position, its name
_LONG_LISTS = ((b"a", 9, "absorbed"), (b"d", 10, "deleted_by"))


class Life(StrEnum):
    """Where an experience stands in the library."""

    LIVE = "live"
    DELETED = "deleted"  # final: delete beats modify
    ALIAS = "alias"  # merged or absorbed into `alias_of`


class Outcome(StrEnum):
    """What the fold made of one operation (docs/PROTOCOL.md §7.4), or why it has not folded it yet."""

    APPLIED = "applied"
    ABSORBED = "absorbed"  # a near-duplicate add, absorbed into an earlier experience
    VOID = "void"  # changes nothing; `code` says which rule
    SUPERSEDED = "superseded"  # an applied modify whose version is no longer visible (`code` says why)
    PENDING = "pending"  # stored, waiting for dependencies this node does not hold yet


@dataclass(frozen=True, slots=True)
class OpStatus:
    """The fold's verdict on one operation."""

    outcome: Outcome
    experience: CID | None = None  # applied: the experience it acted on (or created)
    into: CID | None = None  # absorbed: the experience that absorbed it
    code: str | None = None  # void, superseded: the rule
    reason: str | None = None  # void, superseded: the rule in words
    waiting_for: tuple[CID, ...] = ()  # pending: the dependencies still missing

    @classmethod
    def applied(cls, experience: bytes) -> OpStatus:
        return cls(Outcome.APPLIED, experience=CID(experience))

    @classmethod
    def void(cls, code: str, reason: str) -> OpStatus:
        return cls(Outcome.VOID, code=code, reason=reason)

    def pack(self) -> bytes:
        return codec.pack([self.outcome.value, self.experience, self.into, self.code, self.reason])

    @classmethod
    def unpack(cls, raw: bytes) -> OpStatus:
        outcome, experience, into, code, reason = codec.unpack(raw)
        return cls(Outcome(outcome), experience, into, code, reason)

    def to_json(self) -> dict[str, Any]:
        view: dict[str, Any] = {"outcome": self.outcome.value}
        for name in ("experience", "into"):
            if (value := getattr(self, name)) is not None:
                view[name] = str(value)
        if self.code is not None:
            view["code"], view["reason"] = self.code, self.reason
        if self.outcome is Outcome.PENDING:
            view["waiting_for"] = [str(cid) for cid in self.waiting_for]
        return view


@dataclass(slots=True)
class ExperienceRecord:
    """One experience as the fold keeps it (docs/PROTOCOL.md §7.3). Mutable: the fold edits a copy."""

    id: CID
    created_by: str
    clock: int  # the creating operation's clock: absorption prefers the earliest experience
    status: Life
    alias_of: CID | None
    version: CID  # the operation whose content is visible
    heads: list[CID]  # the current concurrent modifies; two or more: conflicted
    domain: str  # of the visible version
    support: int
    absorbed: list[CID] = field(default_factory=list)
    deleted_by: list[CID] = field(default_factory=list)
    up: int = 0
    down: int = 0

    @property
    def live(self) -> bool:
        return self.status is Life.LIVE

    @property
    def conflicted(self) -> bool:
        return len(self.heads) > 1

    def copy(self) -> ExperienceRecord:
        return ExperienceRecord(
            self.id,
            self.created_by,
            self.clock,
            self.status,
            self.alias_of,
            self.version,
            list(self.heads),
            self.domain,
            self.support,
            list(self.absorbed),
            list(self.deleted_by),
            self.up,
            self.down,
        )

    def pack(self) -> bytes:
        """`codec.pack` of the record's fields as a list, assembled field by field (byte for byte the same)."""
        scalar, link, links = codec.pack, codec.pack_link, codec.pack_links
        return codec.pack_array(
            [
                link(self.id),
                scalar(self.created_by),
                scalar(self.clock),
                scalar(self.status.value),
                link(self.alias_of),
                link(self.version),
                links(self.heads),
                scalar(self.domain),
                scalar(self.support),
                links(self.absorbed) if len(self.absorbed) <= INLINE_LIST else scalar(list_digest(self.absorbed)),
                links(self.deleted_by) if len(self.deleted_by) <= INLINE_LIST else scalar(list_digest(self.deleted_by)),
                scalar(self.up),
                scalar(self.down),
            ]
        )

    @property
    def lists_outside(self) -> bool:
        """Whether the stored record keeps a list outside it (in the U table)."""
        return len(self.absorbed) > INLINE_LIST or len(self.deleted_by) > INLINE_LIST

    def outside(self) -> set[bytes]:
        """The U table's entries of the lists the stored record keeps outside it: a list's tag byte, then an id."""
        return {
            tag + cid.raw
            for tag, _, name in _LONG_LISTS
            if len(ids := getattr(self, name)) > INLINE_LIST
            for cid in ids
        }

    @classmethod
    def unpack(cls, raw: bytes, listed: Callable[[CID, bytes, bytes], list[CID]] | None = None) -> ExperienceRecord:
        """The record `pack` wrote. `listed(id, tag, digest)` gives a list the record keeps outside it (the U table;
        it must check the digest); without it, only a record that keeps its lists in it can be unpacked."""
        fields = codec.unpack(raw)
        fields[3] = Life(fields[3])
        for tag, index, name in _LONG_LISTS:
            if type(fields[index]) is bytes:
                if listed is None:
                    raise ValueError(f"record {fields[0]}: its {name} list is kept outside it")
                fields[index] = listed(fields[0], tag, fields[index])
        return cls(*fields)

    @staticmethod
    def realiased(raw: bytes, old: bytes, new: bytes) -> bytes:
        """The packed record of an alias of `old`, made an alias of `new`, without decoding it: an alias's only link
        other than its own id and version is `alias_of` (it has no heads, absorbed adds or deletes), and a CID's
        encoding cannot occur inside a text (its tag's first byte is not valid UTF-8 there)."""
        was, now = codec.pack(CID(old)), codec.pack(CID(new))
        if len(was) != len(now) or raw.count(was) != 1:
            record = ExperienceRecord.unpack(raw)
            assert record.alias_of == CID(old), "an alias of the old add"
            record.alias_of = CID(new)
            return record.pack()
        return raw.replace(was, now)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "status": self.status.value,
            "alias_of": str(self.alias_of) if self.alias_of else None,
            "version": str(self.version),
            "heads": [str(head) for head in self.heads],
            "conflicted": self.conflicted,
            "domain": self.domain,
            "support": self.support,
            "absorbed": [str(cid) for cid in self.absorbed],
            "deleted_by": [str(cid) for cid in self.deleted_by],
            "created_by": self.created_by,
            "clock": self.clock,
            "votes": {"upvotes": self.up, "downvotes": self.down},
        }


def list_digest(cids: list[CID]) -> bytes:
    """What a record holds for a list kept outside it: the SHA-256 of its binary CIDs, in order."""
    return hashlib.sha256(b"".join([cid.raw for cid in cids])).digest()


@dataclass(frozen=True, slots=True)
class Vote:
    """The vote of one author that counts for one experience: the latest by (clock, CID)."""

    clock: int
    cid: CID
    value: int

    def pack(self) -> bytes:
        return codec.pack([self.clock, self.cid, self.value])

    @classmethod
    def unpack(cls, raw: bytes) -> Vote:
        return cls(*codec.unpack(raw))

    def later_than(self, other: Vote) -> bool:
        return (self.clock, self.cid.raw) > (other.clock, other.cid.raw)
