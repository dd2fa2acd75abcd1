"""Real libp2p hosts on 127.0.0.1 in one trio run: only Noise gets in, and the sync protocol between a real ledger
and a reader: set reconciliation, servers that lie (bad heads, bad fingerprints, listings outside the ranges asked
for) and nodes that sign two histories (fork evidence)."""

from __future__ import annotations

import random
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from ledger import codec
from ledger.cid import CID
from ledger.ingest import Source, Submission, Verdict
from ledger.keys import AuthorKey
from ledger.ledger import NODE_KEY, Ledger
from ledger.merkle import TreeHead
from ledger.ops import Block
from ledger.proofs import verify_consistency
from p2p.discovery import Discovery
from p2p.gossip import build_pubsub, drop_copies_in_validation, set_validator, topic_for
from p2p.host import build_host, connect, full_addrs, key_pair
from p2p.reconcile import LEVELS, LIST_BELOW, MAX_PREFIXES, SetIndex
from p2p.service import P2PNode, run_host
from p2p.sync import (
    MAX_ENTRIES,
    MAX_REQUEST,
    SYNC_PROTOCOL,
    ForkDetected,
    FrameReader,
    FrameWriter,
    LogStates,
    Misbehaviour,
    SyncError,
    ask,
    differences,
    fetch_blocks,
    frame,
    serve,
    verify_head,
)
from p2p.sync import answer as answer_request
from tests import factories as f
from tests.ledgers import open_ledger, random_history

LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
TOPIC = topic_for("p2p-tests")
TIMEOUT = 30  # seconds any one test's network part may take (a bound against hangs, not a measurement)


def _noise_host() -> IHost:
    return build_host(key_pair(secrets.token_bytes(32)), LISTEN)


@asynccontextmanager
async def running(*hosts: IHost) -> AsyncIterator[None]:
    """Our hosts as the node runs them: pubsub and its router first, then the host; closed on the way out."""
    async with trio.open_nursery() as nursery:
        ready: list[trio.Event] = []
        done = trio.Event()

        async def run(host: IHost, started: trio.Event) -> None:
            async with run_host(host, build_pubsub(host, TOPIC), LISTEN):
                started.set()
                await done.wait()

        for host in hosts:
            ready.append(trio.Event())
            nursery.start_soon(run, host, ready[-1])
        for event in ready:
            await event.wait()
        try:
            yield
        finally:
            done.set()


async def read(function: Callable[..., Any], *args: Any) -> Any:
    """Database reads off the event loop, as the node's reader threads do."""
    return await trio.to_thread.run_sync(partial(function, *args))


def ingest(ledger: Ledger, blocks: list) -> None:
    receipts = ledger.ingest([block.data for block in blocks])
    assert all(receipt.verdict is not Verdict.REJECTED for receipt in receipts), [r.errors for r in receipts]


def ledger_with_key(path: Path, key_file: Path) -> Ledger:
    """A fresh ledger whose node signs with the key in `key_file` (the same node, another history)."""
    path.mkdir()
    shutil.copy(key_file, path / NODE_KEY)
    return open_ledger(path)


@pytest.fixture
def history():
    return random_history(random.Random(11), 85)


@pytest.fixture
def source(tmp_path, history):
    ledger = open_ledger(tmp_path / "source")
    ingest(ledger, history[:60])
    yield ledger
    ledger.close()


@pytest.fixture
def target(tmp_path):
    ledger = open_ledger(tmp_path / "target")
    yield ledger
    ledger.close()


# --- Noise only -------------------------------------------------------------------------------------


def _plaintext_host() -> IHost:
    keys = create_new_key_pair()
    return new_host(
        key_pair=keys,
        listen_addrs=LISTEN,
        sec_opt={TProtocol(PLAINTEXT_PROTOCOL_ID): InsecureTransport(keys)},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        connection_config=ConnectionConfig(max_connections_per_peer=1),
    )


def _chain(exc: BaseException) -> str:
    """Every message in an exception, its causes and (libp2p's MultiError) its members."""
    parts, seen = [], set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        parts.append(str(current))
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(arg for arg in current.args if isinstance(arg, BaseException))
        stack.extend(e for arg in current.args if isinstance(arg, list) for e in arg if isinstance(e, BaseException))
    return " | ".join(parts)


def test_a_plaintext_peer_is_refused_both_ways():
    ours, honest, plain = _noise_host(), _noise_host(), _plaintext_host()

    async def main() -> list[str]:
        failures = []
        with trio.fail_after(TIMEOUT):
            async with running(ours, honest), plain.run(LISTEN):
                try:
                    for dialer, listener in ((plain, ours), (ours, plain)):
                        with pytest.raises(Exception) as caught:
                            await connect(dialer, full_addrs(listener)[0], 10)
                        assert not isinstance(caught.value, trio.TooSlowError)  # refused, not hung
                        failures.append(_chain(caught.value))
                    assert ours.get_connected_peers() == [] and plain.get_connected_peers() == []
                    await connect(honest, full_addrs(ours)[0], 10)  # the same listener takes a Noise peer
                    assert ours.get_connected_peers() == [honest.get_id()]
                finally:
                    with trio.move_on_after(5) as scope:
                        scope.shield = True
                        await plain.close()
        return failures

    for failure in trio.run(main):
        assert "security" in failure, failure  # refused at the security negotiation


