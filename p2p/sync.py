"""The sync protocol `/expledger/sync/1`: a node learns what a peer holds that it lacks, fetches exactly that, and
checks that the peer never rewrites its history.

One request per stream, answered by a stream of frames (4-byte big-endian length + payload), then end of stream.
Requests are DAG-CBOR maps:

    {"get": "head"}                                      -> the peer's signed tree head
    {"get": "consistency", "old": m, "new": n}           -> {"proof": [hash, ...]} (RFC 9162 §2.1.4)
    {"get": "sums", "level": l, "prefixes": [p, ...]}    -> {"sums": [[count, sum], ...]}: the fingerprints of the
                                                            16 sub-ranges of each range (p2p/reconcile.py)
    {"get": "list", "level": l, "prefixes": [p, ...]}    -> [clock, cid] of each operation it holds in those
                                                            ranges, one per frame
    {"get": "blocks", "cids": [cid bytes, ...]}          -> the operations it holds among those, one per frame
    {"get": "entries", "from": a, "to": b, "size": n}    -> the operations at log positions [a, b), one per
                                                            frame, then {"proof": [...]}: consistency from b to n
                                                            (for whoever audits a whole log; sync does not read it)

A round (p2p/service.py) asks for the head and checks it against the last head of the same node this node
verified (`verify_head`: a consistency proof, O(log N)); a node that signs a head inconsistent with one it signed
before has rewritten its history: both heads are kept as evidence and the node is refused (`ForkDetected`). Then
`differences` compares fingerprints and lists what differs, and `fetch_blocks` fetches operations by CID, each
checked to be one that was asked for; ingest then verifies each as it verifies any operation.

Reading is chunked: in 0.8.1 `NetStream.read(n)` returns what yamux has buffered (at most n, at least one byte;
`StreamEOF` at the end), and every read costs ~30 µs, so frames are cut out of 256 KiB reads; writes are batched
to 64 KiB (each write is a yamux frame and a Noise message). Measured: 10,000 x 600 B in 80 ms this way, 2-3.6 s
frame by frame.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF, StreamError, StreamReset
from libp2p.peer.id import ID

from ledger import codec
from ledger.cid import CID
from ledger.errors import LedgerError
from ledger.merkle import TreeHead
from ledger.proofs import verify_consistency
from ledger.store import write_file_atomically
from ledger.view import LedgerView
from p2p.host import refused_protocol
from p2p.reconcile import (
    LEAF_BITS,
    LEVELS,
    LIST_BELOW,
    MAX_LISTED,
    MAX_PREFIXES,
    STEP_BITS,
    SetIndex,
    bounds,
    bucket_of,
    check_ranges,
    decode_item,
    decode_sums,
    encode_item,
    encode_sums,
)

log = logging.getLogger(__name__)

SYNC_PROTOCOL = TProtocol("/expledger/sync/1")
HEADER = struct.Struct(">I")
MAX_FRAME = 4 * 1024 * 1024  # above any operation a network allows (1 MiB) and any proof
MAX_REQUEST = 64 * 1024
MAX_ENTRIES = 2000  # per entries request
MAX_BLOCKS = 256  # per blocks request
MAX_PROOF = 64  # hashes in a consistency proof of a log below 2**63
READ_CHUNK = 256 * 1024
WRITE_BATCH = 64 * 1024
REQUEST_TIMEOUT = 10.0  # seconds a server waits for the request
IDLE_TIMEOUT = 10.0  # seconds a reader waits for the next byte of a response


class SyncError(LedgerError):
    """A sync exchange failed (the stream, a frame, a timeout); nobody is proven at fault."""


class Misbehaviour(LedgerError):
    """The peer answered with something no honest node sends (a bad signature, entries its head does not cover,
    an invalid operation in its log); it is penalised."""


class ForkDetected(LedgerError):
    """A node signed two heads that no single append-only log can have; `evidence` holds both."""

    def __init__(self, message: str, evidence: dict[str, Any]) -> None:
        super().__init__("sync.fork", message)
        self.evidence = evidence


# --- frames -------------------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise SyncError("sync.frame.too_large", f"a frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


class FrameReader:
    """Frames from a stream, cut out of large reads; `idle_timeout` bounds each wait for data."""

    def __init__(self, stream: INetStream, max_frame: int = MAX_FRAME, idle_timeout: float = IDLE_TIMEOUT) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._max_frame = max_frame
        self._idle_timeout = idle_timeout

    async def read_frame(self) -> bytes | None:
        """The next frame's payload, or None at a clean end of stream (between frames)."""
        if not await self._fill(HEADER.size, at_boundary=True):
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self._max_frame:
            raise SyncError(
                "sync.frame.too_large", f"the peer announced a {length}-byte frame (limit {self._max_frame})"
            )
        await self._fill(HEADER.size + length, at_boundary=False)
        payload = bytes(self._buffer[HEADER.size : HEADER.size + length])
        del self._buffer[: HEADER.size + length]
        return payload

    async def _fill(self, needed: int, at_boundary: bool) -> bool:
        while len(self._buffer) < needed:
            try:
                with trio.fail_after(self._idle_timeout):
                    chunk = await self._stream.read(max(READ_CHUNK, needed - len(self._buffer)))
            except trio.TooSlowError:
                raise SyncError("sync.timeout", f"no data from the peer for {self._idle_timeout:.0f} s") from None
            except StreamEOF:
                if at_boundary and not self._buffer:
                    return False
                raise SyncError(
                    "sync.frame.truncated", f"the stream ended {len(self._buffer)} bytes into a frame"
                ) from None
            except StreamReset:
                raise SyncError("sync.reset", "the peer reset the stream") from None
            self._buffer += chunk
        return True


