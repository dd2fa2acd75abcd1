"""Network benchmark: a fresh node catching up by sync, and propagation latency across real daemons.

Usage: python -m bench.bench_network [--catch-up 10000] [--catch-up-peers 5] [--nodes 5] [--rates 10,100]
                                     [--seconds 10] [--batching 3000] [--burst 1000]
                                     [--only catch-up|propagation|batching|rogue|scale ...]

Figures, each against a baseline measured in the same run:
  catch-up     N operations (bench.workload) ingested in-process into node A's data directory, in batches of
               1,000: the local ingest rate (the baseline). Then A and --catch-up-peers - 1 copies of its data
               (each its own node) run as daemons and a fresh node B, bootstrapped to all of them, catches up
               by sync: B's ops/s from when it is ready (and from its process start) until it holds all N, as
               a ratio to the local ingest rate (target >= 0.8); what B fetched (each operation once?) and
               from which peer; B's ingest batches (their size, and their time against the catch-up's) and how
               many operations B stored pending (each costs a scan for its waiters once its dependency applies).
  propagation  K daemons in a line (each bootstraps to the one before; separate processes). Operations are
               added through the RPC of nodes picked at random, at R per second for S seconds; every node's
               /events stream reports when each operation is applied there. Latency = applied on the last
               node - submit returned: p50/p95/max per rate (target p95 < 500 ms to all of 10 nodes at 100/s).
               The baseline is the same submit's own latency on the node that took it.
  batching     the same operations submitted (JSON-RPC batches of 100) to the first of 3 daemons in a line, with
               gossip batched (the default) and with `[p2p] gossip_batch = 1`, the publisher's allowance lifted:
               ops/s until the last node holds them all, messages sent, CPU per operation on each node; the ratio
               of the two rates.
  rogue        propagation among K daemons at the first rate, first alone, then while a rogue peer
               (tests/rogue_peer.py) floods node 0 at full speed with valid low-clock operations and duplicates:
               the honest p95 with the flood as a ratio to without it.

  scale        --nodes daemons (50 for the figures), each knowing only the first (discovery connects the rest),
               each with `[retrieval] model = "network"`. A burst of --burst operations (10 independent causal
               streams) is submitted at once through 10 nodes, in JSON-RPC batches of 100. Ingest: first submit to
               the last submit returned (the baseline: each origin holds its share durably). Propagation: last
               submit returned until all state roots agree (target < 2 s), and the daemons' CPU meanwhile (all
               of them share this machine's cores). Per node: operations and bytes received (gossip + sync) per
               operation it lacked (all but those submitted to it), as a ratio to the minimum of 1 (target <= 2);
               and RSS per daemon.

Every process runs on this machine: K daemons and the driver share its cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import websockets.exceptions
import websockets.sync.client

from bench.bench_index import percentile
from bench.workload import SUBJECTS, operations
from ledger.cid import CID
from ledger.ledger import HEAD_FILE, NODE_KEY, Ledger
from ledger.params import NetworkParams
from node.home import Home
from tests.daemons import LOG, Daemon, init_home, start

P2P = "/ip4/127.0.0.1/tcp/0"
BATCH = 1000


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def node_home(root: Path, name: str, genesis: Path | None, bootstrap: list[str]) -> Path:
    home = root / name
    # no node-local retrieval model: its background embedding would take each daemon's share of the 2 cores
    # from what this measures (nobody queries here)
    init_home(home, network=genesis, p2p=P2P, retrieval_model="network")
    config = home / "config.toml"
    listed = ", ".join(f'"{addr}"' for addr in bootstrap)
    config.write_text(config.read_text().replace("bootstrap = []", f"bootstrap = [{listed}]"))
    return home


def addr(node: Daemon) -> str:
    return (node.home / "p2p.addrs").read_text().split()[0]


# --- catch-up ------------------------------------------------------------------------------------------


def copy_data(source: Path, home: Path) -> None:
    """Give `home` the data of `source` (the same operations and log), keeping its own node key (and leaving
    out the mark of the last head `source`'s key signed)."""
    data = home / "data"
    for item in (source / "data").iterdir():
        if item.name in (NODE_KEY, HEAD_FILE):
            continue
        target = data / item.name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, target)