# --- the sync server with a real ledger ---------------------------------------------------------------


def test_the_sync_server_answers_head_entries_blocks_and_consistency(source, history):
    server, client = _noise_host(), _noise_host()
    served: list[tuple[ID, str]] = []
    serve(server, source.view, read, lambda peer, outcome: served.append((peer, outcome)))
    view = source.view()
    unknown = f.add("An experience the server never saw, stated plainly here.").cid

    async def main() -> None:
        with trio.fail_after(TIMEOUT):
            async with running(server, client):
                peer = await connect(client, full_addrs(server)[0], 10)
                (head_frame,) = await ask(client, peer, {"get": "head"}, 1)
                head = TreeHead.from_bytes(head_frame)
                assert head.verify() and head.node == source.node_key.did
                assert (head.size, head.root) == (60, view.merkle.root())

                frames = await ask(client, peer, {"get": "entries", "from": 10, "to": 25, "size": 60}, 16)
                assert frames[:-1] == view.entries(10, 25)
                (proof,) = codec.decode(frames[-1]).values()
                assert verify_consistency(25, 60, view.merkle.root(25), head.root, proof)

                frames = await ask(client, peer, {"get": "entries", "from": 40, "to": 60, "size": 60}, 21)
                assert frames == [*view.entries(40, 60), codec.encode({"proof": []})]

                (frame_,) = await ask(client, peer, {"get": "consistency", "old": 7, "new": 60}, 1)
                assert verify_consistency(7, 60, view.merkle.root(7), head.root, codec.decode(frame_)["proof"])

                # in the order asked (the fetcher asks parents first), not the sorted order of the request
                first, second = sorted((history[3], history[30]), key=lambda block: block.cid.raw, reverse=True)
                wanted = [first.cid, unknown, second.cid, first.cid]
                fetched = await fetch_blocks(client, peer, wanted)
                assert list(fetched.items()) == [(first.cid.raw, first.data), (second.cid.raw, second.data)]

    trio.run(main)
    assert {outcome for _, outcome in served} <= {"ok"}


def test_the_sync_server_sends_blocks_as_stored_without_decoding_them(source, history, monkeypatch):
    """Serving a fetch reads each operation's bytes (checked against its CID) and sends them: decoding each, only to
    send its bytes, took ~50 us of the serving peer's CPU per operation, on the cores a catching-up node shares."""

    def decoding(data: bytes) -> None:
        raise AssertionError("the server decoded an operation it only sends")

    monkeypatch.setattr("ledger.view.load_stored", decoding)
    wanted = [history[5].cid.raw, history[1].cid.raw]

    async def main() -> list[bytes]:
        request = codec.encode({"get": "blocks", "cids": wanted})
        return [payload async for payload in answer_request(source.view(), request, read, SetIndex())]

    assert trio.run(main) == [history[5].data, history[1].data]


async def _raw_exchange(client: IHost, peer: ID, data: bytes) -> list[bytes] | str:
    """Write `data` as is on a sync stream; the frames answered, or how the stream failed."""
    stream = await client.new_stream(peer, [SYNC_PROTOCOL])
    try:
        await stream.write(data)
        await stream.close_write()
        reader, frames = FrameReader(stream, idle_timeout=15), []
        while (payload := await reader.read_frame()) is not None:
            frames.append(payload)
        return frames
    except SyncError as exc:
        return exc.code
    finally:
        with trio.CancelScope(shield=True):
            await stream.reset()


BAD_EXCHANGES = {
    "garbage": (frame(b"\xff\x13 not cbor"), "sync.request"),
    "not a request": (frame(codec.encode({"get": "everything"})), "sync.request"),
    "entries past the log": (frame(codec.encode({"get": "entries", "from": 50, "to": 70, "size": 70})), "sync.request"),
    "too many entries": (
        frame(codec.encode({"get": "entries", "from": 0, "to": MAX_ENTRIES + 1, "size": MAX_ENTRIES + 1})),
        "sync.request",
    ),
    "empty range": (frame(codec.encode({"get": "entries", "from": 5, "to": 5, "size": 60})), "sync.request"),
    "consistency from 0": (frame(codec.encode({"get": "consistency", "old": 0, "new": 60})), "sync.request"),
    "consistency past the log": (frame(codec.encode({"get": "consistency", "old": 5, "new": 61})), "sync.request"),
    "a bad CID": (frame(codec.encode({"get": "blocks", "cids": [b"\x01\x02"]})), "sync.request"),
    "sums below the leaves": (frame(codec.encode({"get": "sums", "level": 16, "prefixes": [0]})), "sync.request"),
    "a range past its level": (frame(codec.encode({"get": "sums", "level": 4, "prefixes": [16]})), "sync.request"),
    "a level between levels": (frame(codec.encode({"get": "list", "level": 6, "prefixes": [0]})), "sync.request"),
    "too many ranges": (
        frame(codec.encode({"get": "list", "level": 12, "prefixes": list(range(MAX_PREFIXES + 1))})),
        "sync.request",
    ),
    "no request": (b"", "sync.stream"),  # a client that gave up looks the same: unpenalised
    "oversized length prefix": (b"\xff\xff\xff\xff" + b"x" * 100, "sync.frame.too_large"),
    "request over the limit": (frame(b"\x00" * (MAX_REQUEST + 1)), "sync.frame.too_large"),
    "truncated frame": (b"\x00\x00\x10\x00" + b"x" * 100, "sync.frame.truncated"),
}


