"""A rogue peer for the hostile tests, as a process: a real libp2p host with GossipSub on the network's topic that
dials one node and, on command, floods it with duplicates and valid low-clock operations or sends it what no honest
node sends (garbage, bad signatures, non-canonical CBOR, oversized frames, malformed sync requests).

    python -m tests.rogue_peer TARGET_MULTIADDR NETWORK_ID

Commands on stdin, one a line; every event is one JSON line on stdout:

    flood-start [PAUSE_MS ROUNDS]
                            publish rounds of valid low-clock operations and duplicates until flood-stop (default:
                            a pause of 20 ms between rounds, at most 300 rounds; 0 and a large count: full speed)
    flood-stop              -> {"event": "flood-stopped", "rounds": n, "operations": n}
    attack STEP,STEP,...    run these steps in order -> {"event": "step", ...} each, then {"event": "attacked",
                            "orphans": [CID, ...]}: the operations sent so far whose parents nobody holds
    await-drop              -> {"event": "dropped", "disconnected": bool} once the target dropped us (or a deadline
                            passed)
    reconnect               dial the target again -> {"event": "reconnected", "dial": ..., "disconnected": bool}
    new-identity            leave, come back with a fresh peer key -> {"event": "ready", "peer_id": ...}
    quit (or end of input)  leave

The operations are signed for the deterministic test network of tests/factories.py (feature-hash embedder).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2
import trio
from libp2p.abc import IHost
from libp2p.network.stream.exceptions import StreamEOF, StreamReset
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub
from multiaddr import Multiaddr

from ledger import codec
from ledger.cid import CID
from ledger.keys import AuthorKey
from ledger.ops import Block, Kind
from p2p.gossip import GossipBatch, build_pubsub, publish, topic_for
from p2p.host import build_host, connect, full_addrs, key_pair
from p2p.service import route_library_logs, run_host
from p2p.sync import MAX_REQUEST, SYNC_PROTOCOL, frame
from tests import factories as f

LISTEN = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
READY_TIMEOUT = 30.0  # seconds to connect and see the target's subscription
DROP_TIMEOUT = 30.0  # seconds the target gets to disconnect us after an attack
STREAM_TIMEOUT = 15.0  # seconds a sync exchange may take (the server waits 10 s for a request)
FLOOD_ROUNDS = 300  # at most, whatever the time between flood-start and flood-stop
FLOOD_PAUSE = 0.02  # seconds between rounds: a flood, not a livelock of the test machine


DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def spelled(number: int) -> str:
    """A number in words, digit by digit: an experience's text may not hold a concrete number."""
    return " ".join(DIGITS[int(digit)] for digit in str(number))


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