class FrameWriter:
    """Buffers frames and writes them in batches of about WRITE_BATCH bytes."""

    def __init__(self, stream: INetStream) -> None:
        self._stream = stream
        self._pending: list[bytes] = []
        self._size = 0

    async def send(self, payload: bytes) -> None:
        self._pending.append(frame(payload))
        self._size += len(self._pending[-1])
        if self._size >= WRITE_BATCH:
            await self.flush()

    async def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._size = 0
            await self._stream.write(data)


# --- the server -----------------------------------------------------------------------------------


def _request(data: bytes) -> dict[str, Any]:
    """A request, checked; raises SyncError('sync.request') naming the field."""
    try:
        request = codec.decode(data)
    except LedgerError as exc:
        raise SyncError("sync.request", f"request: {exc.message}") from None
    if type(request) is not dict or type(request.get("get")) is not str:
        raise SyncError("sync.request", "request: expected a map with a `get` string")
    shapes = {
        "head": {"get"},
        "consistency": {"get", "old", "new"},
        "entries": {"get", "from", "to", "size"},
        "blocks": {"get", "cids"},
        "sums": {"get", "level", "prefixes"},
        "list": {"get", "level", "prefixes"},
    }
    expected = shapes.get(request["get"])
    if expected is None:
        raise SyncError("sync.request", f"get: unknown request {request['get']!r} (known: {', '.join(shapes)})")
    if request.keys() != expected:
        raise SyncError("sync.request", f"{request['get']}: expected exactly the fields {', '.join(sorted(expected))}")
    if request["get"] in ("sums", "list"):
        deepest = LEVELS[-1] if request["get"] == "sums" else LEAF_BITS
        if (why := check_ranges(request, deepest)) is not None:
            raise SyncError("sync.request", f"{request['get']}: {why}")
        return request
    for name in expected - {"get", "cids"}:
        if type(request[name]) is not int or request[name] < 0:
            raise SyncError("sync.request", f"{name}: expected a non-negative integer")
    if request["get"] == "blocks":
        cids = request["cids"]
        if type(cids) is not list or not 1 <= len(cids) <= MAX_BLOCKS or any(type(c) is not bytes for c in cids):
            raise SyncError("sync.request", f"cids: expected 1 to {MAX_BLOCKS} CIDs as bytes")
    return request