def test_bad_requests_end_their_stream_and_nothing_else(source):
    server, client = _noise_host(), _noise_host()
    served: list[str] = []
    serve(server, source.view, read, lambda peer, outcome: served.append(outcome))

    async def main() -> dict[str, Any]:
        answers = {}
        with trio.fail_after(TIMEOUT):
            async with running(server, client):
                peer = await connect(client, full_addrs(server)[0], 10)
                for name, (data, _) in BAD_EXCHANGES.items():
                    answers[name] = await _raw_exchange(client, peer, data)
                    (head,) = await ask(client, peer, {"get": "head"}, 1)  # the server goes on
                    assert TreeHead.from_bytes(head).size == 60
                    assert client.get_connected_peers() == [peer]
        return answers

    answers = trio.run(main)
    for name, answer in answers.items():
        assert answer in ([], "sync.reset", "sync.frame.truncated"), (name, answer)  # no answer frame, ever
    failures = [outcome for outcome in served if outcome != "ok"]
    assert failures == [code for _, code in BAD_EXCHANGES.values()]


# --- reading a log ----------------------------------------------------------------------------------


def _reconcile(server_ledger: Ledger, client_ledger: Ledger) -> tuple[list[tuple[int, bytes]], list[str]]:
    """What `differences` finds the server holds in the ranges that differ, and the requests the server served."""
    server, client = _noise_host(), _noise_host()
    served: list[str] = []
    serve(server, server_ledger.view, read, lambda peer, outcome: served.append(outcome))
    index = SetIndex()
    index.catch_up(client_ledger.view())

    async def main() -> list[tuple[int, bytes]]:
        with trio.fail_after(TIMEOUT):
            async with running(server, client):
                peer = await connect(client, full_addrs(server)[0], 10)
                return await differences(client, peer, index)

    return trio.run(main), served


@pytest.mark.parametrize("held", [0, 30, 84, 85])
def test_reconciliation_lists_what_the_peer_holds_and_this_node_lacks(tmp_path, target, history, held):
    source = open_ledger(tmp_path / "whole")
    try:
        ingest(source, history)
        ingest(target, history[:held])
        found, served = _reconcile(source, target)
        lacking = {block.cid.raw for block in history[held:]}
        assert {cid for _, cid in found if not target.view().has(CID(cid))} == lacking
        assert all(source.view().clock(CID(cid)) == clock for clock, cid in found)  # each with its true clock
        assert set(served) == {"ok"}
        if held == len(history):
            assert len(served) == 1 and found == []  # equal sets: one request of 16 fingerprints, nothing listed
    finally:
        source.close()


def test_reconciliation_of_large_sets_lists_little_more_than_the_difference(tmp_path):
    """2,000 operations on each side, a few on one side only: ranges are split down to where they differ, so
    what is listed is a small multiple of the difference, not the set."""
    rng = random.Random(7)
    blocks = random_history(rng, 2000)
    absent = set(rng.sample(range(len(blocks)), 5))
    whole, partial = open_ledger(tmp_path / "whole"), open_ledger(tmp_path / "partial")
    try:
        ingest(whole, blocks)
        ingest(partial, [block for number, block in enumerate(blocks) if number not in absent])  # some pending
        found, served = _reconcile(whole, partial)
        assert {cid for _, cid in found if not partial.view().has(CID(cid))} == {blocks[n].cid.raw for n in absent}
        assert len(found) <= len(absent) * LIST_BELOW
        assert len(served) <= 1 + len(LEVELS) + len(LEVELS)  # sums per level, then lists per level
        found, _ = _reconcile(partial, whole)  # the other way: the partial side holds nothing the whole lacks
        assert all(whole.view().has(CID(cid)) for _, cid in found)
    finally:
        whole.close()
        partial.close()


def stream_server(host: IHost, respond: Callable[[bytes], AsyncIterator[bytes]]) -> None:
    """A sync server that sends what `respond(request)` yields for each request (its stream is reset if it raises)."""

    async def handler(stream: INetStream) -> None:
        try:
            data = await FrameReader(stream, MAX_REQUEST, 10).read_frame()
            if data is None:
                raise SyncError("sync.stream", "the request never came")
            writer = FrameWriter(stream)
            async for payload in respond(data):
                await writer.send(payload)
            await writer.flush()
            await stream.close()
        except Exception:
            with trio.CancelScope(shield=True):
                await stream.reset()

    host.set_stream_handler(SYNC_PROTOCOL, handler)


