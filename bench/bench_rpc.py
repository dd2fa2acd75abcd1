"""RPC benchmark: `submit` throughput from concurrent clients, and `retrieve` latency idle and under ingest.

Usage: python -m bench.bench_rpc [--ops 20000] [--clients 8] [--per-call 50] [--experiences 10000,100000]
                                 [--queries 300] [--interval 20] [--rounds 2] [--load-ops 40000]
                                 [--skip submit|retrieve] [--model network]

Figures, each against a baseline measured in the same run:
  submit     N signed operations (bench.workload) sent to a fresh daemon by C clients, each with one call in
             flight on its own keep-alive connection: ops/s and per-call p50/p95, as a ratio to in-process
             `Ledger.ingest` of the same operations in a fresh data directory, in batches of the size the
             daemon's ingest task formed (read from its metrics; target >= 0.5) and in batches of 1,000. A
             second fresh daemon gets the same operations in JSON-RPC batches of --per-call submits.
  retrieve   `retrieve` p50/p95 over RPC on libraries of each size (built in-process with WordLlama, then
             served), idle and while C connections of another process submit new operations as fast as the
             node takes them; p95 under load / p95 idle (target <= 3). The retrieving client starts one call
             every --interval ms in both phases (back to back it would itself be a full load); idle calls
             back to back are timed too, since a node that idles between calls answers them more slowly.

The clients run on the daemon's machine and share its cores; the output says how much CPU each side used.
Data directories go to $BENCH_DIR (default: the system's temporary directory); BENCH_DIR=/dev/shm takes the
disk's sync latency out of both sides, leaving the CPU-bound case.
Client overhead is kept small: request bodies are encoded before the clock starts, each client is a bare
`http.client` connection (no httpx), answers are parsed after the run, and the load of the retrieval
measurement runs in its own process, so the retrieving client never waits for the load clients' GIL.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import pickle
import queue
import random
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.bench_index import percentile, texts
from bench.workload import SUBJECTS, operations
from ledger.embedder import Embedder, pack_float16
from ledger.index import EXACT_SEARCH_LIMIT
from ledger.ingest import Verdict
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.ops import Block, Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.view import LedgerView
from node.home import Home
from tests.daemons import init_home, running

BIG_BATCH = 1000  # the most the daemon's ingest task takes at once (config ingest.batch)
LOAD_ALONE = 3.0  # seconds the load runs alone, to measure its rate without retrievals
WARM_UP = 20  # retrievals before timing: the first exact search after a start builds its matrix
QUERIES = [item["query"] for item in json.loads((Path(__file__).parent / "quality_set.json").read_text())["queries"]]
AUTHORS = [AuthorKey(bytes([100 + i]) * 32) for i in range(20)]
#: the load's mix of new operations: adds, modifies (the index replaces a vector), votes
LOAD_MIX = ((Kind.ADD, 0.25), (Kind.MODIFY, 0.10), (Kind.VOTE, 0.65))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the client side -----------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP connection to the daemon; a call sends pre-encoded JSON-RPC and returns the raw answer."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self._http = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
        self._path = parts.path or "/"
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        self._http.connect()  # before any clock starts

    def call(self, body: bytes) -> bytes:
        self._http.request("POST", self._path, body, self._headers)
        response = self._http.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
        return answer

    def close(self) -> None:
        self._http.close()


def request(method: str, serial: int, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": serial, "method": method, "params": params}).encode()


def submissions(blocks: Sequence[Block], per_call: int = 1, clients: int = 1) -> list[bytes]:
    """One `submit` request per operation, or JSON-RPC batches of `per_call` submits for `clients` clients.

    The clients take consecutive batches at about the same time and the daemon runs a batch's calls one
    after another, so each of `clients` consecutive batches holds every `clients`-th operation: the
    operations still arrive about in causal order, as they do one per call.
    """
    if per_call == 1:
        return [request("submit", serial, operation=block.data.hex()) for serial, block in enumerate(blocks)]
    calls = [
        {"jsonrpc": "2.0", "id": serial, "method": "submit", "params": {"operation": block.data.hex()}}
        for serial, block in enumerate(blocks)
    ]
    group = per_call * clients
    return [
        json.dumps(calls[start : start + group][lane::clients]).encode()
        for start in range(0, len(calls), group)
        for lane in range(min(clients, len(calls) - start))
    ]


@dataclass
class Stream:
    """What a set of concurrent clients sent and got back: answers and latencies in the order calls were taken."""

    answers: list[bytes]
    latencies: list[float]
    finished: list[float]  # time.monotonic() at each answer: comparable across processes
    seconds: float

    def outcomes(self) -> Counter[str]:
        """`verdict/outcome` of each receipt, or `error/code` of each refused call."""
        counts: Counter[str] = Counter()
        for raw in self.answers:
            parsed = json.loads(raw)
            for answer in parsed if isinstance(parsed, list) else [parsed]:
                if "error" in answer:
                    counts[f"error/{(answer['error'].get('data') or {}).get('code', answer['error']['code'])}"] += 1
                else:
                    counts[f"{answer['result']['verdict']}/{answer['result']['outcome']}"] += 1
        return counts


def stream(
    url: str,
    token: str,
    bodies: Sequence[bytes],
    clients: int,
    stop: Any = None,
    flowing: Any = None,
) -> Stream:
    """Send `bodies` in order from `clients` threads, one call in flight each, until all are answered or `stop`
    is set; `flowing` is set once about ten answers per client have come back (the node is then busy)."""
    lock = threading.Lock()
    cursor = 0
    answers: list[bytes] = [b""] * len(bodies)
    latencies = [0.0] * len(bodies)
    finished = [0.0] * len(bodies)
    failures: list[BaseException] = []
    connections = [Connection(url, token) for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    flowing_at = min(len(bodies) - 1, 10 * clients)

    def client(connection: Connection) -> None:
        nonlocal cursor
        barrier.wait()
        try:
            while stop is None or not stop.is_set():
                with lock:
                    index = cursor
                    cursor += 1
                if index >= len(bodies):
                    return
                started = time.perf_counter()
                answers[index] = connection.call(bodies[index])
                latencies[index] = time.perf_counter() - started
                finished[index] = time.monotonic()
                if flowing is not None and index == flowing_at:
                    flowing.set()
        except Exception as exc:  # reported after the others finish
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(connection,)) for connection in connections]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} clients failed; the first: {failures[0]!r}")
    taken = min(cursor, len(bodies))
    return Stream(answers[:taken], latencies[:taken], finished[:taken], seconds)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds a process has used (from /proc: the daemon is another process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, f"{name} is not in the daemon's metrics"
    return float(found.group(1))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


# --- 1. submit throughput ----------------------------------------------------------------------------


def ingest_in_process(datas: Sequence[bytes], params: NetworkParams, batch: int) -> float:
    """`Ledger.ingest` of `datas` in a fresh data directory, in batches of `batch`: ops/s."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        ledger = Ledger.open(Path(tmp) / "data", params)
        try:
            verdicts: Counter[Verdict] = Counter()
            started = time.perf_counter()
            for index in range(0, len(datas), batch):
                verdicts.update(receipt.verdict for receipt in ledger.ingest(datas[index : index + batch]))
            seconds = time.perf_counter() - started
        finally:
            ledger.close()
    assert verdicts == {Verdict.ACCEPTED: len(datas)}, verdicts
    return len(datas) / seconds


