"""Components (PROTOCOL §7.5): experiences linked by absorption and merges, with the operations acting on them.

Rule: an add or a merge starts a component; an absorbed add, a merge and a late add taking adds over join the
components of what they link; a modify or delete belongs to its target's. An operation naming no placed add or
merge is void wherever it sorts (`target.not_experience`). No rule reads outside an operation's component, so
folding each component alone, in canonical order, gives the library.
Invariant: a node never splits a component (C, G and Q hold each experience's component, its members, and its
operations in fold order with their kinds); a join moves the smaller into the larger. Which new operations sort
before an old one of their component decides where they fold (`fold`).
"""

from __future__ import annotations

from ledger.library.batch import _Work
from ledger.library.order import OpMeta
from ledger.library.tables import _KIND_BYTE, _not_experience
from ledger.ops import Kind, Operation
from ledger.store import Transaction
from ledger.tables import (
    component_key,
    component_op_key,
    component_op_prefix,
    component_size_key,
    member_key,
    member_prefix,
    parse_component_op_key,
    parse_member_key,
    read_u64,
    status_key,
    u64,
)

_CREATES = (Kind.ADD, Kind.MERGE)  # the kinds whose CID names an experience


class Components:
    """Placing operations in their components, as methods of the `Library`."""

    def _place(self, work: _Work, cid: bytes, op: Operation, meta: OpMeta, order: bytes) -> None:
        """Put an operation into its component (joining the components it links), or record it void."""
        txn = work.records.txn
        components = [txn.get(component_key(target)) for target in meta.targets]
        for target, found in zip(meta.targets, components, strict=True):
            # only a placed add or merge has a component: one void by its clock created no experience, and like a
            # vote or a modify as target, the operation is void wherever it sorts
            if found is None:
                txn.put(status_key(cid), _not_experience(target).pack())
                return
        if op.kind in _CREATES:
            component = cid
            txn.put(component_key(cid), cid)
            txn.put(member_key(cid, cid), b"")
            txn.put(component_size_key(cid), u64(1))
        else:
            found = components[0]
            assert found is not None, "checked above"
            component = found
        txn.put(component_op_key(component, order), _KIND_BYTE[op.kind])
        work.new.add(order)
        work.placed.setdefault(component, []).append(order)
        if op.kind in (Kind.DELETE, Kind.MODIFY):
            # a merge of the target is void if this operation is concurrent with it, wherever it sorts (§7.4); one
            # that is void already stays void, so only its verdict is read again (not its component folded)
            for merge, voided in self._concurrent_merges(txn, meta.targets[0], cid):
                if voided:
                    work.reworded.add(merge)
                else:
                    work.voids_merge.setdefault(order, []).append(merge)
        links = list(meta.targets) if op.kind is Kind.MERGE else []
        if op.kind is Kind.ADD:
            assert op.content is not None
            into, taken = self._absorption(txn, cid, order, op.content.embedding.values, work.bands.of(cid))
            links = ([into] if into is not None else []) + [other for other, _ in taken]
            if taken:
                work.takes_over[cid] = taken
        for other in links:
            found = txn.get(component_key(other))
            assert found is not None
            component = self._join(work, component, found)

    def _join(self, work: _Work, a: bytes, b: bytes) -> bytes:
        """Join two components (the smaller moves into the larger); returns the joined one's id."""
        if a == b:
            return a
        txn = work.records.txn
        sizes = {c: read_u64(txn.get(component_size_key(c))) for c in (a, b)}
        keep, move = (a, b) if sizes[a] >= sizes[b] else (b, a)
        for key, _ in list(txn.scan(member_prefix(move))):
            exp_id = parse_member_key(key)
            txn.delete(key)
            txn.put(member_key(keep, exp_id), b"")
            txn.put(component_key(exp_id), keep)
        for key, kind in list(txn.scan(component_op_prefix(move))):
            txn.delete(key)
            txn.put(component_op_key(keep, parse_component_op_key(key)), kind)
        txn.put(component_size_key(keep), u64(sizes[a] + sizes[b]))
        txn.delete(component_size_key(move))
        # both halves were folded apart, which is right for all their operations before the first new one
        work.placed[keep] = work.placed.pop(move, []) + work.placed.get(keep, [])
        return keep

    @staticmethod
    def _late(txn: Transaction, component: bytes, placed: list[bytes], new: set[bytes]) -> list[bytes]:
        """The component's new operations that an old one sorts after, in canonical order (`placed`: all its
        new ones). Reads its operations from the first new one up to the first old one after the last."""
        last_old = None
        for key, _ in txn.scan(component_op_prefix(component), component_op_key(component, placed[0])):
            order = parse_component_op_key(key)
            if order not in new:
                last_old = order
                if order > placed[-1]:
                    break
        return [order for order in placed if last_old is not None and order < last_old]

    @staticmethod
    def _members(txn: Transaction, component: bytes) -> list[bytes]:
        return [parse_member_key(key) for key, _ in txn.scan(member_prefix(component))]