def lying_server(host: IHost, answer: Callable[[dict[str, Any]], list[bytes]]) -> None:
    """A sync server whose answers `answer` makes up."""

    async def respond(data: bytes) -> AsyncIterator[bytes]:
        for payload in answer(codec.decode(data)):
            yield payload

    stream_server(host, respond)


def _flip(data: bytes, at: int = -1) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + (data[at + 1 :] if at != -1 else b"")


def honest_answer(ledger: Ledger) -> Callable[[dict[str, Any]], list[bytes]]:
    def answer(request: dict[str, Any]) -> list[bytes]:
        view = ledger.view()
        if request["get"] == "head":
            return [view.tree_head().to_bytes()]
        if request["get"] == "consistency":
            proof = view.consistency_proof(request["old"], request["new"])["proof"]
            return [codec.encode({"proof": [bytes.fromhex(h) for h in proof]})]
        start, end, size = request["from"], request["to"], request["size"]
        proof = view.consistency_proof(end, size)["proof"] if end < size else []
        return [*view.entries(start, end), codec.encode({"proof": [bytes.fromhex(h) for h in proof]})]

    return answer


def _log_of_invalid() -> tuple[AuthorKey, list[bytes]]:
    """A node key and a log its node signs although it holds an operation whose signature does not verify."""
    valid = f.add("When a rogue node logs operations, check each one before trusting its log.")
    forged = valid.data[:-1] + bytes([valid.data[-1] ^ 1])  # the last byte of the signature
    return AuthorKey(b"\x42" * 32), [valid.data, forged]


def _lies(source: Ledger) -> dict[str, tuple[Callable, str]]:
    honest = honest_answer(source)

    def bad_signature(request: dict[str, Any]) -> list[bytes]:
        head = source.view().tree_head()
        return [TreeHead(head.size, head.root, head.timestamp, head.node, _flip(head.signature)).to_bytes()]

    def with_sums(make: Callable[[dict[str, Any]], list[bytes]]) -> Callable[[dict[str, Any]], list[bytes]]:
        def answer(request: dict[str, Any]) -> list[bytes]:
            return make(request) if request["get"] in ("sums", "list") else honest(request)

        return answer

    outside = next(block.cid.raw for block in random_history(random.Random(3), 5) if block.cid.raw[4] >= 0x80)

    def listing(request: dict[str, Any]) -> list[bytes]:
        if request["get"] == "sums":  # the first range differs and holds one operation: it is listed
            return [codec.encode({"sums": [[1, b"\x01" * 32]] + [[0, bytes(32)]] * 15})]
        return [codec.encode([1, outside])]

    return {
        "a head with a bad signature": (bad_signature, "sync.head.signature"),
        "a head that is not a head": (lambda request: [b"\xa1\x61x\x01"], "sync.head"),
        "two heads": (lambda request: honest(request) * 2, "sync.response.count"),
        "fingerprints of the wrong number": (
            with_sums(lambda request: [codec.encode({"sums": [[0, bytes(32)]] * 3})]),
            "sync.sums",
        ),
        "a fingerprint that is not one": (
            with_sums(lambda request: [codec.encode({"sums": [[0, b"short"]] * 16})]),
            "sync.sums",
        ),
        "a listed CID outside the ranges asked for": (with_sums(listing), "sync.list"),
    }


LIES = [
    "a head with a bad signature",
    "a head that is not a head",
    "two heads",
    "fingerprints of the wrong number",
    "a fingerprint that is not one",
    "a listed CID outside the ranges asked for",
]


@pytest.mark.parametrize("lie", LIES)
def test_a_server_that_lies_is_caught_before_anything_it_sent_is_trusted(tmp_path, source, lie):
    answer, code = _lies(source)[lie]
    server, client = _noise_host(), _noise_host()
    lying_server(server, answer)
    states = LogStates(tmp_path / "p2p")

    async def main() -> None:
        with trio.fail_after(TIMEOUT):
            async with running(server, client):
                peer = await connect(client, full_addrs(server)[0], 10)
                with pytest.raises(Misbehaviour) as caught:
                    await verify_head(client, peer, states)
                    await differences(client, peer, SetIndex())
                assert caught.value.code == code, caught.value

    trio.run(main)


# --- forks ------------------------------------------------------------------------------------------


def _fork_case(tmp_path: Path, history: list, kind: str) -> tuple[Ledger, Ledger]:
    """The node's first history (40 operations), and a second one signed by the same node key."""
    first = open_ledger(tmp_path / "first")
    ingest(first, history[:40])
    second = ledger_with_key(tmp_path / "second", tmp_path / "first" / NODE_KEY)
    other = random_history(random.Random(5), 60)
    match kind:
        case "grown differently":  # its first 20 are the same, then another history, longer
            ingest(second, history[:20] + other[:30])
        case "same size":
            ingest(second, other[:40])
        case "rolled back and diverged":  # shorter than the head it signed before, and not a prefix of it
            ingest(second, history[:10] + other[:20])
    assert first.node_key.did == second.node_key.did
    return first, second


FORKS = [
    "grown differently",
    "same size",
    "rolled back and diverged",
]