def bench_catch_up(count: int, peers: int, keep_logs: Path | None = None) -> None:
    """`keep_logs`: copy the daemons' logs there (B's as b.log) once they stopped."""
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
        homes = [a_home]
        for number in range(1, peers):  # the other peers hold the same operations, each with its own node key
            homes.append(node_home(root, f"a{number}", a_home / "network.json", []))
            copy_data(a_home, homes[-1])
        with ExitStack() as running:
            servers = []
            for home in homes:
                servers.append(start(home))
                running.callback(servers[-1].stop)
            b_home = node_home(root, "b", a_home / "network.json", [addr(server) for server in servers])
            started = time.perf_counter()
            b = start(b_home)
            ready = time.perf_counter()
            running.callback(b.stop)
            last = -1
            while True:
                size = b.call("status")["log_size"]
                if size >= count:
                    break
                if size != last:
                    sync = b.call("status")["p2p"]["sync"]
                    progress(f"  B: {size:,}/{count:,} ({sync['state']}, {time.perf_counter() - started:.1f} s)")
                    last = size
                time.sleep(0.2)
            took = time.perf_counter() - started
            same = servers[0].call("state_root") == b.call("state_root")
            sync = b.call("status")["p2p"]["sync"]
            metrics = b.http.get(b.url + "metrics").text
            table = {p["peer_id"]: p["sync"]["fetched"] for p in b.call("peers")["peers"]}
            shares = sorted((table.get(peer_id(server), 0) for server in servers), reverse=True)
        if keep_logs is not None:
            copy_logs([*homes, b_home], keep_logs)
    rate, synced = count / took, count / (took - (ready - started))
    print(f"\n## catch-up: a fresh node fetches {count:,} operations from {peers} peers that hold them all\n")
    print(
        "| local ingest (baseline) | catch-up by sync, from B ready (from its start) | ratio (target >= 0.8) "
        "| fetched by sync (duplicates) | from each peer | state roots equal |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| {local:,.0f} ops/s | {synced:,.0f} ops/s ({rate:,.0f} ops/s, {took:.1f} s) | **{synced / local:.2f}** "
        f"({rate / local:.2f}) | {sync['fetched']:,} ({sync['duplicates']}) | "
        f"{', '.join(f'{share:,}' for share in shares)} | {same} |"
    )
    batches = metric(metrics, "expledger_ingest_batch_seconds_count")
    size = metric(metrics, "expledger_ingest_batch_operations_sum") / batches
    waited = metric(metrics, "expledger_operations_waited_total")
    print(
        f"\nB's writer: {batches:,.0f} ingest batches of {size:,.0f} operations on average (A's: {BATCH:,}), "
        f"{metric(metrics, 'expledger_ingest_batch_seconds_sum'):.1f} s in all of the {took - (ready - started):.1f} s "
        f"from ready; {waited:,.0f} operations stored pending (a dependency not applied yet)"
    )


def copy_logs(homes: list[Path], into: Path) -> None:
    """Each daemon's log, as HOME_NAME.log in `into` (--keep-logs)."""
    into.mkdir(parents=True, exist_ok=True)
    for home in homes:
        shutil.copy(home / LOG, into / f"{home.name}.log")
    progress(f"the daemons' logs are in {into}")


def metric(text: str, name: str) -> float:
    """One unlabelled sample of a Prometheus text exposition."""
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def peer_id(node: Daemon) -> str:
    return addr(node).rsplit("/p2p/", 1)[1]


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