async def answer(
    view: LedgerView, data: bytes, read: Callable[..., Awaitable[Any]], index: SetIndex
) -> AsyncIterator[bytes]:
    """The frames that answer one request, from one committed view (so a page and its proof agree); database
    reads run through `read` (the node's reader threads)."""
    request = _request(data)
    size = view.log_size
    match request["get"]:
        case "sums":
            await index.follow(view, read)
            yield encode_sums(index.children(request["level"], request["prefixes"]))
        case "list":
            left = MAX_LISTED
            for prefix in request["prefixes"]:
                for clock, cid in await read(view.held_between, *bounds(request["level"], prefix), left):
                    yield encode_item(clock, cid)
                    left -= 1
                if left <= 0:
                    break
        case "head":
            yield (await read(view.tree_head)).to_bytes()
        case "consistency":
            old, new = request["old"], request["new"]
            if not 0 < old <= new <= size:
                raise SyncError("sync.request", f"old, new: expected 0 < old <= new <= {size}")
            proof = await read(view.consistency_proof, old, new)
            yield codec.encode({"proof": [bytes.fromhex(h) for h in proof["proof"]]})
        case "entries":
            start, end, at = request["from"], request["to"], request["size"]
            if not 0 <= start < end <= at <= size or end - start > MAX_ENTRIES:
                raise SyncError(
                    "sync.request", f"from, to, size: expected from < to <= size <= {size}, at most {MAX_ENTRIES}"
                )
            for op in await read(view.entries, start, end):
                yield op
            proof = await read(view.consistency_proof, end, at) if end < at else {"proof": []}
            yield codec.encode({"proof": [bytes.fromhex(h) for h in proof["proof"]]})
        case "blocks":
            try:
                cids = [CID(raw) for raw in request["cids"]]
            except LedgerError:
                raise SyncError("sync.request", "cids: expected CIDs") from None
            for block in await read(_blocks, view, cids):  # one trip to a reader thread, not one per block
                yield block


def _blocks(view: LedgerView, cids: list[CID]) -> list[bytes]:
    return [data for cid in cids if (data := view.block_bytes(cid)) is not None]