@pytest.mark.parametrize("kind", FORKS)
def test_a_node_that_signs_two_histories_is_caught_with_both_heads(tmp_path, history, kind):
    first, second = _fork_case(tmp_path, history, kind)
    serving = {"ledger": first}
    server, client = _noise_host(), _noise_host()
    serve(server, lambda: serving["ledger"].view(), read, lambda peer, outcome: None)
    states = LogStates(tmp_path / "p2p")

    async def main() -> ForkDetected:
        with trio.fail_after(TIMEOUT):
            async with running(server, client):
                peer = await connect(client, full_addrs(server)[0], 10)
                assert (await verify_head(client, peer, states)).size == 40
                serving["ledger"] = second  # the same node key now serves another history
                with pytest.raises(ForkDetected) as caught:
                    await verify_head(client, peer, states)
                states.record_fork(caught.value)
                with pytest.raises(ForkDetected):  # refused from now on
                    await verify_head(client, peer, states)
                return caught.value

    try:
        fork = trio.run(main)
    finally:
        first.close()
        second.close()
    earlier, later = TreeHead.from_bytes(fork.evidence["earlier"]), TreeHead.from_bytes(fork.evidence["later"])
    assert earlier.verify() and later.verify()  # evidence anyone can check: both heads are signed by the node
    assert earlier.node == later.node == fork.evidence["node"] == first.node_key.did
    assert (earlier.size, later.size) == (40, {"grown differently": 50, "same size": 40}.get(kind, 30))
    assert first.node_key.did in LogStates(tmp_path / "p2p").refused  # remembered across restarts
    assert LogStates(tmp_path / "p2p").get(first.node_key.did).head == earlier  # the verified head, kept


# --- bans ---------------------------------------------------------------------------------------------