@contextmanager
def line(root: Path, count: int, genesis: Path | None = None, config: str = "") -> Iterator[list[Daemon]]:
    """`count` daemons in a line (each bootstraps to the one before), all linked; stopped when the block ends.
    `config` is appended to each [p2p] section (e.g. gossip_batch = 1)."""
    nodes: list[Daemon] = []
    try:
        for index in range(count):
            home = node_home(root, f"n{index}", genesis, [addr(nodes[-1])] if nodes else [])
            if config:
                text = (home / "config.toml").read_text()
                (home / "config.toml").write_text(re.sub(r"(?m)^gossip_batch = .*$", config, text))
            genesis = genesis or home / "network.json"
            nodes.append(start(home))
        deadline = time.monotonic() + 60
        while any(
            n.call("status")["p2p"]["sync"]["peers"] < (1 if i in (0, count - 1) else 2) for i, n in enumerate(nodes)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the line did not connect within 60 s")
            time.sleep(0.2)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def propagation(nodes: list[Daemon], rate: int, seconds: float, rng: random.Random) -> tuple[list[float], float]:
    """Add operations at random nodes at `rate` for `seconds`: latencies to all nodes (inf: never everywhere),
    and the submits' median latency."""
    watchers = [Applied(node) for node in nodes]
    for watcher in watchers:
        watcher.start()
        watcher.ready.wait(30)
    submitted: dict[str, tuple[float, float]] = {}  # cid -> (submit started, submit returned)
    interval, next_at = 1.0 / rate, time.monotonic()
    end = next_at + seconds
    while next_at < end:
        time.sleep(max(0.0, next_at - time.monotonic()))
        node = rng.choice(nodes)
        text = f"When working on {rng.choice(SUBJECTS)}, check case {_word(rng.randrange(10**9))} before generalising."
        began = time.monotonic()
        cid = node.call("add", {"text": text, "domain": "math.bench", "confidence": 0.5})["cid"]
        submitted[cid] = (began, time.monotonic())
        next_at += interval
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(all(c in w.seen for w in watchers) for c in submitted):
        time.sleep(0.1)
    for watcher in watchers:
        watcher.stop.set()
    latencies = [
        max(w.seen.get(cid, math.inf) for w in watchers) - returned for cid, (_, returned) in submitted.items()
    ]
    return latencies, percentile([returned - began for began, returned in submitted.values()], 0.50)


def latency_row(label: str, latencies: list[float], base: float) -> str:
    lost = sum(1 for value in latencies if math.isinf(value))
    done = sorted(value for value in latencies if not math.isinf(value))
    return (
        f"| {label} | {len(latencies)} ({lost} not everywhere) | {base * 1000:.1f} ms | "
        f"{percentile(done, 0.50) * 1000:.0f} ms | {percentile(done, 0.95) * 1000:.0f} ms | "
        f"{done[-1] * 1000:.0f} ms | {percentile(done, 0.95) / base:.1f} |"
    )


LATENCY_HEADER = (
    "| rate | operations | submit p50 (baseline) | to all nodes p50 | p95 | max | p95 / submit p50 |\n"
    "| --- | --- | --- | --- | --- | --- | --- |"
)


def bench_propagation(count: int, rates: list[int], seconds: float) -> None:
    rng = random.Random(3)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, line(Path(tmp), count) as nodes:
        progress(f"{count} daemons linked in a line")
        print(f"\n## propagation: {count} daemons in a line, operations added at random nodes\n")
        print(LATENCY_HEADER)
        for rate in rates:
            latencies, base = propagation(nodes, rate, seconds, rng)
            print(latency_row(f"{rate}/s", latencies, base))
        roots = {node.call("state_root")["state_root"] for node in nodes}
        print(f"\nstate roots equal on all {count} nodes: {len(roots) == 1}")


# --- gossip batching ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def bench_batching(count: int) -> None:
    """The same operations through 3 daemons in a line, gossip batched (the default) and one per message, with no
    limit on what one publisher may gossip."""
    results = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        genesis = root / "network.json"
        genesis.write_text(NetworkParams(network_id="bench-batching").to_json())
        params = NetworkParams.from_file(genesis)
        progress(f"generating {count:,} operations ...")
        ops = [block.data.hex() for block in operations(count, params)]
        # the publisher's gossip allowance is lifted: this measures what gossip carries, not what sync repairs
        unlimited = "gossip_rate = 1000000\ngossip_burst = 1000000"
        for label, size in (("batched (up to 1,000 per message)", 1000), ("one per message", 1)):
            with line(root / label.split()[0], 3, genesis, f"gossip_batch = {size}\n{unlimited}") as nodes:
                cpu_before = [cpu_seconds(node.process.pid) for node in nodes]
                started = time.monotonic()
                for at in range(0, count, SUBMIT_BATCH):
                    body = [
                        {"jsonrpc": "2.0", "id": i, "method": "submit", "params": {"operation": op}}
                        for i, op in enumerate(ops[at : at + SUBMIT_BATCH])
                    ]
                    nodes[0].http.post(nodes[0].url, json=body).raise_for_status()
                submitted = time.monotonic() - started
                last = nodes[-1]
                while last.call("status")["log_size"] < count:
                    if time.monotonic() - started > 600:
                        raise RuntimeError("the last node did not get every operation within 600 s")
                    time.sleep(0.05)
                took = time.monotonic() - started
                cpu = [cpu_seconds(node.process.pid) - before for node, before in zip(nodes, cpu_before, strict=True)]
                sent = nodes[0].call("peers")["self"]["counters"]
                results[label] = (took, submitted, cpu, sent["gossip_sent"], nodes[1].call("peers")["self"]["counters"])
                progress(f"  {label}: {count / took:,.0f} ops/s to the last node")
    print(f"\n## gossip batching: {count:,} operations submitted to the first of 3 daemons in a line\n")
    print(
        "| gossip | messages sent by the first | ops/s to the last node | CPU ms per operation (first, middle, last) |"
    )
    print("| --- | --- | --- | --- |")
    for label, (took, _, cpu, messages, _) in results.items():
        per_op = ", ".join(f"{seconds * 1000 / count:.2f}" for seconds in cpu)
        print(f"| {label} | {messages:,} | {count / took:,.0f} | {per_op} |")
    (batched, *_), (single, *_) = results.values()
    print(f"\nthroughput batched / one per message: **{single / batched:.2f}** (same operations, same run)")
    middle = [counters for *_, counters in results.values()]
    print(f"middle node's counters: batched {middle[0]}, one per message {middle[1]}")


# --- a rogue flood ------------------------------------------------------------------------------------


def bench_rogue(count: int, rate: int, seconds: float) -> None:
    """Propagation among honest daemons while a rogue peer floods the first with valid low-clock operations and
    duplicates at full speed, against the same measurement without it."""
    from tests import factories  # the rogue signs for the deterministic test network (feature-hash embedder)

    rng = random.Random(5)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        genesis = root / "network.json"
        genesis.write_text(dataclasses.replace(factories.PARAMS, network_id="bench-rogue").to_json())
        with line(root, count, genesis) as nodes:
            quiet, quiet_base = propagation(nodes, rate, seconds, rng)
            rogue = subprocess.Popen(
                [sys.executable, "-m", "tests.rogue_peer", addr(nodes[0]), "bench-rogue"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            try:
                assert rogue.stdin is not None and rogue.stdout is not None
                ready = json.loads(rogue.stdout.readline())
                assert ready["event"] == "ready", ready
                rogue.stdin.write("flood-start 0 1000000000\n")
                rogue.stdin.flush()
                assert json.loads(rogue.stdout.readline())["event"] == "flooding"
                flooded, flooded_base = propagation(nodes, rate, seconds, rng)
                rogue.stdin.write("flood-stop\n")
                rogue.stdin.flush()
                stopped = json.loads(rogue.stdout.readline())
            finally:
                rogue.kill()
                rogue.wait()
            table = {p["peer_id"]: p for p in nodes[0].call("peers")["peers"]}
            record = table.get(ready["peer_id"], {})
    print(f"\n## a rogue flood: {count} daemons in a line, {rate} honest operations/s added at random nodes\n")
    print(LATENCY_HEADER.replace("| rate |", "| rogue |"))
    print(latency_row("none", quiet, quiet_base))
    print(latency_row(f"flooding node 0 ({stopped['operations']:,} ops)", flooded, flooded_base))
    ratio = percentile(flooded, 0.95) / percentile(quiet, 0.95)
    print(
        f"\nhonest p95 with the flood / without: **{ratio:.2f}**; "
        f"the rogue as node 0 saw it: invalid {record.get('invalid')}, score {record.get('score')}"
    )


def _word(serial: int) -> str:
    """A pronounceable word per serial (texts must not hold numbers)."""
    letters = "bcdfghjklmnpqrstvwz"
    word = ""
    serial += 1
    while serial:
        serial, digit = divmod(serial, len(letters))
        word += letters[digit] + "aeiou"[digit % 5]
    return word


SUBMIT_BATCH = 100  # submits per JSON-RPC batch in the batching measurement
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- scale -------------------------------------------------------------------------------------------------

SUBMITTERS = 10
STARTS_AT_ONCE = 6  # daemons loading at once (each loads for seconds of CPU)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


@contextmanager
def swarm(root: Path, count: int, keep_logs: Path | None = None) -> Iterator[list[Daemon]]:
    """`count` daemons that know only the first, started several at once; stopped when the block ends, their logs
    then copied to `keep_logs` (node i's as n{i}.log) when given."""
    nodes: list[Daemon] = []
    try:
        nodes.append(start(node_home(root, "n0", None, [])))
        genesis, bootstrap = nodes[0].home / "network.json", [addr(nodes[0])]
        with ThreadPoolExecutor(STARTS_AT_ONCE) as pool:
            homes = list(pool.map(lambda i: node_home(root, f"n{i}", genesis, bootstrap), range(1, count)))
            futures = [pool.submit(start, home, timeout=300) for home in homes]
            for future in futures:
                nodes.append(future.result())
        yield nodes
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda node: node.stop(), nodes))
        if keep_logs is not None:
            copy_logs([node.home for node in nodes], keep_logs)


def on_all(nodes: list[Daemon], method: str) -> list[Any]:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda node: node.call(method), nodes))


