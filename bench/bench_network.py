"""Network benchmark: a fresh node catching up by sync, and propagation latency across real daemons.

Usage: python -m bench.bench_network [--catch-up 10000] [--nodes 5] [--rates 10,100] [--seconds 10]
                                     [--skip catch-up|propagation]

Figures, each against a baseline measured in the same run:
  catch-up     N operations (bench.workload) ingested in-process into node A's data directory, in batches of
               1,000: the local ingest rate (the baseline). Then A runs as a daemon and a fresh node B,
               bootstrapped to A, reads A's log through sync: B's ops/s from its start until it holds all N,
               as a ratio to the local ingest rate (target >= 0.5). B's progress is printed as it goes.
  propagation  K daemons in a line (each bootstraps to the one before; separate processes). Operations are
               added through the RPC of nodes picked at random, at R per second for S seconds; every node's
               /events stream reports when each operation is applied there. Latency = applied on the last
               node - submit returned: p50/p95/max per rate (target p95 < 500 ms to all of 10 nodes at 100/s).
               The baseline is the same submit's own latency on the node that took it.

Every process runs on this machine: K daemons and the driver share its cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import websockets.exceptions
import websockets.sync.client

from bench.bench_index import percentile
from bench.workload import SUBJECTS, operations
from ledger.ledger import Ledger
from node.home import Home
from tests.daemons import Daemon, init_home, start

P2P = "/ip4/127.0.0.1/tcp/0"
BATCH = 1000


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def node_home(root: Path, name: str, genesis: Path | None, bootstrap: list[str]) -> Path:
    home = root / name
    init_home(home, network=genesis, p2p=P2P)
    config = home / "config.toml"
    listed = ", ".join(f'"{addr}"' for addr in bootstrap)
    config.write_text(config.read_text().replace("bootstrap = []", f"bootstrap = [{listed}]"))
    return home


def addr(node: Daemon) -> str:
    return (node.home / "p2p.addrs").read_text().split()[0]


# --- catch-up ------------------------------------------------------------------------------------------


def bench_catch_up(count: int) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        a_home = node_home(root, "a", None, [])
        params = Home(a_home).network()
        progress(f"generating and ingesting {count:,} operations into A in-process ...")
        ledger = Ledger.open(a_home / "data", params)
        elapsed = 0.0
        try:
            stream = (block.data for block in operations(count, params))
            done = 0
            while batch := list(itertools.islice(stream, BATCH)):
                started = time.perf_counter()
                ledger.ingest(batch)
                elapsed += time.perf_counter() - started
                done += len(batch)
                if done % 10_000 == 0:
                    progress(f"  {done:,} ingested ({done / elapsed:,.0f} ops/s)")
        finally:
            ledger.close()
        local = count / elapsed
        a = start(a_home)
        try:
            b_home = node_home(root, "b", a_home / "network.json", [addr(a)])
            started = time.perf_counter()
            b = start(b_home)
            try:
                last = -1
                while True:
                    size = b.call("status")["log_size"]
                    if size >= count:
                        break
                    if size != last:
                        sync = b.call("status")["p2p"]["sync"]
                        progress(f"  B: {size:,}/{count:,} ({sync['state']}, {time.perf_counter() - started:.1f} s)")
                        last = size
                    time.sleep(1.0)
                took = time.perf_counter() - started
                same = a.call("state_root") == b.call("state_root")
            finally:
                b.stop()
        finally:
            a.stop()
    rate = count / took
    print(f"\n## catch-up: a fresh node reads {count:,} operations from one peer\n")
    print("| local ingest (baseline) | catch-up by sync (from B's start) | ratio (target >= 0.5) | state roots equal |")
    print("| --- | --- | --- | --- |")
    print(f"| {local:,.0f} ops/s | {rate:,.0f} ops/s ({took:.1f} s) | **{rate / local:.2f}** | {same} |")


# --- propagation --------------------------------------------------------------------------------------


class Applied(threading.Thread):
    """One node's /events stream: when each operation was applied there (monotonic seconds)."""

    def __init__(self, node: Daemon) -> None:
        super().__init__(daemon=True)
        self.uri = node.url.replace("http", "ws") + "events?token=" + node.token
        self.seen: dict[str, float] = {}
        self.ready = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        with websockets.sync.client.connect(self.uri, open_timeout=30) as socket:
            self.ready.set()
            while not self.stop.is_set():
                try:
                    message = json.loads(socket.recv(timeout=0.5))
                except TimeoutError:
                    continue
                except websockets.exceptions.ConnectionClosed:  # the daemon is stopping
                    return
                if message.get("type") == "operation":
                    self.seen.setdefault(message["data"]["cid"], time.monotonic())