def serve(
    host: IHost,
    view: Callable[[], LedgerView],
    read: Callable[..., Awaitable[Any]],
    served: Callable[[ID, str], None],
    index: SetIndex | None = None,
) -> None:
    """Answer sync requests on `host`. The handler never raises (an exception escaping a stream handler reaches
    libp2p's connection nursery and can end the process): a bad request or a failed exchange resets the stream.
    `index`: the fingerprints of what `view` holds (kept by the caller, who reconciles with it too)."""
    fingerprints = index or SetIndex()

    async def handler(stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id  # authenticated by Noise
        try:
            data = await FrameReader(stream, MAX_REQUEST, REQUEST_TIMEOUT).read_frame()
            if data is None:
                # a client that gave up (cancelled, its connection dropped) looks the same: not proof of malice
                raise SyncError("sync.stream", "the stream ended before a request")
            writer = FrameWriter(stream)
            async for payload in answer(view(), data, read, fingerprints):
                await writer.send(payload)
            await writer.flush()
            await stream.close()
            served(peer, "ok")
        except (LedgerError, StreamError) as exc:
            log.info("sync request from %s failed: %s", peer, exc)
            served(peer, getattr(exc, "code", "sync.stream"))
            await _reset(stream)
        except Exception:
            log.exception("answering a sync request from %s failed", peer)
            await _reset(stream)

    host.set_stream_handler(SYNC_PROTOCOL, handler)


async def _reset(stream: INetStream) -> None:
    with trio.CancelScope(shield=True):
        try:
            await stream.reset()
        except Exception as exc:  # the connection may be gone already
            log.debug("resetting a sync stream failed: %s", exc)


# --- the client -----------------------------------------------------------------------------------


async def ask(host: IHost, peer: ID, request: dict[str, Any], most: int) -> list[bytes]:
    """Send one request, return its response frames (at most `most`, or the peer misbehaves)."""
    try:
        stream = await host.new_stream(peer, [SYNC_PROTOCOL])
    except Exception as exc:  # libp2p raises several types when a peer cannot open the protocol
        code = "sync.unsupported" if refused_protocol(exc) else "sync.stream"
        raise SyncError(code, f"cannot open {SYNC_PROTOCOL} to {peer}: {exc}") from None
    frames: list[bytes] = []
    try:
        await stream.write(frame(codec.encode(request)))
        await stream.close_write()
        reader = FrameReader(stream)
        while (payload := await reader.read_frame()) is not None:
            frames.append(payload)
            if len(frames) > most:
                raise Misbehaviour("sync.response.count", f"{request['get']}: more than {most} frames in answer")
        await stream.close()
    except StreamError as exc:
        await _reset(stream)
        raise SyncError("sync.stream", f"{request['get']}: {exc}") from None
    except BaseException:
        await _reset(stream)
        raise
    return frames


def _proof(payload: bytes) -> list[bytes]:
    try:
        record = codec.decode(payload)
    except LedgerError as exc:
        raise Misbehaviour("sync.proof", f"proof: {exc.message}") from None
    if type(record) is not dict or record.keys() != {"proof"} or type(record["proof"]) is not list:
        raise Misbehaviour("sync.proof", "proof: expected a map with a list `proof`")
    proof = record["proof"]
    if len(proof) > MAX_PROOF or any(type(h) is not bytes or len(h) != 32 for h in proof):
        raise Misbehaviour("sync.proof", f"proof: expected at most {MAX_PROOF} 32-byte hashes")
    return proof


@dataclass
class LogState:
    """The newest head of one node this node verified (each next one must prove it extends it)."""

    node: str
    head: TreeHead | None = None

    def encode(self) -> bytes:
        return codec.encode({"node": self.node, "head": self.head.to_bytes() if self.head else None})

    @classmethod
    def decode(cls, data: bytes) -> LogState:
        """Also reads the files of earlier versions, which kept a read position beside the head."""
        record = codec.decode(data)
        return cls(record["node"], TreeHead.from_bytes(record["head"]) if record["head"] is not None else None)


class LogStates:
    """The verified heads and fork evidence, one file each under `directory` (written atomically)."""

    def __init__(self, directory: Path) -> None:
        self.logs = directory / "logs"
        self.forks = directory / "forks"
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.forks.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._states: dict[str, LogState] = {}
        self.refused: set[str] = set()
        for path in sorted(self.forks.glob("*.cbor")):
            try:
                self.refused.add(codec.decode(path.read_bytes())["node"])
            except (LedgerError, KeyError, TypeError, OSError) as exc:
                log.warning("%s: unreadable fork evidence (%s); ignoring it", path, exc)

    @staticmethod
    def _name(node: str) -> str:
        return hashlib.sha256(node.encode()).hexdigest()[:32] + ".cbor"

    def get(self, node: str) -> LogState:
        if node not in self._states:
            path = self.logs / self._name(node)
            state = LogState(node)
            if path.exists():
                try:
                    state = LogState.decode(path.read_bytes())
                except (LedgerError, KeyError, TypeError, OSError) as exc:
                    log.warning("%s: unreadable verified head (%s); trusting %s's next head afresh", path, exc, node)
            self._states[node] = state
        return self._states[node]

    def save(self, state: LogState) -> None:
        self._states[state.node] = state
        write_file_atomically(self.logs / self._name(state.node), state.encode())

    def record_fork(self, fork: ForkDetected) -> Path:
        node = fork.evidence["node"]
        self.refused.add(node)
        path = self.forks / f"{self._name(node)[:-5]}-{int(time.time() * 1000)}.cbor"
        write_file_atomically(path, codec.encode(fork.evidence))
        return path


async def read_head(host: IHost, peer: ID) -> TreeHead:
    frames = await ask(host, peer, {"get": "head"}, 1)
    if not frames:  # py-libp2p 0.8.1 can show a stream reset as its end: not proof of malice
        raise SyncError("sync.empty", "head: the stream ended without an answer")
    try:
        head = TreeHead.from_bytes(frames[0])
    except LedgerError as exc:
        raise Misbehaviour("sync.head", f"head: {exc.message}") from None
    if not head.verify():
        raise Misbehaviour("sync.head.signature", f"head: the signature of {head.node} does not verify")
    return head


async def check_head(host: IHost, peer: ID, state: LogState, head: TreeHead) -> bool:
    """Is `head` consistent with the last head of its node we verified? True when it is newer (keep it), False
    when it adds nothing (the same, or an older head replayed); raises ForkDetected when no append-only log has
    both: a consistency proof that fails, or a smaller head signed later than a larger one."""
    old = state.head
    if old is None or old.size == 0:
        return head.size > 0
    if (old.size, old.root) == (head.size, head.root):
        return False
    evidence = {"node": head.node, "peer": str(peer), "earlier": old.to_bytes(), "later": head.to_bytes()}
    if head.size < old.size:
        if head.timestamp > old.timestamp:  # logs never shrink: signed after the larger one, it is a rollback
            raise ForkDetected(
                f"{head.node} signed a head of size {head.size} after one of size {old.size}",
                {**evidence, "proof": [], "detected": int(time.time() * 1000)},
            )
        return False  # an older head, replayed: nothing new
    first, second = old, head
    proof: list[bytes] = []
    if first.size != second.size:
        frames = await ask(host, peer, {"get": "consistency", "old": first.size, "new": second.size}, 1)
        if len(frames) != 1:
            raise Misbehaviour("sync.proof", "consistency: expected one frame")
        proof = _proof(frames[0])
    if not verify_consistency(first.size, second.size, first.root, second.root, proof):
        raise ForkDetected(
            f"{head.node} signed heads of sizes {old.size} and {head.size} that no single log has",
            {**evidence, "proof": proof, "detected": int(time.time() * 1000)},
        )
    return head.size > old.size


async def verify_head(host: IHost, peer: ID, states: LogStates) -> TreeHead:
    """The peer's signed head, checked against the last head of its node we verified (kept when newer): O(log N)
    per head, which is what keeps a node from rewriting its history unseen. Raises ForkDetected for a node that
    has (or that forked before), Misbehaviour for a head no honest node sends."""
    head = await read_head(host, peer)
    if head.node in states.refused:
        raise ForkDetected(f"{head.node} has forked before; it is refused", {"node": head.node, "peer": str(peer)})
    state = states.get(head.node)
    if await check_head(host, peer, state, head):
        state.head = head
        states.save(state)
    return head


async def fetch_blocks(host: IHost, peer: ID, cids: Sequence[CID]) -> dict[bytes, bytes]:
    """The operations `peer` holds among `cids`, each once, by binary CID in the order of `cids` (checked: each must
    be one we asked for; the CIDs are handed on, not hashed again). The request lists them sorted and a peer answers
    in any order, but the fetcher asks in clock order and the ledger stores a batch in its order: a child ahead of
    its parent would wait there as pending (in CID order, 9,955 of a 10,000-operation catch-up did)."""
    asked = list(dict.fromkeys(cid.raw for cid in cids[:MAX_BLOCKS]))
    frames = await ask(host, peer, {"get": "blocks", "cids": sorted(asked)}, len(asked))
    wanted, arrived = set(asked), {}
    for data in frames:
        cid = CID.for_block(data).raw
        if cid not in wanted:
            raise Misbehaviour("sync.blocks", "blocks: an operation that was not asked for")
        arrived[cid] = data
    return {cid: arrived[cid] for cid in asked if cid in arrived}


async def differences(
    host: IHost,
    peer: ID,
    index: SetIndex,
    coming: SetIndex | None = None,
    covered: list[tuple[int, int]] | None = None,
) -> list[tuple[int, bytes]]:
    """(clock, CID) of every operation `peer` lists in the ranges where its fingerprints and `index` (this node's,
    caught up by the caller) differ: a superset of what it holds and this node lacks, found level by level.

    `coming`: operations this node found missing and is getting (none of them in `index`): compared with the union,
    a range the peer holds exactly that of is not listed; `covered` then receives (level, prefix) of each such
    range where `coming` holds something (the peer holds all of it: the fetcher may ask it). A catch-up from 5
    peers listed all 10,000 operations from each; now the first peer to answer lists them."""
    listing: dict[int, list[tuple[int, int]]] = {}  # level -> (prefix, the peer's count)
    level, prefixes = 0, [0]
    while prefixes:
        theirs: list[tuple[int, bytes]] = []
        for start in range(0, len(prefixes), MAX_PREFIXES):
            chunk = prefixes[start : start + MAX_PREFIXES]
            frames = await ask(host, peer, {"get": "sums", "level": level, "prefixes": chunk}, 1)
            if not frames:
                raise SyncError("sync.empty", "sums: the stream ended without an answer")
            try:
                theirs += decode_sums(frames[0], 16 * len(chunk))
            except LedgerError as exc:
                raise Misbehaviour(exc.code, exc.message) from None
        ours = index.children(level, prefixes, coming)
        on_the_way = coming.children(level, prefixes) if coming is not None and covered is not None else None
        level, deeper = level + STEP_BITS, []
        for position, (their, our) in enumerate(zip(theirs, ours, strict=True)):
            child = (prefixes[position // 16] << STEP_BITS) | (position % 16)
            if their[0] == 0 or their == our:
                if their[0] and on_the_way is not None and on_the_way[position][0] and covered is not None:
                    covered.append((level, child))
                continue
            small = their[0] <= LIST_BELOW or our[0] == 0 or level == LEAF_BITS
            if (small and their[0] <= MAX_LISTED) or level == LEAF_BITS:
                listing.setdefault(level, []).append((child, their[0]))
            else:
                deeper.append(child)
        prefixes = deeper
    found: list[tuple[int, bytes]] = []
    for at, ranges in listing.items():
        for group in _groups(ranges):
            found += await _list(host, peer, at, group)
    return found


def _groups(ranges: list[tuple[int, int]]) -> list[list[int]]:
    """Ranges in requests of at most MAX_PREFIXES ranges and about MAX_LISTED operations."""
    groups: list[list[int]] = [[]]
    total = 0
    for prefix, count in ranges:
        if groups[-1] and (len(groups[-1]) == MAX_PREFIXES or total + count > MAX_LISTED):
            groups.append([])
            total = 0
        groups[-1].append(prefix)
        total += count
    return groups


async def _list(host: IHost, peer: ID, level: int, prefixes: list[int]) -> list[tuple[int, bytes]]:
    frames = await ask(host, peer, {"get": "list", "level": level, "prefixes": prefixes}, MAX_LISTED)
    wanted = set(prefixes)
    items = []
    for payload in frames:
        try:
            clock, cid = decode_item(payload)
        except LedgerError as exc:
            raise Misbehaviour(exc.code, exc.message) from None
        if bucket_of(cid) >> (LEAF_BITS - level) not in wanted:
            raise Misbehaviour("sync.list", "list: a CID outside the ranges asked for")
        items.append((clock, cid))
    return items