def report_disagreement(nodes: list[Daemon], expected: int) -> None:
    """What a scale run that did not converge leaves to go on: each node short of `expected` operations, with its
    connected peers' sync states and failures (the first 50-daemon run stopped with only "2 distinct")."""
    states = on_all(nodes, "state_root")
    for number, (node, state) in enumerate(zip(nodes, states, strict=True)):
        if state["log_size"] == expected:
            continue
        connected = [peer for peer in node.call("peers")["peers"] if peer["connected"]]
        states = Counter(peer["sync"]["state"] for peer in connected)
        failures = sum(peer["sync"]["failures"] for peer in connected)
        sync = node.call("status")["p2p"]["sync"]
        print(
            f"node {number}: {state['log_size']:,} of {expected:,} operations; {len(connected)} peers connected, "
            f"sync states {dict(states)}, {failures} failed rounds in a row over them; "
            f"{sync['behind']} known missing, {sync['stranded']} of them stranded (no usable peer listed them)",
            flush=True,
        )
    agreeing = sum(1 for state in states if state["log_size"] == expected)
    print(f"{agreeing} of {len(nodes)} nodes hold all {expected:,} operations", flush=True)


def bench_scale(count: int, burst: int, keep_logs: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        began = time.monotonic()
        with swarm(root, count, keep_logs) as nodes:
            all_ready = time.monotonic()
            progress(f"{count} daemons started in {all_ready - began:.0f} s; waiting for discovery ...")
            wanted = min(6, count - 1)
            while (peers := [s["p2p"]["sync"]["peers"] for s in on_all(nodes, "status")]) and min(peers) < wanted:
                if time.monotonic() - began > 600:
                    raise RuntimeError(f"discovery: after 600 s the fewest peers of a node is {min(peers)}")
                time.sleep(1.0)
            connected_after, after_ready = time.monotonic() - began, time.monotonic() - all_ready
            progress(f"every node holds >= {wanted} peers ({connected_after:.0f} s after the first start)")
            params = NetworkParams.from_file(nodes[0].home / "network.json")
            origins = nodes[:: max(1, count // SUBMITTERS)][:SUBMITTERS]
            streams = [
                [block.data for block in operations(burst // len(origins), params, seed=seed)]
                for seed in range(1, len(origins) + 1)
            ]
            sizes = {CID.for_block(op).raw: len(op) for stream in streams for op in stream}
            originated = {
                node.process.pid: [len(op) for op in stream] for node, stream in zip(origins, streams, strict=True)
            }
            counters_before = [table["self"]["counters"] for table in on_all(nodes, "peers")]

            def submit(pair: tuple[Daemon, list[bytes]]) -> float:
                node, ops = pair
                for start_at in range(0, len(ops), SUBMIT_BATCH):  # [rpc] max_batch is 100
                    body = [
                        {"jsonrpc": "2.0", "id": i, "method": "submit", "params": {"operation": op.hex()}}
                        for i, op in enumerate(ops[start_at : start_at + SUBMIT_BATCH])
                    ]
                    answers = node.http.post(node.url, json=body, timeout=300).json()
                    assert all("error" not in answer for answer in answers), answers
                return time.monotonic()

            def daemons_cpu() -> float:
                return sum(cpu_seconds(node.process.pid) for node in nodes)

            cpu_first, first = daemons_cpu(), time.monotonic()
            with ThreadPoolExecutor(SUBMITTERS) as pool:
                last = max(pool.map(submit, zip(origins, streams, strict=True)))
            cpu_last = daemons_cpu()
            while True:
                roots = {(r["state_root"], r["log_size"]) for r in on_all(nodes, "state_root")}
                if len(roots) == 1 and next(iter(roots))[1] == len(sizes):
                    agreed, cpu_agreed = time.monotonic(), daemons_cpu()
                    break
                if time.monotonic() - last > 300:
                    report_disagreement(nodes, len(sizes))
                    raise RuntimeError(f"the roots did not agree within 300 s: {len(roots)} distinct")
                time.sleep(0.05)
            statuses = [table["self"] for table in on_all(nodes, "peers")]
            received, volume = [], []
            for node, status, old in zip(nodes, statuses, counters_before, strict=True):
                own = originated.get(node.process.pid, [])
                lacked, minimum = len(sizes) - len(own), sum(sizes.values()) - sum(own)
                new = status["counters"]
                ops = new["gossip_operations_received"] - old["gossip_operations_received"]
                ops += new["sync_fetched"] - old["sync_fetched"]
                got = new["gossip_bytes_received"] - old["gossip_bytes_received"]
                got += new["sync_bytes_received"] - old["sync_bytes_received"]
                received.append(ops / lacked)
                volume.append(got / minimum)
            rss = sorted(rss_mb(node.process.pid) for node in nodes)
            peers = sorted(s["sync"]["peers"] for s in statuses)
            fetched = sum(s["sync"]["fetched"] for s in statuses)
            load = os.getloadavg()
    print(f"\n## scale: {count} daemons that know only the first, a burst of {len(sizes):,} operations via 10\n")
    print(
        f"discovery: every node held >= {wanted} peers {connected_after:.0f} s after the first start, "
        f"{after_ready:.1f} s after the last was ready;"
    )
    print(f"peers per node after the burst: min {peers[0]}, median {peers[len(peers) // 2]}, max {peers[-1]}\n")
    print("| ingest (first submit to last returned; baseline) | propagation (last returned to all roots equal) |")
    print("| --- | --- |")
    print(f"| {last - first:.2f} s | **{agreed - last:.2f} s** ({(agreed - last) / (last - first):.2f}x ingest) |")
    print("\nper node, per operation it lacked (the minimum is 1: each received once):\n")
    print("| | median | max |")
    print("| --- | --- | --- |")
    for label, values in (
        ("operations received (gossip + sync)", received),
        ("payload bytes received / minimum", volume),
    ):
        values = sorted(values)
        print(f"| {label} | {values[len(values) // 2]:.2f} | {values[-1]:.2f} |")
    print(f"\noperations fetched by sync over all nodes: {fetched:,}")
    cores, spread = os.cpu_count() or 1, (agreed - last) * (os.cpu_count() or 1)
    print(
        f"CPU of all daemons: ingest {cpu_last - cpu_first:.1f} s, propagation {cpu_agreed - cpu_last:.1f} s "
        f"({(cpu_agreed - cpu_last) / spread:.2f} of the {cores} cores' time; "
        f"{(cpu_agreed - cpu_first) / (count * len(sizes)) * 1000:.2f} ms per operation per node in all)"
    )
    print(f"RSS per daemon: median {rss[len(rss) // 2]:.0f} MB, max {rss[-1]:.0f} MB, total {sum(rss) / 1024:.1f} GB")
    print(f"load average during the run (1, 5, 15 min): {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catch-up", type=int, default=10_000, dest="catch_up")
    parser.add_argument("--catch-up-peers", type=int, default=5, dest="catch_up_peers")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rates", default="10,100")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batching", type=int, default=3000, help="operations for the batching measurement")
    parser.add_argument("--burst", type=int, default=1000, help="operations in the scale measurement's burst")
    parser.add_argument("--keep-logs", type=Path, dest="keep_logs", help="catch-up, scale: copy the daemons' logs here")
    parser.add_argument("--only", choices=["catch-up", "propagation", "batching", "rogue", "scale"], action="append")
    args = parser.parse_args(argv)
    wanted = set(args.only or ["catch-up", "propagation", "batching", "rogue", "scale"])
    rates = [int(rate) for rate in args.rates.split(",")]
    if "catch-up" in wanted:
        bench_catch_up(args.catch_up, args.catch_up_peers, args.keep_logs)
    if "propagation" in wanted:
        bench_propagation(args.nodes, rates, args.seconds)
    if "batching" in wanted:
        bench_batching(args.batching)
    if "rogue" in wanted:
        bench_rogue(args.nodes, rates[0], args.seconds)
    if "scale" in wanted:
        bench_scale(args.nodes, args.burst, args.keep_logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
