"""Reading the library through any `ReadView`: a snapshot, the store, or the writer's transaction (PROTOCOL §7).

Rule: the tables are the library. `snapshot` encodes every record, list kept outside one, status and vote: equal
bytes, equal library.
Invariant: reading writes nothing; the cache of content blocks holds immutable facts about content-addressed
operations, which any thread may fill.
"""

from __future__ import annotations

from collections.abc import Iterator

from ledger import codec
from ledger.cid import CID
from ledger.library.tables import _listed_in
from ledger.ops import Experience, Operation, load_stored
from ledger.records import ExperienceRecord, Life, OpStatus, Vote
from ledger.store import ReadView
from ledger.tables import (
    COUNTED,
    EXPERIENCE,
    LISTED,
    ORDER,
    STATUS,
    VOTES,
    by_domain_prefix,
    by_target_prefix,
    cid_of_key,
    experience_key,
    order_cid,
    parse_by_domain_key,
    parse_by_target_key,
    parse_ordered_key,
    parse_votes_key,
    status_key,
    votes_prefix,
)

#: blocks of operations carrying content, cached (cleared when full) as bytes, which the garbage collector does
#: not track: a retrieval reads ~13 of them, and each LevelDB get lets the GIL go, for a query under ingest a
#: wait of up to the switch interval to get it back
_CONTENT_CACHE_LIMIT = 4096


class Reading:
    """Reading the library's tables, as methods of the `Library`."""

    @staticmethod
    def record(view: ReadView, exp_id: bytes) -> ExperienceRecord | None:
        raw = view.get(experience_key(exp_id))
        return ExperienceRecord.unpack(raw, _listed_in(view)) if raw is not None else None

    @staticmethod
    def status(view: ReadView, cid_raw: bytes) -> OpStatus | None:
        """The stored verdict of a folded operation (superseded modifies still read 'applied' here)."""
        raw = view.get(status_key(cid_raw))
        return OpStatus.unpack(raw) if raw is not None else None

    def content(self, view: ReadView, op_cid: bytes, folding: dict[bytes, Operation] | None = None) -> Experience:
        """The experience an add, modify or merge carries (operations being folded come from memory)."""
        op = (folding or {}).get(op_cid)
        if op is None:
            block = self._blocks.get(op_cid)
            if block is None:
                block = view.block(op_cid)
                if block is None:
                    raise KeyError(f"no operation {CID(op_cid)}")
                if len(self._blocks) >= _CONTENT_CACHE_LIMIT:
                    self._blocks.clear()
                self._blocks[op_cid] = block
            op = load_stored(block)
        assert op.content is not None
        return op.content

    def _vector(self, view: ReadView, add: bytes) -> bytes:
        """An add's float16 embedding, from its operation. The fold reads one rarely (112 times in 10,000 operations
        after 1M: most hash buckets are empty), where keeping every add's vector in a table of its own was 8% of
        the bytes written, which LevelDB's compaction writes again and again."""
        return self.content(view, add).embedding.values

    def resolve(self, view: ReadView, exp_id: bytes) -> bytes:
        """Follow aliases (merged or absorbed experiences) to the experience that stands for them."""
        record = self.record(view, exp_id)
        while record is not None and record.status is Life.ALIAS:
            assert record.alias_of is not None
            exp_id = record.alias_of.raw
            record = self.record(view, exp_id)
        return exp_id

    @staticmethod
    def experiences(view: ReadView, start: bytes | None = None) -> Iterator[ExperienceRecord]:
        """Every experience record in id order (from id `start` on)."""
        listed = _listed_in(view)
        for _, raw in view.scan(EXPERIENCE, experience_key(start) if start else None):
            yield ExperienceRecord.unpack(raw, listed)

    @staticmethod
    def in_domain(view: ReadView, domain: str, *, subdomains: bool) -> Iterator[bytes]:
        """Ids of live experiences in exactly `domain` or (subdomains) under it."""
        for key, _ in view.scan(by_domain_prefix(domain, subdomains=subdomains)):
            yield parse_by_domain_key(key)

    @staticmethod
    def naming(view: ReadView, target: bytes) -> Iterator[bytes]:
        """Applied operations naming `target`, in fold order."""
        for order in sorted(parse_by_target_key(key)[1] for key, _ in view.scan(by_target_prefix(target))):
            yield order_cid(order)

    @staticmethod
    def applied_in_order(view: ReadView) -> Iterator[bytes]:
        for key, _ in view.scan(ORDER):
            yield order_cid(parse_ordered_key(key))

    @staticmethod
    def votes(view: ReadView, exp_id: bytes) -> dict[str, Vote]:
        """Each author's latest vote naming an experience (what counts is tallied on the experience it resolves to)."""
        return {parse_votes_key(key)[1]: Vote.unpack(raw) for key, raw in view.scan(votes_prefix(exp_id))}

    def snapshot(self, view: ReadView) -> bytes:
        """Every experience record (and list kept outside one), operation status and vote: equal bytes, equal
        library."""
        return codec.encode(
            {
                "experiences": [raw for _, raw in view.scan(EXPERIENCE)],
                "listed": [key for key, _ in view.scan(LISTED)],
                "statuses": [[CID(cid_of_key(key)), raw] for key, raw in view.scan(STATUS)],
                "votes": [[key, raw] for key, raw in view.scan(VOTES)],
                "counted": [[key, raw] for key, raw in view.scan(COUNTED)],
            }
        )
