"""Slowloris: can connections that never finish their request head lock token holders out of the RPC?

Usage: python -m bench.bench_slowloris [--attackers 600] [--seconds 60] [--baseline 20] [--interval 0.1]
                                       [--trickle 3] [--max-connections 512] [--header-timeout 5]

A real daemon on a fresh home (`[retrieval] model = "network"`, no p2p; `[rpc] max_connections` and
`header_timeout` as given, the defaults by default). The measuring client makes authenticated `status` calls, one
every --interval s, each on a new connection (the hard case: every call must win a place; a keep-alive client
keeps its place once it has shown its token), with a 5 s timeout. First the baseline: those calls alone for
--baseline s. Then the attack: --attackers connections, each sending an incomplete request head a byte every
--trickle s and reopened as soon as the server closes it, while the same calls go on for --seconds.

The attackers run in a child process of this benchmark (trio, one task per connection): with its own GIL the
measuring client never waits for them. Prints the share of calls answered and the p50/p95/max of answered calls
in both phases (target under attack: >= 95 % answered, p95 < 100 ms), the ratio of the p95s, the failures by
kind, how many connections the attackers opened, the daemon's CPU in each phase and its refusals by reason.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import re
import resource
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import trio

from bench.bench_index import percentile
from tests.daemons import Daemon, init_home, running

CALL_TIMEOUT = 5.0  # seconds a status call may take before it counts as failed
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: a head that never ends: the attacker sends its bytes one at a time and never reaches the blank line
SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 100_000


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def raise_open_files(wanted: int) -> int:
    """The soft limit on open files, raised towards `wanted` as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


# --- the attackers (a child process) -------------------------------------------------------------------------


async def _hold(port: int, trickle: float, counts: Counter[str]) -> None:
    """One attacker connection, reopened whenever the server closes it."""
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            counts["connect_failed"] += 1
            await trio.sleep(0.1)
            continue
        counts["opened"] += 1
        async with stream:
            for byte in SLOW_HEAD:
                try:
                    await stream.send_all(bytes([byte]))
                    with trio.move_on_after(trickle):
                        await stream.receive_some(65536)  # anything, even b"": the server answered or closed
                        counts["closed_by_server"] += 1
                        break
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    counts["reset_by_server"] += 1
                    break


async def _attack(port: int, attackers: int, trickle: float, seconds: float, counts: Counter[str]) -> None:
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(attackers):
                nursery.start_soon(_hold, port, trickle, counts)
                await trio.sleep(0)


def attack(port: int, attackers: int, trickle: float, seconds: float, results: multiprocessing.Queue) -> None:
    """The child process: hold the connections for `seconds`, then report what happened to them."""
    raise_open_files(attackers + 256)
    counts: Counter[str] = Counter()
    trio.run(_attack, port, attackers, trickle, seconds, counts)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results.put({**counts, "cpu_seconds": usage.ru_utime + usage.ru_stime})


# --- the measuring client ------------------------------------------------------------------------------------


@dataclass
class Phase:
    """The status calls of one phase: latencies of those answered, and the failures by kind."""

    name: str
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def calls(self) -> int:
        return len(self.latencies) + sum(self.failures.values())

    def summary(self) -> str:
        answered = 100 * len(self.latencies) / max(1, self.calls)
        found = sorted(self.latencies)
        p50, p95 = (percentile(found, q) * 1000 for q in (0.5, 0.95)) if found else (float("nan"),) * 2
        worst = found[-1] * 1000 if found else float("nan")
        failed = ", ".join(f"{kind} {count}" for kind, count in self.failures.most_common()) or "none"
        cpu = 100 * self.cpu_seconds / max(self.wall_seconds, 1e-9)
        return (
            f"{self.name:9} {len(self.latencies)}/{self.calls} answered ({answered:.1f} %), p50 {p50:.1f} ms, "
            f"p95 {p95:.1f} ms, max {worst:.1f} ms; failed: {failed}; daemon CPU {cpu:.0f} % of a core"
        )