def bench_propagation(count: int, rates: list[int], seconds: float) -> None:
    rng = random.Random(3)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        nodes: list[Daemon] = []
        try:
            genesis = None
            for index in range(count):
                home = node_home(root, f"n{index}", genesis, [addr(nodes[-1])] if nodes else [])
                genesis = genesis or home / "network.json"
                nodes.append(start(home))
            progress(f"{count} daemons started in a line; waiting for every link ...")
            deadline = time.monotonic() + 60
            while any(
                n.call("status")["p2p"]["sync"]["peers"] < (1 if i in (0, count - 1) else 2)
                for i, n in enumerate(nodes)
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the line did not connect within 60 s")
                time.sleep(0.2)
            watchers = [Applied(node) for node in nodes]
            for watcher in watchers:
                watcher.start()
                watcher.ready.wait(30)
            print(f"\n## propagation: {count} daemons in a line, operations added at random nodes\n")
            print("| rate | operations | submit p50 (baseline) | to all nodes p50 | p95 | max | p95 / submit p50 |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            serial = 0
            for rate in rates:
                submitted: dict[str, tuple[float, float]] = {}  # cid -> (submit started, submit returned)
                interval, next_at = 1.0 / rate, time.monotonic()
                end = next_at + seconds
                while next_at < end:
                    time.sleep(max(0.0, next_at - time.monotonic()))
                    node = rng.choice(nodes)
                    text = f"When working on {rng.choice(SUBJECTS)}, check case {_word(serial)} before generalising."
                    serial += 1
                    began = time.monotonic()
                    cid = node.call("add", {"text": text, "domain": "math.bench", "confidence": 0.5})["cid"]
                    submitted[cid] = (began, time.monotonic())
                    next_at += interval
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not all(all(c in w.seen for w in watchers) for c in submitted):
                    time.sleep(0.1)
                latencies = [
                    max(w.seen.get(cid, float("inf")) for w in watchers) - returned
                    for cid, (_, returned) in submitted.items()
                ]
                submits = [returned - began for began, returned in submitted.values()]
                lost = sum(1 for value in latencies if value == float("inf"))
                done = sorted(value for value in latencies if value != float("inf"))
                base = percentile(submits, 0.50)
                print(
                    f"| {rate}/s | {len(submitted)} ({lost} not everywhere) | {base * 1000:.1f} ms | "
                    f"{percentile(done, 0.50) * 1000:.0f} ms | {percentile(done, 0.95) * 1000:.0f} ms | "
                    f"{done[-1] * 1000:.0f} ms | {percentile(done, 0.95) / base:.1f} |"
                )
            for watcher in watchers:
                watcher.stop.set()
            roots = {node.call("state_root")["state_root"] for node in nodes}
            print(f"\nstate roots equal on all {count} nodes: {len(roots) == 1}")
        finally:
            for node in nodes:
                node.stop()


def _word(serial: int) -> str:
    """A pronounceable word per serial (texts must not hold numbers)."""
    letters = "bcdfghjklmnpqrstvwz"
    word = ""
    serial += 1
    while serial:
        serial, digit = divmod(serial, len(letters))
        word += letters[digit] + "aeiou"[digit % 5]
    return word


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catch-up", type=int, default=10_000, dest="catch_up")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rates", default="10,100")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--skip", choices=["catch-up", "propagation"])
    args = parser.parse_args(argv)
    if args.skip != "catch-up":
        bench_catch_up(args.catch_up)
    if args.skip != "propagation":
        bench_propagation(args.nodes, [int(rate) for rate in args.rates.split(",")], args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