class LedgerPortOverLedger:
    """What P2PNode needs of the node, over a real ledger (the daemon's Node adds only its queue)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger, self.params, self.node_did = ledger, ledger.params, ledger.node_key.did
        self.writer = trio.Lock()  # one ingest at a time, as the node's single writer
        self.released: list[CID] = []  # operations stored pending that a later batch applied

    def view(self) -> Any:
        return self.ledger.view()

    async def read(self, function: Callable[..., Any], *args: Any) -> Any:
        return await read(function, *args)

    async def ingest(
        self,
        ops: list[bytes | Block],
        source: Source,
        *,
        wait: bool,
        lane: str | None = None,
        queued: trio.Event | None = None,
    ) -> list[Any]:
        try:
            await self.writer.acquire()  # trio's locks are fair: holders in the order they asked
        finally:
            if queued is not None:
                queued.set()
        try:
            submissions = [Submission.of(op, source) for op in ops]
            return await trio.to_thread.run_sync(partial(self.ledger.ingest, submissions, released=self.released))
        finally:
            self.writer.release()


def test_a_fresh_node_catches_up_from_three_peers_fetching_each_operation_once(tmp_path):
    """700 operations held by three peers: the fresh node reconciles with each, then fetches every operation
    once, in chunks spread over the peers, and ends with the same state root."""
    history = random_history(random.Random(21), 700)
    holders = [open_ledger(tmp_path / f"holder{number}") for number in range(3)]
    fresh = open_ledger(tmp_path / "fresh")
    for ledger in holders:
        ingest(ledger, history)

    ports = {}

    def p2p_node(ledger: Ledger, name: str, bootstrap: list[str]) -> P2PNode:
        port = ports[name] = LedgerPortOverLedger(ledger)
        return P2PNode(
            key_pair(secrets.token_bytes(32)),
            ["/ip4/127.0.0.1/tcp/0"],
            bootstrap,
            port,
            LogStates(tmp_path / name),
            target_peers=0,
        )

    async def main() -> P2PNode:
        with trio.fail_after(TIMEOUT * 2):
            async with trio.open_nursery() as nursery:
                servers = [p2p_node(ledger, f"p2p{number}", []) for number, ledger in enumerate(holders)]
                addrs = [(await nursery.start(server.run))[0] for server in servers]
                client = p2p_node(fresh, "p2p-fresh", addrs)
                await nursery.start(client.run)
                while fresh.view().log_size < len(history) or client.sync_status()["state"] != "in sync":
                    await trio.sleep(0.05)
                for node in [*servers, client]:
                    node.stop.set()
        return client

    try:
        client = trio.run(main)
        assert fresh.view().state_root() == holders[0].view().state_root()
        assert (client.counters.sync_fetched, client.counters.sync_duplicates) == (len(history), 0)
        assert ports["p2p-fresh"].released == []  # queued in clock order: none waited in the ledger as pending,
        assert fresh.waited == 0  # not even within a batch (a chunk in the peer's CID order stored most pending)
        shares = [peer.fetched for peer in client.peers.values()]
        assert sum(shares) == len(history) and sum(1 for share in shares if share) >= 2  # spread over peers
    finally:
        for ledger in [*holders, fresh]:
            ledger.close()


def ledger_node(ledger: Ledger, state: Path, bootstrap: list[str] | None = None) -> P2PNode:
    """A p2p node of `ledger` on a free port that seeks no peers of its own (the test connects it)."""
    return P2PNode(
        key_pair(secrets.token_bytes(32)),
        ["/ip4/127.0.0.1/tcp/0"],
        bootstrap or [],
        LedgerPortOverLedger(ledger),
        LogStates(state),
        target_peers=0,
    )


async def until(check: Callable[[], Any]) -> Any:
    """Poll `check` every 10 ms until it gives something true, and return that (the test's fail_after bounds it)."""
    while not (result := check()):
        await trio.sleep(0.01)
    return result


def sync_server(host: IHost, ledger: Ledger, before: Callable[[str], Awaitable[None]]) -> None:
    """A sync server that answers as a node does, after `before(kind)` of each request (which may hold it, or raise
    to reset its stream)."""
    index = SetIndex()

    async def respond(data: bytes) -> AsyncIterator[bytes]:
        await before(codec.decode(data)["get"])
        async for payload in answer_request(ledger.view(), data, read, index):
            yield payload

    stream_server(host, respond)


def failing_fetches(host: IHost, ledger: Ledger) -> None:
    """A sync server that answers every request as a node does except `blocks`, whose stream it resets: a peer
    that lists operations and then fails every fetch of them (as the overloaded peers of a 50-daemon run did)."""

    async def before(kind: str) -> None:
        if kind == "blocks":
            raise SyncError("sync.stream", "this server fails every fetch")

    sync_server(host, ledger, before)


def _looked_again(node: P2PNode) -> dict[str, Any] | None:
    status = node.sync_status()
    return status if status["state"] == "in sync" or status.get("stranded") else None


def test_operations_whose_only_holder_fails_the_fetch_stay_wanted_until_another_peer_serves_them(tmp_path):
    """The fresh node finds 40 operations missing at its one peer, which fails every fetch (as the hub of 50
    daemons failed to fetch 300 from the one peer that had listed them): it keeps them wanted and says "catching
    up" (it forgot them and said "in sync"), then fetches each once from the next peer that lists them."""
    history = random_history(random.Random(31), 40)
    holders = [open_ledger(tmp_path / f"holder{number}") for number in range(2)]
    fresh = open_ledger(tmp_path / "fresh")
    for ledger in holders:
        ingest(ledger, history)
    failing = _noise_host()
    failing_fetches(failing, holders[0])

    async def main() -> tuple[dict[str, Any], P2PNode, P2PNode]:
        with trio.fail_after(TIMEOUT * 2):
            async with trio.open_nursery() as nursery, running(failing):
                server = ledger_node(holders[1], tmp_path / "p2p-server")
                client = ledger_node(fresh, tmp_path / "p2p-fresh")
                server_addrs = await nursery.start(server.run)
                await nursery.start(client.run)
                await client.connect(full_addrs(failing)[0])
                await until(lambda: client.sync_status()["behind"] == len(history))  # found missing
                # the fetch has failed: the operations are either kept (stranded) or forgotten ("in sync")
                left = await until(partial(_looked_again, client))
                await client.connect(server_addrs[0])
                await until(lambda: fresh.view().log_size == len(history) and not client.sync_status()["behind"])
                for node in (server, client):
                    node.stop.set()
        return left, client, server

    try:
        left, client, server = trio.run(main)
        assert (left["state"], left["behind"], left.get("stranded")) == ("catching up", len(history), len(history))
        assert fresh.view().state_root() == holders[1].view().state_root()
        assert (client.counters.sync_fetched, client.counters.sync_duplicates) == (len(history), 0)
        assert (client.peer(failing.get_id()).fetched, client.peer(server.id).fetched) == (0, len(history))
    finally:
        for ledger in [*holders, fresh]:
            ledger.close()


def held_fetches(host: IHost, ledger: Ledger, asked: list[str], release: trio.Event) -> None:
    """A sync server that answers as a node does, but holds every `blocks` request until `release` is set (a fetch
    in progress); `asked` receives the kind of each request, in order."""

    async def before(kind: str) -> None:
        asked.append(kind)
        if kind == "blocks":
            await release.wait()

    sync_server(host, ledger, before)


def test_a_round_with_a_peer_whose_listing_is_still_being_fetched_does_not_list_it_again(tmp_path):
    """The peer listed 40 operations this node lacks and their fetch is on: a second round with it, at the same head,
    asks for its head and nothing more (it listed everything again, at every 10 s round of a catch-up); once they are
    fetched, each once, the node is in sync."""
    history = random_history(random.Random(41), 40)
    holder, fresh = open_ledger(tmp_path / "holder"), open_ledger(tmp_path / "fresh")
    ingest(holder, history)
    server, asked, release = _noise_host(), [], trio.Event()
    held_fetches(server, holder, asked, release)
    client = ledger_node(fresh, tmp_path / "p2p-fresh")

    async def main() -> list[str]:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery, running(server):
                await nursery.start(client.run)
                peer = client.peer(await client.connect(full_addrs(server)[0]))
                await until(lambda: "blocks" in asked)  # listed, and the fetch is on
                first = peer.last_sync
                peer.wanted.set()  # a gossip hint, or the round's interval ending
                await until(lambda: peer.last_sync != first)
                rounds = list(asked)
                release.set()
                await until(lambda: fresh.view().log_size == len(history) and not client.sync_status()["behind"])
                client.stop.set()
        return rounds

    try:
        rounds = trio.run(main)
        assert rounds.count("list") == 1 and rounds[-1] == "head", rounds
        assert (client.counters.sync_fetched, client.counters.sync_duplicates) == (len(history), 0)
        assert fresh.view().state_root() == holder.view().state_root()
    finally:
        holder.close()
        fresh.close()


def test_a_peer_that_holds_exactly_what_is_being_fetched_is_not_listed_but_asked_for_it(tmp_path):
    """Two peers hold the same 40 operations. The first lists them and their fetch is on; the second's fingerprints
    equal those of what the node holds and is getting, so its round lists nothing (a catch-up from 5 peers listed
    everything 5 times), yet it is known to hold them all: the fetcher may ask it. Each is fetched once."""
    history = random_history(random.Random(43), 40)
    holders = [open_ledger(tmp_path / f"holder{number}") for number in range(2)]
    fresh = open_ledger(tmp_path / "fresh")
    for ledger in holders:
        ingest(ledger, history)
    servers, asked, release = [_noise_host(), _noise_host()], [[], []], trio.Event()
    for server, ledger, kinds in zip(servers, holders, asked, strict=True):
        held_fetches(server, ledger, kinds, release)
    client = ledger_node(fresh, tmp_path / "p2p-fresh")

    async def main() -> list[set[ID]]:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery, running(*servers):
                await nursery.start(client.run)
                await client.connect(full_addrs(servers[0])[0])
                await until(lambda: "blocks" in asked[0])  # listed, and the fetch is on
                second = client.peer(await client.connect(full_addrs(servers[1])[0]))
                await until(lambda: second.last_sync)
                holders_then = [want.peers for want in client.fetcher.wanted.values()]
                release.set()
                await until(lambda: fresh.view().log_size == len(history) and not client.sync_status()["behind"])
                client.stop.set()
        return holders_then

    try:
        holders_then = trio.run(main)
        assert asked[0].count("list") == 1 and "list" not in asked[1] and "sums" in asked[1], asked
        assert holders_then == [{servers[0].get_id(), servers[1].get_id()}] * len(history)
        assert (client.counters.sync_fetched, client.counters.sync_duplicates) == (len(history), 0)
        assert fresh.view().state_root() == holders[0].view().state_root()
        assert len(client.fetcher.on_the_way.within(0, 0)) == 0  # nothing left on its way once stored
    finally:
        for ledger in [*holders, fresh]:
            ledger.close()


def test_a_fresh_node_reconciling_with_three_peers_at_once_lists_their_operations_once(tmp_path):
    """Three peers hold the same 60 operations and the fresh node connects to all at once: their rounds reconcile
    one after another, so only the first lists them (each listed all of them, at once), and all three are known
    to hold every one (the fetch is spread over them)."""
    history = random_history(random.Random(47), 60)
    holders = [open_ledger(tmp_path / f"holder{number}") for number in range(3)]
    fresh = open_ledger(tmp_path / "fresh")
    for ledger in holders:
        ingest(ledger, history)
    servers, asked, release = [_noise_host() for _ in holders], [[] for _ in holders], trio.Event()
    for server, ledger, kinds in zip(servers, holders, asked, strict=True):
        held_fetches(server, ledger, kinds, release)

    async def main() -> tuple[list[set[ID]], P2PNode]:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery, running(*servers):
                bootstrap = [full_addrs(server)[0] for server in servers]  # dialled at once
                client = ledger_node(fresh, tmp_path / "p2p-fresh", bootstrap)
                await nursery.start(client.run)
                await until(lambda: all(client.peer(server.get_id()).last_sync for server in servers))
                holders_then = [want.peers for want in client.fetcher.wanted.values()]
                release.set()
                await until(lambda: fresh.view().log_size == len(history) and not client.sync_status()["behind"])
                client.stop.set()
        return holders_then, client

    try:
        holders_then, client = trio.run(main)
        assert sum(kinds.count("list") for kinds in asked) == 1, asked
        assert holders_then == [{server.get_id() for server in servers}] * len(history)
        assert (client.counters.sync_fetched, client.counters.sync_duplicates) == (len(history), 0)
        assert fresh.view().state_root() == holders[0].view().state_root()
    finally:
        for ledger in [*holders, fresh]:
            ledger.close()


def test_discovery_does_not_close_a_surplus_peer_sync_needs():
    """Four peers above a target of one: the newest three are surplus, but the one sync needs (it listed operations
    this node still lacks, or a read from it is on) stays connected."""
    hub, peers = _noise_host(), [_noise_host() for _ in range(4)]
    needed = {peers[3].get_id()}
    since = {peer.get_id(): 1.0 + number for number, peer in enumerate(peers)}  # long past TRIM_GRACE, oldest first

    async def never(addr: str) -> ID:
        raise AssertionError("trimming dials no one")

    discovery = Discovery(hub, list, lambda peer: False, never, since.get, 1, lambda: needed)

    async def main() -> set[ID]:
        with trio.fail_after(TIMEOUT):
            async with running(hub, *peers):
                for peer in peers:
                    await connect(peer, full_addrs(hub)[0], 10)
                while len(hub.get_connected_peers()) < len(peers):
                    await trio.sleep(0.01)
                await discovery._trim(list(hub.get_connected_peers()))
                while len(hub.get_connected_peers()) > 2:
                    await trio.sleep(0.01)
                return set(hub.get_connected_peers())

    assert trio.run(main) == {peers[0].get_id(), peers[3].get_id()}  # the oldest and the needed one
    assert discovery.closing == set()


def test_two_bans_at_once_leave_the_node_running(tmp_path, target):
    node = P2PNode(
        key_pair(secrets.token_bytes(32)),
        ["/ip4/127.0.0.1/tcp/0"],
        [],
        LedgerPortOverLedger(target),
        LogStates(tmp_path),
    )
    rogue = _noise_host()

    async def main() -> None:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(node.run)
                async with running(rogue):
                    await connect(rogue, addrs[0], 10)
                    while rogue.get_id() not in node.pubsub.peers:  # its pubsub stream is up: what a ban tears down
                        await trio.sleep(0.01)
                    peer = node.peer(rogue.get_id())
                    async with trio.open_nursery() as bans:
                        for _ in range(2):
                            bans.start_soon(node.ban, peer, 600.0, "two penalties at once")
                    while rogue.get_id() in node.host.get_connected_peers():
                        await trio.sleep(0.01)
                    honest = _noise_host()  # the node still serves
                    async with running(honest):
                        peer_id = await connect(honest, addrs[0], 10)
                        (head,) = await ask(honest, peer_id, {"get": "head"}, 1)
                        assert TreeHead.from_bytes(head).node == target.node_key.did
                node.stop.set()

    trio.run(main)
    assert node.peer(rogue.get_id()).banned


def test_a_peer_that_does_not_speak_sync_leaves_the_node_in_sync(tmp_path, target):
    """A libp2p peer that is not a node (tests/interop's JS peer: gossip only) answers "na" to
    the sync protocol: the node stops asking it and does not wait for it to say "in sync"."""
    node = P2PNode(
        key_pair(secrets.token_bytes(32)),
        ["/ip4/127.0.0.1/tcp/0"],
        [],
        LedgerPortOverLedger(target),
        LogStates(tmp_path),
    )
    gossip_only = _noise_host()

    async def main() -> dict[str, Any]:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(node.run)
                async with running(gossip_only):
                    await connect(gossip_only, addrs[0], 10)
                    peer = node.peer(gossip_only.get_id())
                    while peer.sync_state == "idle" or peer.in_flight:  # the round at connect has ended
                        await trio.sleep(0.01)
                    status = node.sync_status()
                node.stop.set()
        return status

    status = trio.run(main)
    assert (status["state"], status["unreconciled"], status["peers"]) == ("in sync", 0, 1)
    assert node.peer(gossip_only.get_id()).sync_state == "failed: sync.unsupported"


# --- gossip copies ----------------------------------------------------------------------------------


def test_a_message_arriving_from_two_peers_while_in_validation_is_validated_and_delivered_once():
    """A publishes; B validates at once and forwards, so B's copy reaches C while C still validates A's (C's
    validator takes 0.5 s). py-libp2p 0.8.1 alone validates and delivers both; `drop_copies_in_validation` one."""
    hosts = [_noise_host() for _ in range(3)]
    pubsubs = [build_pubsub(host, TOPIC) for host in hosts]
    for pubsub in pubsubs:
        drop_copies_in_validation(pubsub)
    validated: list[bytes] = []

    async def slow(forwarder: ID, origin: ID, data: bytes) -> bool:
        validated.append(data)
        await trio.sleep(0.5)
        return True

    async def fast(forwarder: ID, origin: ID, data: bytes) -> bool:
        return True

    set_validator(pubsubs[1], TOPIC, fast)
    set_validator(pubsubs[2], TOPIC, slow)

    async def main() -> list[bytes]:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                done = trio.Event()
                started = [trio.Event() for _ in hosts]

                async def run(number: int) -> None:
                    async with run_host(hosts[number], pubsubs[number], LISTEN):
                        started[number].set()
                        await done.wait()

                for number in range(3):
                    nursery.start_soon(run, number)
                for event in started:
                    await event.wait()
                subscriptions = [await pubsub.subscribe(TOPIC) for pubsub in pubsubs]
                for a, b in ((0, 1), (0, 2), (1, 2)):
                    await connect(hosts[a], full_addrs(hosts[b])[0], 10)
                meshes = [pubsub.router.mesh for pubsub in pubsubs]  # type: ignore[attr-defined]
                while any(len(mesh.get(TOPIC, ())) < 2 for mesh in meshes):  # the heartbeat grafts each pair
                    await trio.sleep(0.05)
                await pubsubs[0].publish(TOPIC, b"one message")
                received = [(await subscriptions[2].get()).data]
                with trio.move_on_after(2):  # a second copy, if any, comes within B's forward plus C's validation
                    received.append((await subscriptions[2].get()).data)
                done.set()
                return received

    assert trio.run(main) == [b"one message"]
    assert validated == [b"one message"]
