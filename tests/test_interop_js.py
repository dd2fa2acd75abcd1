"""Interop with another libp2p implementation: a js-libp2p peer (tests/interop/peer.mjs) joins a devnet of real
daemons over TCP + Noise + yamux + multistream, on the network's gossipsub topic.

Both ways: the JS peer receives the operations our nodes gossip and checks each with JavaScript libraries only
(@ipld/dag-cbor, multiformats, @noble/curves); then it publishes an operation it built and signed itself, which
every Python node must accept and apply. The JS packages are installed from tests/interop/package-lock.json
(`npm ci`); docs/INTEROP.md says what each side had to agree on.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger.embedder import embedder_for, pack_float16
from ledger.params import NetworkParams
from tests.daemons import Daemon
from tests.test_network import Network, add, addr, converged, has, network, peer_id, wait_until

INTEROP = Path(__file__).parent / "interop"
NODE, NPM = shutil.which("node"), shutil.which("npm")
NPM_TIMEOUT = 600.0  # a first install downloads ~110 packages; later runs reuse node_modules or npm's cache
EVENT_TIMEOUT = 30.0  # seconds to wait for one event of the JS peer
STAMP = INTEROP / "node_modules" / ".expledger-lock.sha256"

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None, reason="node and npm are not on PATH: the js-libp2p interop test needs Node.js 20+"
)

#: what the JS peer writes and signs (an add, so its embedding comes from our embedder: see docs/INTEROP.md)
JS_TEXT = "When a peer from another implementation joins, verify each gossiped operation before trusting it."
JS_CONTENT = {"text": JS_TEXT, "domain": ["p2p", "interop"], "confidence": 0.75}


@pytest.fixture(scope="module")
def js_packages() -> Path:
    """`npm ci` in tests/interop, exactly the lockfile's packages; skipped when node_modules already holds them."""
    lock = hashlib.sha256((INTEROP / "package-lock.json").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != lock:
        result = subprocess.run(
            [NPM, "ci", "--prefer-offline", "--no-audit", "--no-fund"],
            cwd=INTEROP,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT,
        )
        assert result.returncode == 0, f"npm ci failed in {INTEROP}:\n{result.stderr[-3000:]}"
        STAMP.write_text(lock)
    return INTEROP


class JsPeer:
    """The JS peer as a process: its JSON events read by a thread into a queue, commands written to its stdin."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def wait_for(self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = EVENT_TIMEOUT) -> Any:
        """The first event (seen before or arriving now) that `match` accepts; fails naming `what`."""
        for event in self.seen:
            if match(event):
                return event
        try:
            while True:
                event = self.events.get(timeout=timeout)
                self.seen.append(event)
                assert event["event"] != "error", f"the JS peer reported an error: {event}"
                if match(event):
                    return event
        except queue.Empty:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for the JS peer: {what}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def js_peer(folder: Path, network_id: str, connect: list[str], log: Path) -> Iterator[JsPeer]:
    argv = [str(NODE), str(folder / "peer.mjs"), "--network", network_id]
    for address in connect:
        argv += ["--connect", address]
    with open(log, "w") as stderr:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    peer = JsPeer(process)
    try:
        yield peer
    finally:
        peer.stop()


def operations_verified(peer: JsPeer, cids: set[str]) -> dict[str, dict[str, Any]]:
    """The JS peer's findings on each of `cids`, once it has reported on all of them."""
    found: dict[str, dict[str, Any]] = {}

    def collect(event: dict[str, Any]) -> bool:
        if event["event"] == "operation" and event["cid"] in cids:
            found[event["cid"]] = event
        return found.keys() == cids

    peer.wait_for(collect, f"its verdicts on {sorted(cids)}")
    return found


def start_star(net: Network, names: list[str]) -> list[Daemon]:
    """Daemons initialised and started at once (each loads for seconds), then joined to the first as a star.
    They rank by the network's embedding: no background model to load and run beside the test."""

    def make_home(name: str) -> None:
        config = net.home(name) / "config.toml"
        config.write_text(re.sub(r'(?m)^model = ".*"$', 'model = "network"', config.read_text(), count=1))

    make_home(names[0])  # the first home writes the genesis the others copy
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(make_home, names[1:]))
        nodes = list(pool.map(net.start, names))
    for node in nodes[1:]:
        node.call("peers.connect", {"addr": addr(nodes[0])})
    wait_until(lambda: nodes[0].call("status")["p2p"]["sync"]["peers"] == len(nodes) - 1, "the star linked")
    return nodes