@dataclass
class Rogue:
    host: IHost
    pubsub: Pubsub
    topic: str
    target: ID
    target_addr: str
    author: AuthorKey = field(default_factory=lambda: AuthorKey(secrets.token_bytes(32)))
    rounds: int = 0
    operations: int = 0
    last_batch: bytes = b""
    orphans: list[str] = field(default_factory=list)  # CIDs of operations whose parents nobody holds

    def connected(self) -> bool:
        return self.target in self.host.get_connected_peers()

    async def gossip(self, data: bytes) -> None:
        await publish(self.pubsub, self.topic, data)

    # --- valid, unpenalised: a flood of low-clock operations and duplicates -------------------------

    def low_clock_round(self) -> list[Block]:
        """An add at clock 1, and a vote and a modify of it also at clock 1 (too low: the fold voids them)."""
        number = self.rounds
        text = f"When flooding node {spelled(number)} with early operations, verify the answer against small cases."
        add = f.signed(f.operation(Kind.ADD, clock=1, content=f.content(text)), self.author)
        vote = f.signed(f.operation(Kind.VOTE, clock=1, parents=(add.cid,), target=add.cid, vote=-1), self.author)
        modify = f.signed(
            f.operation(
                Kind.MODIFY,
                clock=1,
                parents=(add.cid,),
                target=add.cid,
                content=f.content(f"When flooding node {spelled(number)}, check the boundary cases separately."),
            ),
            self.author,
        )
        return [add, vote, modify]

    async def flood(self, stop: trio.Event, pause: float = FLOOD_PAUSE, most: int = FLOOD_ROUNDS) -> None:
        while not stop.is_set() and self.rounds < most:
            blocks = self.low_clock_round()
            ops = [block.data for block in blocks]
            previous = list(GossipBatch.decode(self.last_batch).ops) if self.last_batch else []
            batch = GossipBatch((*ops, ops[0], *previous), f.author(1).did, 0).encode()  # duplicates inside
            await self.gossip(batch)
            if self.last_batch:
                await self.gossip(self.last_batch)  # the same batch again (a new message id)
            self.last_batch = GossipBatch(tuple(ops), f.author(1).did, 0).encode()
            self.rounds += 1
            self.operations += len(ops)
            with trio.move_on_after(pause):
                await stop.wait()

    # --- attack steps ----------------------------------------------------------------------------------

    def valid_block(self, text: str = "When a peer sends garbage, validate it against known cases first.") -> Block:
        return f.signed(f.operation(Kind.ADD, clock=1, content=f.content(text)), self.author)

    async def step(self, name: str) -> str:
        steps: dict[str, Callable[[], Awaitable[str]]] = {
            "gossip-duplicates": self.gossip_duplicates,
            "gossip-orphans": self.gossip_orphans,
            "gossip-garbage": lambda: self.sent(os.urandom(3000)),
            "gossip-non-canonical-batch": self.gossip_non_canonical_batch,
            "gossip-wrong-shape": lambda: self.sent(codec.encode({"ops": "all of them", "node": 7, "size": -1})),
            "gossip-bad-signature": self.gossip_bad_signature,
            "gossip-non-canonical-op": self.gossip_non_canonical_op,
            "gossip-oversized-op": lambda: self.sent(GossipBatch((b"\xa1" * 900_000,), self.author.did, 0).encode()),
            "sync-oversized-prefix": lambda: self.raw_sync(b"\xff\xff\xff\xff" + os.urandom(1000)),
            "sync-over-limit": lambda: self.raw_sync(frame(os.urandom(MAX_REQUEST + 1))),
            "sync-truncated": lambda: self.raw_sync(b"\x00\x01\x00\x00" + os.urandom(500)),
            "sync-garbage": lambda: self.raw_sync(frame(os.urandom(200))),
            "sync-unknown-get": lambda: self.raw_sync(frame(codec.encode({"get": "keys"}))),
            "sync-entries-past-log": lambda: self.raw_sync(
                frame(codec.encode({"get": "entries", "from": 0, "to": 2000, "size": 2**40}))
            ),
            "sync-bad-cid": lambda: self.raw_sync(frame(codec.encode({"get": "blocks", "cids": [b"\x00\x01"]}))),
        }
        try:
            return await steps[name]()
        except Exception as exc:  # the target may have dropped us mid-step: that is an outcome, not a crash
            return f"{type(exc).__name__}: {exc}"

    async def sent(self, data: bytes) -> str:
        await self.gossip(data)
        return f"published {len(data)} bytes"

    async def gossip_duplicates(self) -> str:
        blocks = self.low_clock_round()
        batch = GossipBatch(tuple(block.data for block in blocks), self.author.did, 0).encode()
        for _ in range(20):
            await self.gossip(batch)
        return "published one batch 20 times"

    async def gossip_orphans(self) -> str:
        """Valid operations naming parents that do not exist: they must wait outside the ledger, bounded."""
        blocks = []
        for number in range(50):
            ghost = CID.for_block(b"a parent nobody has %d %s" % (number, self.author.did.encode()))
            text = f"When parent {spelled(number)} never arrives, check the boundary cases separately."
            add = f.operation(Kind.ADD, clock=2, parents=(ghost,), content=f.content(text))
            blocks.append(f.signed(add, self.author))
        self.orphans += [str(block.cid) for block in blocks]
        return await self.sent(GossipBatch(tuple(block.data for block in blocks), self.author.did, 0).encode())

    async def gossip_non_canonical_batch(self) -> str:
        op = self.valid_block().data
        return await self.sent(cbor2.dumps({"size": 0, "node": self.author.did, "ops": [op]}))  # keys out of order

    async def gossip_bad_signature(self) -> str:
        data = self.valid_block("When signatures are forged, verify the answer against small cases.").data
        forged = data[:-1] + bytes([data[-1] ^ 1])
        return await self.sent(GossipBatch((forged,), self.author.did, 0).encode())

    async def gossip_non_canonical_op(self) -> str:
        block = self.valid_block("When encodings differ, look for a bijection with a simpler set.")
        record = codec.decode(block.data)
        shuffled = cbor2.dumps(dict(reversed(list(record.items()))))  # the same operation, keys out of order
        assert shuffled != block.data
        return await self.sent(GossipBatch((shuffled,), self.author.did, 0).encode())

    async def raw_sync(self, data: bytes) -> str:
        """Write `data` on a sync stream as is; how the target answered."""
        with trio.fail_after(STREAM_TIMEOUT):
            stream = await self.host.new_stream(self.target, [SYNC_PROTOCOL])
            try:
                await stream.write(data)
                await stream.close_write()
                received = 0
                while True:
                    try:
                        received += len(await stream.read(65536))
                    except StreamEOF:
                        return f"end of stream after {received} bytes"
                    except StreamReset:
                        return f"reset after {received} bytes"
            finally:
                with trio.CancelScope(shield=True):
                    await stream.reset()

    async def wait_dropped(self, timeout: float) -> bool:
        """Polls our own connection table: the target's disconnect reaches us as a closed connection."""
        with trio.move_on_after(timeout):
            while self.connected():
                await trio.sleep(0.05)
        return not self.connected()


