"""Set reconciliation: which operations a peer holds that this node lacks, found without reading its log.

Every node keeps, in memory, a fingerprint of the operations it holds in each of 65,536 buckets (the first 16 bits
of each CID's digest): a count and a lane-wise sum of a hash of each CID (four 64-bit lanes). Buckets form a
16-ary tree (levels 0, 4, 8, 12, 16 bits); a node asks a peer for the fingerprints of the children of the ranges
where the two differ, level by level, and lists the (clock, CID) pairs of a range once it is small, once this node
holds nothing in it, or at the leaves. Equal sets answer in one round trip of ~1 KB; d differences among N
operations cost about 4 round trips and O(d log N) bytes; the operations themselves are fetched afterwards, each
from one peer (p2p/service.py). Fingerprints bind nothing: whatever a peer lists is fetched and verified like any
other operation, and a peer that lies about its fingerprints only hides its own operations (as it could anyway).

The index follows the node's log (`SetIndex.catch_up` reads the CIDs appended since), so it costs one scan of the
log at start and O(1) per operation after; 2.5 MB of arrays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import trio

from ledger import codec
from ledger.cid import CID, CID_LENGTH
from ledger.errors import LedgerError
from ledger.view import LedgerView

LEAF_BITS = 16
STEP_BITS = 4  # each level splits a range into 16
LEVELS = range(0, LEAF_BITS, STEP_BITS)  # the levels whose children a `sums` request may ask for
MAX_PREFIXES = 256  # ranges per request
LIST_BELOW = 48  # a differing range the peer holds at most this many operations of is listed, not split
MAX_LISTED = 20_000  # (clock, CID) pairs per `list` answer
CATCH_UP_PAGE = 50_000  # log entries read into the index at once
_DIGEST_AT = CID_LENGTH - 32  # the digest's offset in a binary CID
_CID_PREFIX = CID.for_block(b"").raw[:_DIGEST_AT]
_PAST_EVERY_CID = (int.from_bytes(_CID_PREFIX, "big") + 1).to_bytes(len(_CID_PREFIX), "big")
_DOMAIN = b"experience-ledger/reconcile/1"


def bucket_of(cid: bytes) -> int:
    return int.from_bytes(cid[_DIGEST_AT : _DIGEST_AT + 2], "big")


class SetIndex:
    """Count and lane-sum per leaf bucket of the operations in the log's first `size` positions."""

    def __init__(self) -> None:
        self.lock = trio.Lock()  # one catch-up at a time
        self.counts = np.zeros(1 << LEAF_BITS, dtype=np.int64)
        self.sums = np.zeros((1 << LEAF_BITS, 4), dtype="<u8")  # uint64 arithmetic wraps: sums modulo 2**64
        self.size = 0

    def add(self, cids: Sequence[bytes], sign: int = 1) -> None:
        """Count `cids` in (`sign` -1: take them out again; sums modulo 2**64 undo exactly)."""
        if not cids:
            return
        buckets = np.fromiter((bucket_of(cid) for cid in cids), dtype=np.int64, count=len(cids))
        lanes = np.frombuffer(b"".join(hashlib.sha256(_DOMAIN + cid).digest() for cid in cids), dtype="<u8")
        np.add.at(self.counts, buckets, sign)
        np.add.at(self.sums, buckets, (lanes if sign > 0 else np.negative(lanes)).reshape(-1, 4))

    async def follow(self, view: LedgerView, read: Callable[..., Awaitable[Any]]) -> None:
        """Index what `view`'s log holds beyond what is indexed, on a reader thread (`read`)."""
        if self.size < view.log_size:
            async with self.lock:
                await read(self.catch_up, view)

    def catch_up(self, view: LedgerView) -> None:
        """Index the log entries of `view` appended since the last call."""
        while self.size < view.log_size:
            cids = view.logged_cids(self.size, self.size + CATCH_UP_PAGE)
            self.add(cids)
            self.size += len(cids)

    def children(self, level: int, prefixes: Sequence[int], plus: SetIndex | None = None) -> list[tuple[int, bytes]]:
        """(count, 32-byte sum) of the 16 children of each range `prefix` at `level` bits, in order; with `plus`,
        of the union of both sets (they must not share an operation)."""
        width = 1 << (LEAF_BITS - level - STEP_BITS)  # leaf buckets per child
        found = []
        for prefix in prefixes:
            start = prefix << (LEAF_BITS - level)
            counts, sums = self._child_sums(start, width)
            if plus is not None:
                more_counts, more_sums = plus._child_sums(start, width)
                counts, sums = counts + more_counts, sums + more_sums
            found.extend((int(count), row.tobytes()) for count, row in zip(counts, sums, strict=True))
        return found

    def _child_sums(self, start: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Counts and lane sums of the 16 runs of `width` leaf buckets from `start`."""
        counts = self.counts[start : start + 16 * width].reshape(16, width).sum(axis=1)
        return counts, self.sums[start : start + 16 * width].reshape(16, width, 4).sum(axis=1, dtype="<u8")


def bounds(level: int, prefix: int) -> tuple[bytes, bytes]:
    """The binary CIDs [low, high) of the range `prefix` at `level` bits (high is exclusive; past the top for the
    last range)."""
    shift = LEAF_BITS - level
    low = _CID_PREFIX + (prefix << shift).to_bytes(2, "big")
    top = (prefix + 1) << shift
    high = _CID_PREFIX + top.to_bytes(2, "big") if top < 1 << LEAF_BITS else _PAST_EVERY_CID
    return low, high


def check_ranges(request: dict[str, Any], deepest: int) -> str | None:
    """Why a `sums` or `list` request's `level` and `prefixes` are out of bounds, or None."""
    level, prefixes = request["level"], request["prefixes"]
    if type(level) is not int or level % STEP_BITS or not 0 <= level <= deepest:
        return f"level: expected a multiple of {STEP_BITS} from 0 to {deepest}"
    if type(prefixes) is not list or not 1 <= len(prefixes) <= MAX_PREFIXES:
        return f"prefixes: expected 1 to {MAX_PREFIXES} integers"
    if any(type(p) is not int or not 0 <= p < 1 << level for p in prefixes):
        return f"prefixes: expected integers below 2**{level}"
    return None


def encode_sums(found: list[tuple[int, bytes]]) -> bytes:
    return codec.encode({"sums": [[count, digest] for count, digest in found]})


def decode_sums(payload: bytes, expected: int) -> list[tuple[int, bytes]]:
    """The fingerprints of a `sums` answer; raises LedgerError('sync.sums') on any other shape."""
    try:
        record = codec.decode(payload)
    except LedgerError as exc:
        raise LedgerError("sync.sums", f"sums: {exc.message}") from None
    rows = record.get("sums") if type(record) is dict else None
    if type(rows) is not list or len(rows) != expected:
        raise LedgerError("sync.sums", f"sums: expected a map with a list of {expected} fingerprints")
    found = []
    for row in rows:
        if type(row) is not list or len(row) != 2 or type(row[0]) is not int or row[0] < 0:
            raise LedgerError("sync.sums", "sums: expected [count, sum] pairs")
        if type(row[1]) is not bytes or len(row[1]) != 32:
            raise LedgerError("sync.sums", "sums: expected 32-byte sums")
        found.append((row[0], row[1]))
    return found


#: canonical DAG-CBOR's only encoding of [clock, cid]: an array of 2, the clock as the shortest unsigned integer, the
#: CID as a byte string of CID_LENGTH (one length byte, 24 <= CID_LENGTH < 256)
_ITEM_ARRAY = 0x82
_CID_STRING = bytes([0x58, CID_LENGTH])
_UINT_WIDTHS = {0x18: (1, 24), 0x19: (2, 1 << 8), 0x1A: (4, 1 << 16), 0x1B: (8, 1 << 32)}  # width, least in it


def encode_item(clock: int, cid: bytes) -> bytes:
    """[clock, cid] of a `list` answer in its one canonical encoding, written by hand (~0.6 us against the general
    encoder's ~2.8, once per operation a peer lists)."""
    if clock < 24:
        return bytes([_ITEM_ARRAY, clock]) + _CID_STRING + cid
    marker, width = next((marker, width) for marker, (width, _) in _UINT_WIDTHS.items() if clock < 1 << 8 * width)
    return bytes([_ITEM_ARRAY, marker]) + clock.to_bytes(width, "big") + _CID_STRING + cid


def decode_item(payload: bytes) -> tuple[int, bytes]:
    """One (clock, CID) of a `list` answer; raises LedgerError('sync.list') on any other shape. Read by hand: the
    item has one canonical encoding, and the general decoder (decode, then encode again to prove it canonical)
    was a third of a 10,000-operation catch-up's reconciliation, one item per operation and peer."""
    if len(payload) < 2 or payload[0] != _ITEM_ARRAY or payload[1] > 0x1B:
        raise LedgerError("sync.list", "list: expected [clock, cid] pairs")
    head = payload[1]
    if head < 0x18:
        clock, at = head, 2
    else:
        width, least = _UINT_WIDTHS[head]
        clock, at = int.from_bytes(payload[2 : 2 + width], "big"), 2 + width
        if len(payload) < at or clock < least:
            raise LedgerError("sync.list", "list: expected [clock, cid] pairs in canonical DAG-CBOR")
    cid = payload[at + len(_CID_STRING) :]
    if payload[at : at + len(_CID_STRING)] != _CID_STRING or len(cid) != CID_LENGTH or not cid.startswith(_CID_PREFIX):
        raise LedgerError("sync.list", "list: expected binary CIDs of DAG-CBOR operations")
    return clock, cid