def status_call(host: str, port: int, body: bytes, headers: dict[str, str]) -> tuple[float | None, str]:
    """One authenticated `status` on a new connection: its latency, or None and why it failed."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=CALL_TIMEOUT)
    try:
        connection.request("POST", "/", body, headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            return None, f"http_{response.status}"
        if "result" not in json.loads(answer):
            return None, "rpc_error"
        return time.perf_counter() - started, ""
    except TimeoutError:
        return None, "timeout"
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        return None, type(exc).__name__
    finally:
        connection.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def measure(daemon: Daemon, name: str, seconds: float, interval: float) -> Phase:
    """Status calls paced every `interval` s for `seconds`."""
    url = urlsplit(daemon.url)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "status"}).encode()
    headers = {"Authorization": f"Bearer {daemon.token}", "Content-Type": "application/json"}
    phase = Phase(name)
    cpu_before, started = cpu_seconds(daemon.process.pid), time.monotonic()
    next_call = started
    while next_call < started + seconds:
        time.sleep(max(0.0, next_call - time.monotonic()))
        latency, failure = status_call(url.hostname or "127.0.0.1", url.port or 80, body, headers)
        if latency is None:
            phase.failures[failure] += 1
        else:
            phase.latencies.append(latency)
        next_call += interval
    phase.wall_seconds = time.monotonic() - started
    phase.cpu_seconds = cpu_seconds(daemon.process.pid) - cpu_before
    return phase


def refusals(daemon: Daemon) -> dict[str, float]:
    text = daemon.http.get(daemon.url + "metrics").text
    found = re.findall(r'^expledger_http_rejected_total\{reason="([^"]+)"\} (\S+)$', text, flags=re.MULTILINE)
    return {reason: float(value) for reason, value in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attackers", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=60.0, help="of attack")
    parser.add_argument("--baseline", type=float, default=20.0, help="seconds of calls without attackers")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between the starts of status calls")
    parser.add_argument("--trickle", type=float, default=3.0, help="seconds between an attacker's bytes")
    parser.add_argument("--max-connections", type=int, default=None, help="[rpc] max_connections (default: its)")
    parser.add_argument("--header-timeout", type=int, default=None, help="[rpc] header_timeout (default: its)")
    args = parser.parse_args()
    limit = raise_open_files(args.attackers + 256)
    progress(f"open files: {limit} (ulimit -n, raised for the attackers)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        home = Path(root) / "home"
        init_home(home, retrieval_model="network")
        config = home / "config.toml"
        text = config.read_text()
        for key, value in (("max_connections", args.max_connections), ("header_timeout", args.header_timeout)):
            if value is not None:
                text = re.sub(rf"(?m)^{key} = \d+", f"{key} = {value}", text, count=1)
        config.write_text(text)
        settings = re.findall(r"(?m)^(max_connections|header_timeout) = (\d+)", text)
        with running(home) as daemon:
            progress(f"daemon ready at {daemon.url} ({', '.join(f'{k} = {v}' for k, v in settings)})")
            measure(daemon, "warm-up", 2.0, args.interval)
            baseline = measure(daemon, "baseline", args.baseline, args.interval)
            progress(baseline.summary())
            results: multiprocessing.Queue = multiprocessing.Queue()
            port = urlsplit(daemon.url).port or 80
            lead = 2 * args.trickle + 2  # the attackers open their connections and fill the server first
            child = multiprocessing.Process(
                target=attack, args=(port, args.attackers, args.trickle, args.seconds + lead, results)
            )
            child.start()
            time.sleep(lead)
            attacked = measure(daemon, "attack", args.seconds, args.interval)
            counts = results.get(timeout=args.seconds + 120)
            child.join()
            reasons = refusals(daemon)
    print(f"slowloris: {args.attackers} attacker connections, a byte every {args.trickle:g} s, reopened as they close")
    print(f"  {', '.join(f'{key} = {value}' for key, value in settings)}; status calls every {args.interval:g} s,")
    print(f"  each on a new connection, {CALL_TIMEOUT:g} s timeout; daemon and both clients share the machine")
    print(f"  {baseline.summary()}")
    print(f"  {attacked.summary()}")
    ratio = percentile(sorted(attacked.latencies), 0.95) / percentile(sorted(baseline.latencies), 0.95)
    answered = 100 * len(attacked.latencies) / max(1, attacked.calls)
    p95 = percentile(sorted(attacked.latencies), 0.95) * 1000
    verdict = "met" if answered >= 95 and p95 < 100 else "NOT met"
    print(f"  p95 under attack / baseline: {ratio:.2f}; target >= 95 % answered with p95 < 100 ms: {verdict}")
    total = args.seconds + lead
    print(
        f"  attackers: {counts.get('opened', 0)} connections opened ({counts.get('opened', 0) / total:.0f}/s), "
        f"{counts.get('closed_by_server', 0)} closed and {counts.get('reset_by_server', 0)} reset by the server, "
        f"{counts.get('connect_failed', 0)} connects failed"
    )
    print(f"  the attackers' process used {100 * counts['cpu_seconds'] / total:.0f} % of a core")
    print(f"  daemon refusals: {', '.join(f'{k} {v:.0f}' for k, v in sorted(reasons.items())) or 'none'}")


if __name__ == "__main__":
    main()