async def commands(send: trio.MemorySendChannel[str]) -> None:
    """Lines of stdin, as they come (end of input: quit)."""
    async with send, trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        buffer = b""
        while chunk := await stdin.receive_some(4096):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                await send.send(line.decode().strip())
        await send.send("quit")


async def session(target_addr: str, topic: str, lines: trio.MemoryReceiveChannel[str]) -> bool:
    """One identity, from its dial to `new-identity` (True) or `quit` (False)."""
    host = build_host(key_pair(secrets.token_bytes(32)), LISTEN)
    pubsub = build_pubsub(host, topic)
    async with run_host(host, pubsub, LISTEN), trio.open_nursery() as nursery:
        target = await connect(host, target_addr, READY_TIMEOUT)
        await pubsub.subscribe(topic)
        with trio.fail_after(READY_TIMEOUT):  # the target's subscription reached us: our gossip reaches it
            while target not in pubsub.peer_topics.get(topic, set()):
                await trio.sleep(0.05)
        rogue = Rogue(host, pubsub, topic, target, target_addr)
        emit("ready", peer_id=str(host.get_id()), addrs=full_addrs(host))
        flood_stop = trio.Event()
        flood_done = trio.Event()
        async for line in lines:
            command, _, argument = line.partition(" ")
            if command == "flood-start":
                pause_ms, _, most = argument.partition(" ")
                pace = (float(pause_ms) / 1000, int(most)) if most else (FLOOD_PAUSE, FLOOD_ROUNDS)

                async def flood(pace: tuple[float, int]) -> None:
                    try:
                        await rogue.flood(flood_stop, *pace)
                    finally:
                        flood_done.set()

                nursery.start_soon(flood, pace)
                emit("flooding")
            elif command == "flood-stop":
                flood_stop.set()
                await flood_done.wait()
                emit("flood-stopped", rounds=rogue.rounds, operations=rogue.operations)
            elif command == "attack":
                for name in argument.split(","):
                    started = time.monotonic()
                    outcome = await rogue.step(name)
                    emit("step", name=name, outcome=outcome, seconds=round(time.monotonic() - started, 3))
                emit("attacked", orphans=rogue.orphans)
            elif command == "await-drop":
                emit("dropped", disconnected=await rogue.wait_dropped(DROP_TIMEOUT))
            elif command == "reconnect":
                try:
                    await connect(host, target_addr, READY_TIMEOUT)
                    dial = "connected"
                except Exception as exc:  # refused is one of the expected outcomes
                    dial = f"{type(exc).__name__}: {exc}"
                emit("reconnected", dial=dial, disconnected=await rogue.wait_dropped(DROP_TIMEOUT))
            elif command in ("new-identity", "quit"):
                flood_stop.set()
                nursery.cancel_scope.cancel()
                return command == "new-identity"
            else:
                emit("error", message=f"unknown command {line!r}")
    return False


async def main(target_addr: str, network_id: str) -> None:
    route_library_logs()
    topic = topic_for(network_id)
    send, receive = trio.open_memory_channel[str](100)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commands, send)
        while await session(target_addr, topic, receive):
            pass
        nursery.cancel_scope.cancel()
    emit("bye")


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