@dataclass
class DaemonRun:
    """Operations submitted to a fresh daemon, and what its metrics and /proc said about it."""

    label: str
    sent: Stream
    operations: int
    batch_mean: float  # operations per ingest batch (one synced write)
    writing: float  # share of the wall time the ingest task spent in batches
    daemon_cpu: tuple[float, float]  # user, system seconds
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.operations / self.sent.seconds


def submit_to_daemon(label: str, blocks: Sequence[Block], clients: int, per_call: int, model: str) -> DaemonRun:
    bodies = submissions(blocks, per_call, clients)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        home = Path(tmp) / "node"
        init_home(home, retrieval_model=model)
        with running(home) as daemon:
            user, system = cpu_seconds(daemon.process.pid)
            client_cpu = time.process_time()
            sent = stream(daemon.url, daemon.token, bodies, clients)
            client_cpu = time.process_time() - client_cpu
            user_after, system_after = cpu_seconds(daemon.process.pid)
            metrics = daemon.http.get(daemon.url.rstrip("/") + "/metrics").text
    outcomes = sent.outcomes()
    accepted = sum(n for outcome, n in outcomes.items() if outcome.startswith("accepted/"))
    assert accepted == len(blocks), outcomes
    progress(f"  receipts: {dict(outcomes)}")
    batches = metric(metrics, "expledger_ingest_batch_operations_count")
    return DaemonRun(
        label,
        sent,
        len(blocks),
        metric(metrics, "expledger_ingest_batch_operations_sum") / batches,
        metric(metrics, "expledger_ingest_batch_seconds_sum") / sent.seconds,
        (user_after - user, system_after - system),
        client_cpu,
    )