def js_peer_record(node: Daemon, js_id: str) -> dict[str, Any] | None:
    return next((p for p in node.call("peers")["peers"] if p["peer_id"] == js_id), None)


def test_a_js_libp2p_peer_verifies_our_operations_and_ours_apply_its_own(tmp_path, js_packages):
    with network(tmp_path) as net:
        n1, n2, n3 = nodes = start_star(net, ["n1", "n2", "n3"])
        params = NetworkParams.from_file(net.genesis)

        # the JS peer dials n2 only: what n3 publishes reaches it through two Python hops (n1, n2), and the reverse
        with js_peer(js_packages, params.network_id, [addr(n2)], tmp_path / "js-peer.stderr") as js:
            ready = js.wait_for(lambda event: event["event"] == "ready", "ready")
            assert ready["topic"] == n2.call("peers")["self"]["topic"] == f"/expledger/{params.network_id}/ops/1"
            js.wait_for(
                lambda event: event["event"] == "peers" and peer_id(n2) in event["mesh"], "n2 in its topic mesh"
            )
            wait_until(lambda: js_peer_record(n2, ready["peer_id"]) is not None, "n2 to list the JS peer")

            # ours -> JS: every operation decoded, its CID recomputed, its author's signature verified in JS
            made = {
                add(n1, "When a proof uses a lemma, state the lemma's conditions and check each one."): n1,
                add(n3, "When a word problem gives rates, write every quantity in the same units.", "math.rates"): n3,
                add(n2, "When a matrix is triangular, read its determinant off the diagonal.", "math.algebra"): n2,
            }
            verified = operations_verified(js, set(made))
            for cid, op in verified.items():
                assert op["valid"] and op["canonical"] and op["signature"] == "valid" and op["altered_rejected"], op
                assert op["kind"] == "add" and op["author"] == made[cid].call("status")["author"]
            batches = [event for event in js.seen if event["event"] == "batch"]
            assert all(batch["accepted"] for batch in batches)
            from_n3 = next(b for b in batches if b["origin"] == peer_id(n3))
            assert from_n3["forwarder"] == peer_id(n2)  # signed by n3's peer key, relayed by n1 and n2

            # JS -> ours: an add the JS peer builds and signs, with the embedding our pinned model gives its text
            values = pack_float16(embedder_for(params).embed([JS_TEXT])[0]).hex()
            embedding = {"model": params.embedding_model, "dim": params.embedding_dim, "values": values}
            js.send({"cmd": "publish", **JS_CONTENT, "embedding": embedding})
            published = js.wait_for(lambda event: event["event"] == "published", "its publish")
            assert peer_id(n2) in published["recipients"]
            assert published["parents"] and set(published["parents"]) <= set(made)
            js_cid = published["cid"]
            for node in nodes:
                wait_until(lambda node=node: has(node, js_cid), f"the JS peer's operation applied on {node.home.name}")
                shown = node.call("get", {"id": js_cid})
                assert shown["text"] == JS_TEXT and shown["library"]["status"] == "live"
                assert shown["metadata"]["created_by"] == shown["library"]["created_by"] == ready["did"]
            wait_until(lambda: converged(nodes, len(made) + 1), "equal state roots with the JS peer's operation")
            # n2 took it by gossip (the JS peer serves no sync), and holds nothing against the JS peer
            record = js_peer_record(n2, ready["peer_id"])
            assert record is not None and record["operations_received"] == 1 and record["gossip_messages"] >= 1, record
            assert record["invalid"] == 0 and record["banned_for"] == 0, record
