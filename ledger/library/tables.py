"""The library's tables, the kinds of operation as the fold stores them, and the records it builds (PROTOCOL §7.3).

Rule: an experience's record holds what §7.3 lists (status, alias_of, version, heads, domain, support, absorbed,
deleted_by, up, down, created_by, clock); resolving an id follows alias_of. A verdict names the rule that decided
it (§7.4's void codes).
Invariant: the keys and bytes the fold writes are the on-disk format (docs/ARCHITECTURE.md, "Who owns what"): a data
directory an earlier version wrote opens as it is, or through an upgrade at open (`upgrades`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from ledger.cid import CID
from ledger.ops import Kind, Operation
from ledger.records import ExperienceRecord, Life, OpStatus, list_digest
from ledger.store import ReadView, StoreError
from ledger.tables import (
    ABSORBS,
    BUCKET,
    BY_DOMAIN,
    BY_TARGET,
    COMPONENT,
    COMPONENT_OP,
    COMPONENT_SIZE,
    COUNTED,
    EXPERIENCE,
    LISTED,
    MEMBER,
    ORDER,
    STATUS,
    VOTES,
    listed_prefix,
    parse_listed_key,
)

_KINDS = list(Kind)
_KIND_INDEX = {kind: index for index, kind in enumerate(_KINDS)}
_KIND_BYTE = {kind: bytes([index]) for index, kind in enumerate(_KINDS)}
#: the kinds of operation that act on an experience, and of those the modifies (`Library._applied_to`)
_ACTS_ON = frozenset({_KIND_BYTE[Kind.MODIFY], _KIND_BYTE[Kind.DELETE]})
_MODIFIES = frozenset({_KIND_BYTE[Kind.MODIFY]})
#: the operations acting on an experience are read from those naming its adds unless it has more adds than the
#: component has experiences over this (then from the component's list of operations): at 100k operations, ~20 µs
#: per add against ~2.5 µs per experience of the component. Read through this module (`tables._READ_BY_NAME`): the
#: property tests set it to 0, to read by name whatever the component's size
_READ_BY_NAME = 8
#: sorts after every order (u64 clock, CID)
_LAST_ORDER = b"\xff" * 9
#: sorts before every order: an undo before a batch's new operations are folded has every late add of it pending
_FIRST_ORDER = b""
#: the tables the fold writes; a rebuild clears them
TABLES = (EXPERIENCE, BY_DOMAIN, STATUS, ORDER, BY_TARGET, VOTES, COUNTED, COMPONENT, MEMBER, COMPONENT_OP,
          COMPONENT_SIZE, ABSORBS, BUCKET, LISTED)  # fmt: skip
#: the verdicts of a merge that one more concurrent modify or delete of a source can reword but not reverse (§7.4)
_REWORDABLE = frozenset({"merge.concurrent_delete", "merge.concurrent_modify", "merge.target_deleted"})
#: the verdicts of a merge that no record can change: §7.4 reads the whole set of operations for them
_CONCURRENTLY_VOID = frozenset({"merge.concurrent_delete", "merge.concurrent_modify"})
_TARGET_DELETED, _NOT_EXPERIENCE = "merge.target_deleted", "target.not_experience"


def _listed_in(view: ReadView) -> Callable[[CID, bytes, bytes], list[CID]]:
    """What `ExperienceRecord.unpack` calls for a list kept in the U table: it reads the list, in CID order (the
    order of the record's lists), and checks it against the digest the record holds."""

    def listed(exp_id: CID, tag: bytes, digest: bytes) -> list[CID]:
        cids = [CID(parse_listed_key(key)) for key, _ in view.scan(listed_prefix(exp_id.raw, tag))]
        if list_digest(cids) != digest:
            raise StoreError(
                "store.corrupt", f"experience {exp_id}: the {len(cids)} ids listed for it ({tag!r}) are not its own"
            )
        return cids

    return listed


def _sorted_cids(raws: Iterable[bytes]) -> list[CID]:
    return [CID(raw) for raw in sorted(set(raws))]


def _insert_cid(cids: list[CID], raw: bytes) -> None:
    """Add `raw` to a list of CIDs sorted by binary CID, unless it is there (a popular experience's
    `absorbed` list is long: rebuilding it for each absorption cost time growing with the ledger)."""
    at = bisect.bisect_left(cids, raw, key=_raw)
    if at == len(cids) or cids[at].raw != raw:
        cids.insert(at, CID(raw))


def _raw(cid: CID) -> bytes:
    return cid.raw


def _target_deleted() -> OpStatus:
    return OpStatus.void("merge.target_deleted", "a source was deleted before the merge")


def _superseded_by_delete() -> OpStatus:
    return OpStatus.void("superseded.deleted", "its experience was deleted (delete beats modify)")


def _not_experience(target: bytes) -> OpStatus:
    return OpStatus.void("target.not_experience", f"target {CID(target)} did not create an experience")


def _alias(cid: bytes, op: Operation, into: bytes) -> ExperienceRecord:
    """The record of an add absorbed into the add `into`."""
    record = _new_record(cid, op, support=1)
    record.status, record.alias_of = Life.ALIAS, CID(into)
    return record


def _written_by_alias(record: ExperienceRecord | None, cid: bytes, into: bytes) -> bool:
    """Whether an add's record is what `_alias(cid, op, into)` writes (its author, clock and domain are the add's)."""
    return (
        record is not None
        and record.status is Life.ALIAS
        and record.alias_of == CID(into)
        and (record.version.raw, record.support, record.up, record.down) == (cid, 1, 0, 0)
        and not (record.heads or record.absorbed or record.deleted_by)
    )


def _new_record(cid: bytes, op: Operation, support: int) -> ExperienceRecord:
    assert op.content is not None
    return ExperienceRecord(
        id=CID(cid),
        created_by=op.author,
        clock=op.clock,
        status=Life.LIVE,
        alias_of=None,
        version=CID(cid),
        heads=[],
        domain=".".join(op.content.domain),
        support=support,
    )