def bench_submit(count: int, clients: int, per_call: int, model: str) -> None:
    params = NetworkParams()
    progress(f"generating {count:,} signed operations (WordLlama embeddings) ...")
    blocks = list(operations(count, params))
    datas = [block.data for block in blocks]
    in_process: dict[int, float] = {}

    def baseline(batch: int) -> None:
        if batch not in in_process:
            progress(f"in-process Ledger.ingest, batches of {batch} ...")
            in_process[batch] = ingest_in_process(datas, params, batch)

    baseline(BIG_BATCH)
    runs = []
    for per in [1, per_call] if per_call > 1 else [1]:
        progress(f"RPC submit from {clients} clients, {per} operation(s) per call, to a fresh daemon ...")
        runs.append(submit_to_daemon(f"{per} operation{'s' if per > 1 else ''} per call", blocks, clients, per, model))
        baseline(max(1, round(runs[-1].batch_mean)))  # the batch size the daemon formed

    mean_bytes = sum(map(len, datas)) / len(datas)
    print(f"\n## submit: {count:,} operations (bench.workload mix, mean {mean_bytes:,.0f} bytes), {clients} clients\n")
    print(
        "| path | operations per synced write | ops/s | per call p50 / p95 "
        f"| RPC / in-process, same batch | RPC / in-process, batches of {BIG_BATCH:,} |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for batch, rate in sorted(in_process.items()):
        print(f"| in-process `Ledger.ingest` | {batch:,} | {rate:,.0f} | — | — | — |")
    for run in runs:
        same = run.rate / in_process[max(1, round(run.batch_mean))]
        verdict = f" (target ≥ 0.5: {'met' if same >= 0.5 else 'NOT met'})" if run is runs[0] else ""
        print(
            f"| RPC `submit`, {clients} clients, {run.label} | {run.batch_mean:,.1f} (mean) | {run.rate:,.0f} "
            f"| {ms(percentile(run.sent.latencies, 0.5))} / {ms(percentile(run.sent.latencies, 0.95))} ms "
            f"| **{same:.2f}**{verdict} | {run.rate / in_process[BIG_BATCH]:.2f} |"
        )
    print()
    for run in runs:
        user, system = run.daemon_cpu
        print(
            f"- {run.label}: the ingest task spent {run.writing:.0%} of the {run.sent.seconds:.1f} s in batches; "
            f"CPU: daemon {(user + system) / run.sent.seconds:.2f} cores (user {user / run.sent.seconds:.2f}, "
            f"system {system / run.sent.seconds:.2f}), clients {run.client_cpu / run.sent.seconds:.2f} "
            f"(of {os.cpu_count()} cores)."
        )


# --- 2. retrieval, idle and under load ---------------------------------------------------------------


class Texts:
    """Distinct experience-like sentences over a shared vocabulary (bench_index), never one twice in a run."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._seen: set[str] = set()

    def take(self, count: int) -> list[str]:
        fresh: list[str] = []
        while len(fresh) < count:
            for text in texts(count - len(fresh), self._rng):
                if text not in self._seen:
                    self._seen.add(text)
                    fresh.append(text)
        return fresh


def chain(
    view: LedgerView,
    embedder: Embedder,
    source: Texts,
    count: int,
    mix: Sequence[tuple[Kind, float]],
    rng: random.Random,
) -> list[Block]:
    """`count` new operations after everything in `view`: each has the previous as parent and the next clock, so
    they apply in order (no refold), as from an honest client; modifies and votes target live experiences."""
    kinds, weights = zip(*mix, strict=True)
    chosen = rng.choices(kinds, weights, k=count)
    with_content = [kind for kind in chosen if kind in (Kind.ADD, Kind.MODIFY)]
    sentences = source.take(len(with_content))
    vectors = iter(
        [
            pack_float16(v)
            for start in range(0, len(sentences), 256)
            for v in embedder.embed(sentences[start : start + 256])
        ]
    )
    sentence = iter(sentences)
    live = view.live_ids() if any(kind is not Kind.ADD for kind in kinds) else []
    parents, clock = view.parents_and_clock(())
    blocks = []
    for serial, kind in enumerate(chosen):
        fields: dict[str, Any] = {}
        if kind in (Kind.ADD, Kind.MODIFY):
            fields["content"] = Experience(
                next(sentence),
                ("math", rng.choice(SUBJECTS[:4]).split()[0]),
                rng.random(),
                Embedding(embedder.model_id, embedder.dim, next(vectors)),
            )
        if kind in (Kind.MODIFY, Kind.VOTE):
            fields["target"] = rng.choice(live)
        if kind is Kind.VOTE:
            fields["vote"] = rng.choice((1, 1, 1, -1))
        block = sign(Operation(kind, "", clock, parents, 1_700_000_000 + serial, **fields), rng.choice(AUTHORS))
        blocks.append(block)
        parents, clock = (block.cid,), clock + 1
    return blocks


def grow_library(ledger: Ledger, size: int, source: Texts, rng: random.Random) -> None:
    """Add distinct experiences in batches of 1,000 until `size` are live."""
    started = time.perf_counter()
    while (live := ledger.live_count()) < size:
        missing = min(size - live, 10_000)
        for index in range(0, missing, BIG_BATCH):
            blocks = chain(
                ledger.view(), ledger.embedder, source, min(BIG_BATCH, missing - index), [(Kind.ADD, 1)], rng
            )
            receipts = ledger.ingest([block.data for block in blocks])
            assert all(receipt.verdict is Verdict.ACCEPTED for receipt in receipts), receipts[0]
        live = ledger.live_count()
        progress(f"  {live:,}/{size:,} live experiences ({time.perf_counter() - started:.0f} s)")


def _load(url: str, token: str, load: Path, cursor: int, clients: int, flowing: Any, stop: Any, results: Any) -> None:
    """In a process of its own: stream the submissions of `load` from `cursor` on until stopped; send back what it
    measured (the bodies come through a file: tens of MB through the start-up pipe would block on a dead child)."""
    bodies = pickle.loads(load.read_bytes())[cursor:]
    done = stream(url, token, bodies, clients, stop=stop, flowing=flowing)
    flowing.set()  # even if the operations ran out first: the waiting side checks `stop` and the count
    results.put((done.finished, dict(done.outcomes()), len(done.answers) == len(bodies)))


@dataclass
class Phase:
    """Retrieval latencies of one condition, and what the load did meanwhile."""

    latencies: list[float]
    load_ops: int = 0  # submitted in the whole phase
    alone_rate: float = 0.0  # submissions answered per second before the retrievals began
    load_rate: float = 0.0  # submissions answered per second while the retrievals ran
    load_outcomes: dict[str, int] = field(default_factory=dict)
    exhausted: bool = False

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 0.95)


@dataclass(frozen=True)
class RetrievalSetup:
    clients: int  # submitting connections of the load
    queries: int  # retrievals timed per phase
    rounds: int  # idle + under-load pairs per library size
    load_ops: int  # operations made ready for the load, per size
    interval: float  # seconds between the starts of two retrievals


def retrievals(url: str, token: str, count: int, offset: int, interval: float = 0.0) -> list[float]:
    """`retrieve` calls with the quality set's problems as queries, one every `interval` seconds (a call that
    overruns delays the next, never bunches them): each call's latency.

    Paced rather than back to back: a client retrieving as fast as it can is itself a full load, which
    takes the GIL from the ingest it is meant to be measured against."""
    latencies = []
    connection = Connection(url, token)  # a new one: the server closes a connection left idle for 5 s
    try:
        due = time.perf_counter()
        for serial in range(offset, offset + count):
            body = request("retrieve", serial, query=QUERIES[serial % len(QUERIES)], k=5)
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            started = time.perf_counter()
            due = max(due + interval, started)
            answer = connection.call(body)
            latencies.append(time.perf_counter() - started)
            assert b'"hits"' in answer, answer[:300]
    finally:
        connection.close()
    return latencies


def under_load(url: str, token: str, load: Path, cursor: int, setup: RetrievalSetup, offset: int) -> tuple[Phase, int]:
    """Retrievals while another process streams the submissions of `load` from `cursor` on, its rate measured
    alone first (LOAD_ALONE s); with the cursor where the load stopped."""
    context = multiprocessing.get_context("spawn")
    flowing, stop, results = context.Event(), context.Event(), context.Queue()
    worker = context.Process(
        target=_load, args=(url, token, load, cursor, setup.clients, flowing, stop, results), daemon=True
    )
    worker.start()
    try:
        while not flowing.wait(0.5):
            if not worker.is_alive():
                raise RuntimeError(f"the load process exited (status {worker.exitcode}) before it got going")
        alone = time.monotonic()
        time.sleep(LOAD_ALONE)
        began = time.monotonic()
        latencies = retrievals(url, token, setup.queries, offset, setup.interval)
        ended = time.monotonic()
        stop.set()
        while True:
            try:
                finished, outcomes, exhausted = results.get(timeout=0.5)
                break
            except queue.Empty:
                if not worker.is_alive():
                    raise RuntimeError(
                        f"the load process exited (status {worker.exitcode}) without its figures"
                    ) from None
    finally:
        stop.set()
        worker.join(60)
        if worker.is_alive():
            worker.kill()
            worker.join()
    if exhausted:
        progress("  warning: the load ran out of operations before the retrievals ended (raise --load-ops)")
    before = sum(1 for moment in finished if alone <= moment < began)
    during = sum(1 for moment in finished if began <= moment <= ended)
    phase = Phase(latencies, len(finished), before / (began - alone), during / (ended - began), outcomes, exhausted)
    return phase, cursor + len(finished)


@dataclass
class SizeResult:
    size: int
    rounds: list[tuple[Phase, Phase, Phase]]  # idle back to back, idle paced, paced under load
    status: dict[str, Any]  # the daemon's status after the last round


def bench_retrieve(sizes: list[int], setup: RetrievalSetup, model: str) -> list[SizeResult]:
    rng = random.Random(7)
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        home, load = Path(tmp) / "library", Path(tmp) / "load.pickle"
        init_home(home, retrieval_model=model)
        params = Home(home).network()
        source = Texts(rng)
        for size in sizes:
            progress(f"building a library of {size:,} live experiences in-process ...")
            ledger = Ledger.open(home / "data", params)
            try:
                grow_library(ledger, size, source, rng)
                progress(f"generating {setup.load_ops:,} new operations for the load ...")
                blocks = chain(ledger.view(), ledger.embedder, source, setup.load_ops, LOAD_MIX, rng)
                load.write_bytes(pickle.dumps(submissions(blocks)))
            finally:
                ledger.close()
            progress(f"retrieve over RPC at {size:,}: {setup.rounds} rounds of {setup.queries} idle, then under load")
            measured = []
            with running(home) as daemon:
                url, token = daemon.url, daemon.token
                retrievals(url, token, WARM_UP, 0)
                cursor = 0
                for round_ in range(setup.rounds):
                    offset = round_ * setup.queries
                    hot = Phase(retrievals(url, token, setup.queries, offset))
                    idle = Phase(retrievals(url, token, setup.queries, offset, setup.interval))
                    loaded, cursor = under_load(url, token, load, cursor, setup, offset)
                    measured.append((hot, idle, loaded))
                    progress(
                        f"  round {round_ + 1}: p95 idle {ms(idle.p95)} ms, under load {ms(loaded.p95)} ms "
                        f"(submits/s {loaded.alone_rate:,.0f} alone, {loaded.load_rate:,.0f} meanwhile)"
                    )
                status = daemon.call("status")
            results.append(SizeResult(size, measured, status))
    return results


def report_retrieve(results: list[SizeResult], setup: RetrievalSetup) -> None:
    print(
        f"\n## retrieve: k = 5, {setup.queries} queries per phase (the quality set's problems), "
        f"one client starting one every {setup.interval * 1000:.0f} ms\n"
    )
    print(
        "| live experiences | search | round | idle, back to back p50 / p95 | idle, paced p50 / p95 "
        f"| under load, paced p50 / p95 | submits/s ({setup.clients} clients) alone / meanwhile "
        "| p95 load / idle paced (/ back to back) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        search = "exact" if result.size <= EXACT_SEARCH_LIMIT else "HNSW"
        for number, (hot, idle, loaded) in enumerate(result.rounds, 1):
            ratio = loaded.p95 / idle.p95
            print(
                f"| {result.size:,} | {search} | {number} | {ms(hot.p50)} / {ms(hot.p95)} ms "
                f"| {ms(idle.p50)} / {ms(idle.p95)} ms "
                f"| {ms(loaded.p50)} / {ms(loaded.p95)} ms{' (load ran out)' if loaded.exhausted else ''} "
                f"| {loaded.alone_rate:,.0f} / {loaded.load_rate:,.0f} "
                f"| **{ratio:.1f}** (target ≤ 3: {'met' if ratio <= 3 else 'NOT met'}) (/ {loaded.p95 / hot.p95:.1f}) |"
            )
    print()
    for result in results:
        outcomes: Counter[str] = Counter()
        for *_, loaded in result.rounds:
            outcomes.update(loaded.load_outcomes)
        print(
            f"At {result.size:,}: {sum(outcomes.values()):,} operations submitted under load, "
            f"receipts {dict(outcomes)}; "
            f"afterwards {result.status['live_experiences']:,} live experiences, {result.status['pending']} pending."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000, help="operations for the submit throughput")
    parser.add_argument("--clients", type=int, default=8, help="concurrent submitting connections")
    parser.add_argument(
        "--per-call", type=int, default=50, help="operations per JSON-RPC batch, for the extra row (1: none)"
    )
    parser.add_argument("--experiences", default="10000,100000", help="library sizes for retrieval, comma-separated")
    parser.add_argument("--queries", type=int, default=300, help="retrievals timed per phase")
    parser.add_argument("--interval", type=float, default=20, help="ms between the starts of two retrievals")
    parser.add_argument("--rounds", type=int, default=2, help="idle + under-load pairs per library size")
    parser.add_argument("--load-ops", type=int, default=40_000, help="operations ready for the load, per size")
    parser.add_argument("--skip", choices=["submit", "retrieve"], help="leave out one part")
    parser.add_argument(
        "--model",
        default="network",
        help='the daemons\' [retrieval] model (default "network"; a node-local one embeds every new experience again '
        "on a background thread and answers `retrieve` with its own vectors: see bench_retrieval)",
    )
    args = parser.parse_args(argv)
    sizes = sorted(int(size) for size in args.experiences.split(","))
    if args.skip != "submit":
        bench_submit(args.ops, args.clients, args.per_call, args.model)
    if args.skip != "retrieve":
        setup = RetrievalSetup(args.clients, args.queries, args.rounds, args.load_ops, args.interval / 1000)
        report_retrieve(bench_retrieve(sizes, setup, args.model), setup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
