"""The daemon as its users meet it: a real process from `expledger init`, driven over HTTP and the CLI."""

from __future__ import annotations

import base64
import json
import os
import resource
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest
import trio
import websockets.sync.client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.ops import Kind
from node.config import ConfigError, load_config
from node.daemon import MIN_RPC_CONNECTIONS, rpc_connections
from tests import factories as f
from tests.daemons import EXPLEDGER, expledger, expledger_here, init_home, log_lines, running, start

GEOMETRY = f.SEED_TEXTS[0]
COMBINATORICS = f.SEED_TEXTS[1]
SEGMENTS = "When intersecting lines with segments, check each solution lies on the segment."


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("daemon") / "home"
    init_home(path)
    return path


@pytest.fixture(scope="module")
def node(home):
    with running(home) as daemon:
        yield daemon


def _state(node) -> tuple:
    root = node.call("state_root")
    return root["state_root"], root["log_size"], node.call("list", {"limit": 1000})["experiences"]


def _add(node, text=GEOMETRY, domain="math.geometry", confidence=0.87) -> dict:
    return node.call("add", {"text": text, "domain": domain, "confidence": confidence})


def test_init_is_idempotent_and_says_what_it_found(home):
    again = expledger("init", home=home)
    assert again.returncode == 0, again.stderr
    assert all(line.startswith("found ") for line in again.stdout.splitlines()), again.stdout
    assert (home / "author.key").stat().st_mode & 0o077 == 0
    assert (home / "data" / "node.key").stat().st_mode & 0o077 == 0


def test_every_write_method_takes_effect(node):
    first, second = _add(node), _add(node, COMBINATORICS, "math.combinatorics", 0.8)
    assert (first["verdict"], first["outcome"], first["kind"]) == ("accepted", "applied", "add")
    vote = node.call("vote", {"target": first["cid"], "value": "up"})
    modify = node.call("modify", {"target": first["cid"], "text": SEGMENTS})
    assert vote["outcome"] == modify["outcome"] == "applied"
    shown = node.call("get", {"id": first["cid"]})
    assert shown["text"] == SEGMENTS and shown["domain"] == "math.geometry"  # unset fields kept
    assert shown["library"]["version"] == modify["cid"] and shown["library"]["votes"]["upvotes"] == 1
    assert shown["merkle_proof"]["cid"] == modify["cid"] and not shown["library"]["conflicted"]
    merged = node.call(
        "merge",
        {
            "targets": [first["cid"], second["cid"]],
            "text": "When a problem mixes geometry and counting, check every candidate against the constraints.",
            "domain": "math",
            "confidence": 0.9,
            "reason": "same pattern",
        },
    )
    assert merged["outcome"] == "applied"
    assert node.call("get", {"id": first["cid"]})["library"]["alias_of"] == merged["cid"]
    deleted = node.call("delete", {"target": merged["cid"], "reason": "proven incorrect"})
    assert deleted["outcome"] == "applied"
    assert node.call("get", {"id": merged["cid"]})["library"]["status"] == "deleted"
    history = node.call("history", {"id": merged["cid"]})["operations"]
    assert [op["kind"] for op in history] == ["add", "add", "vote", "modify", "merge", "delete"]


def test_submit_takes_a_signed_operation_in_hex_or_base64(node, tmp_path):
    key, out = tmp_path / "alice.key", tmp_path / "add.cbor"
    assert expledger("keygen", "--out", str(key)).returncode == 0
    made = expledger(
        "op",
        "new",
        "add",
        "--key",
        str(key),
        "--text",
        f.SEED_TEXTS[2],
        "--domain",
        "math.logic",
        "--confidence",
        "0.6",
        "--out",
        str(out),
    )
    assert made.returncode == 0, made.stderr
    accepted = node.call("submit", {"operation": out.read_bytes().hex()})
    assert (accepted["verdict"], accepted["outcome"], accepted["cid"]) == ("accepted", "applied", made.stderr.strip())
    again = node.call("submit", {"operation": base64.b64encode(out.read_bytes()).decode(), "encoding": "base64"})
    assert (again["verdict"], again["outcome"], again["status"]["outcome"]) == ("ignored", "duplicate", "applied")
    # signed for another network's embedder: refused, with every broken rule
    foreign = f.signed(f.operation(Kind.ADD, content=f.content(f.SEED_TEXTS[3])), f.author(5))
    error = node.request("submit", {"operation": foreign.data.hex()})["error"]
    assert error["code"] == -32001 and error["data"]["code"] == "embedding.model" and error["data"]["errors"]


def test_reads_queries_and_proofs(node):
    _add(node, "When counting lattice paths on a grid, look for a bijection with a simpler set.", "math.counting", 0.6)
    hits = node.call("retrieve", {"query": "How many monotone lattice paths cross a grid?", "k": 3})["hits"]
    assert hits and hits[0]["domain"] == "math.counting" and hits[0]["conflicted"] is False
    prompt = node.call("context", {"query": "How many monotone lattice paths cross a grid?"})["prompt"]
    assert prompt.startswith("# Learned Experiences\n\n1. When counting lattice paths") and prompt.endswith("grid?")
    coverage = node.call("coverage", {"queries": ["lattice paths on a grid", "quantum chromodynamics"]})
    assert coverage == {"coverage": 0.5, "queries": 2}
    head = node.call("head")
    status = node.call("status")
    assert head["size"] == status["log_size"] and head["node"] == status["node"]
    consistency = node.call("proof.consistency", {"old_size": 1})
    assert consistency["new_size"] == head["size"] and consistency["new_root"] == head["root"]
    page = node.call("list", {"limit": 2})
    assert len(page["experiences"]) == 2 and page["next_cursor"]
    rest = node.call("list", {"cursor": page["next_cursor"], "limit": 1000})["experiences"]
    assert {e["id"] for e in page["experiences"]}.isdisjoint(e["id"] for e in rest)
    assert all(
        e["domain"].startswith("math.counting") for e in node.call("list", {"domain": "math.counting"})["experiences"]
    )


def _call(method: str, params: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "status"}', -32600),
        (b"[]", -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "no_such_method"}', -32601),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "retrieve", "params": {"query": 5}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "retrieve", "params": {"query": "x", "k": "5"}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "add", "params": {"text": "x"}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "get", "params": {"id": "not-a-cid"}}', -32602),
        (_call("get", {"id": "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"}), -32002),
        (_call("add", {"text": "no structure here", "domain": "math", "confidence": 0.5}), -32001),
        (_call("add", {"text": "When a\ud800 appears, stop.", "domain": "m", "confidence": 0.5}), -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "proof.consistency", "params": {"old_size": 999999}}', -32002),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "submit", "params": {"operation": "zz"}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "submit", "params": {"operation": "a0"}}', -32001),
        (b"[" * 5000 + b"]" * 5000, -32700),
    ],
)
def test_errors_have_their_code_and_change_nothing(node, body, code):
    before = _state(node)
    response = node.post(body)
    assert response.status_code == 200
    answer = response.json()
    error = answer["error"] if isinstance(answer, dict) else answer[0]["error"]
    assert error["code"] == code, error
    if -32099 <= code <= -32000 or code == -32602:
        assert isinstance(error["data"]["code"], str) and "." in error["data"]["code"]
    assert _state(node) == before
    assert node.http.get(node.url + "health").json()["status"] == "ok"


def test_a_missing_or_wrong_token_is_refused_with_401(node):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "status"})
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic " + base64.b64encode(b"__cookie__:x").decode()},
    ):
        response = httpx.post(node.url, content=body, headers=headers)
        assert response.status_code == 401 and "WWW-Authenticate" in response.headers
    basic = "Basic " + base64.b64encode(f"__cookie__:{node.token}".encode()).decode()
    assert httpx.post(node.url, content=body, headers={"Authorization": basic}).status_code == 200
    assert httpx.get(node.url + "metrics").status_code == 401
    assert httpx.get(node.url + "health").status_code == 200  # probes need no token


def test_a_request_with_two_authorization_headers_is_refused_400_whichever_comes_first(node):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "status"})
    good, wrong = f"Bearer {node.token}", "Bearer wrong"
    for pair in ((good, wrong), (wrong, good), (good, good)):
        response = httpx.post(node.url, content=body, headers=[("Authorization", value) for value in pair])
        assert (response.status_code, response.text) == (400, "the request repeats its Authorization header\n")
    assert node.call("status")["log_size"] >= 0  # and the node goes on


async def _trickle_until_closed(port: int, head: bytes, closed_early: list[bool]) -> None:
    """Send `head` a byte every 50 ms; record whether the daemon closed the connection before it was all sent."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        try:
            for byte in head:
                await stream.send_all(bytes([byte]))
                with trio.move_on_after(0.05):
                    if not await stream.receive_some(65536):
                        closed_early.append(True)
                        return
        except (trio.BrokenResourceError, OSError):
            closed_early.append(True)
            return
    closed_early.append(False)


async def _status_on_a_new_connection(port: int, token: str) -> int:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "status"}'
    request = b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n" % token.encode()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(request + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]) if "result" in json.loads(payload or b"{}") else -1


def test_slow_connections_are_closed_at_the_header_deadline_and_token_holders_still_get_in(tmp_path):
    """Slowloris against a daemon with room for 20 connections: 100 connections trickle request heads they never
    finish; every authenticated call made meanwhile, each on a new connection, is answered, and every slow
    connection is closed before its head is sent, evicted by a newcomer or at the one-second header deadline."""
    home = tmp_path / "home"
    init_home(home)
    config = home / "config.toml"
    text = config.read_text().replace("max_connections = 1024", "max_connections = 20")
    config.write_text(text.replace("header_timeout = 5", "header_timeout = 1"))
    slow_head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 400  # 20 s at a byte per 50 ms

    async def attack(port: int, token: str) -> tuple[list[bool], list[int]]:
        closed_early: list[bool] = []
        answers: list[int] = []
        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(_trickle_until_closed, port, slow_head, closed_early)
                await trio.sleep(0)
            for _ in range(10):
                answers.append(await _status_on_a_new_connection(port, token))
        return closed_early, answers

    with running(home) as daemon:
        port = int(daemon.url.rsplit(":", 1)[1].strip("/"))
        closed_early, answers = trio.run(attack, port, daemon.token)
        assert answers == [200] * 10
        assert closed_early == [True] * 100
        metrics = daemon.http.get(daemon.url + "metrics").text
    refused = {
        reason: float(value)
        for reason, value in (
            line.removeprefix('expledger_http_rejected_total{reason="').split('"} ')
            for line in metrics.splitlines()
            if line.startswith("expledger_http_rejected_total{")
        )
    }
    # every slow connection ended one of the two ways; those still in place after the last call at the deadline
    assert refused.get("evicted", 0) + refused["header_timeout"] == 100 and refused["header_timeout"] >= 1


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("header_timeout = 0", "config.value"),
        ("header_timeout = 2.5", "config.type"),
        ("max_connections = 1", "config.value"),
    ],
)
def test_connection_settings_out_of_range_are_refused_naming_the_key(tmp_path, line, code):
    path = tmp_path / "config.toml"
    path.write_text(f"[rpc]\n{line}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.code == code and f"[rpc] {line.split(' = ')[0]}" in refused.value.message


def test_the_daemon_raises_its_open_files_limit_and_serves_fewer_connections_when_the_hard_limit_is_short(caplog):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("open files have no hard limit here")
    try:
        assert rpc_connections(16) == 16
        served = rpc_connections(hard)  # it and the database would need more than the hard limit
        assert served == min(hard, max(MIN_RPC_CONNECTIONS, hard // 2))
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard and "serving" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_batches_mix_good_and_bad_calls_and_notifications_get_no_answer(node):
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "status"},
        {"jsonrpc": "2.0", "id": "b", "method": "nope"},
        {"jsonrpc": "2.0", "method": "status"},  # a notification: no answer
        {"jsonrpc": "2.0", "id": "c", "method": "retrieve", "params": {"query": 1}},
        5,
    ]
    answers = node.post(json.dumps(batch)).json()
    assert [a.get("id") for a in answers] == ["a", "b", "c", None]
    assert "result" in answers[0] and answers[1]["error"]["code"] == -32601 and answers[2]["error"]["code"] == -32602
    assert answers[3]["error"]["code"] == -32600
    assert node.post(json.dumps({"jsonrpc": "2.0", "method": "status"})).status_code == 204
    too_many = [{"jsonrpc": "2.0", "id": i, "method": "status"} for i in range(101)]
    assert node.post(json.dumps(too_many)).json()["error"]["code"] == -32600


def test_an_oversized_body_is_refused_unread(node):
    response = node.post(b"[" + b" " * (2 << 20) + b"]")
    assert response.status_code == 413 and response.headers["connection"] == "close"
    chunked = node.http.post(
        node.url, content=iter([b"[" + b" " * (1 << 16)] * 40), headers={"Content-Type": "application/json"}
    )
    assert chunked.status_code == 413  # no Content-Length: refused once the stream passes the limit
    assert node.call("status")["log_size"] >= 0


def test_metrics_count_operations_requests_and_batches(node):
    _add(node, "When a sum of positive terms must be bounded, compare it with an integral.", "math.analysis", 0.7)
    text = node.http.get(node.url + "metrics").text
    assert 'expledger_operations_total{code="",source="rpc",verdict="accepted"}' in text
    assert 'expledger_rpc_calls_total{method="add",outcome="ok"}' in text
    assert "expledger_ingest_batch_operations_count" in text and "expledger_ingest_batch_seconds_count" in text
    status = node.call("status")
    live = status["live_experiences"]
    assert live >= 1 and status["index"]["indexed"] == live
    assert f"expledger_live_experiences {float(live)}" in text and "expledger_pending_operations 0.0" in text
    assert "expledger_operations_waited_total 0.0" in text  # built on the heads: nothing waited
    assert f"expledger_log_size {float(node.call('status')['log_size'])}" in text
    before = _metric(text, "expledger_retrieval_seconds_count")
    node.call("retrieve", {"query": "bounding sums"})
    assert _metric(node.http.get(node.url + "metrics").text, "expledger_retrieval_seconds_count") == before + 1


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_events_stream_each_applied_operation(node):
    uri = node.url.replace("http", "ws") + "events?token=" + node.token
    with websockets.sync.client.connect(uri, open_timeout=10) as socket_:
        made = _add(node, "When an invariant seems to fail, verify it against small cases first.", "math.logic", 0.6)
        event = json.loads(socket_.recv(timeout=10))
    assert event["type"] == "operation"
    assert event["data"] == {"cid": made["cid"], "kind": "add", "outcome": "applied", "code": None, "source": "rpc"}
    with pytest.raises(websockets.exceptions.InvalidStatus):
        websockets.sync.client.connect(node.url.replace("http", "ws") + "events", open_timeout=10)


def test_a_full_ingest_queue_refuses_with_busy(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    config = (
        (home / "config.toml").read_text().replace("queue = 10000", "queue = 1").replace("batch = 1000", "batch = 1")
    )
    (home / "config.toml").write_text(config)
    with running(home) as daemon:
        codes: list[int | None] = []

        def add(index: int) -> None:
            answer = daemon.request(
                "add", {"text": f"When case {'x' * index} arises, check it first.", "domain": "m", "confidence": 0.5}
            )
            codes.append(answer.get("error", {}).get("code"))

        threads = [threading.Thread(target=add, args=(i,)) for i in range(1, 25)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert -32003 in codes and None in codes
        assert daemon.call("status")["log_size"] == codes.count(None)


def test_the_cli_drives_the_daemon(node):
    """Every client command against the running daemon, in this process (the installed entry point is started as a
    process by the tests around it: init, the refusals, no daemon running)."""
    home = node.home
    added = expledger_here(
        "add",
        "--text",
        "When a recurrence has constant coefficients, try a characteristic root.",
        "--domain",
        "math.recurrences",
        "--confidence",
        "0.75",
        home=home,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("applied add bafyrei")
    cid = added.stdout.split()[-1]
    as_json = expledger_here("get", cid, "--json", home=home)
    assert json.loads(as_json.stdout)["id"] == cid
    for args in (
        ["status"],
        ["list"],
        ["history", cid],
        ["retrieve", "recurrence with constant coefficients"],
        ["context", "a recurrence"],
        ["head"],
        ["proof", "inclusion", cid],
        ["proof", "consistency", "1"],
        ["vote", cid, "up"],
        ["modify", cid, "--confidence", "0.8"],
    ):
        result = expledger_here(*args, home=home)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.strip()
    refused = expledger_here("add", "--text", "no context clause", "--domain", "m", "--confidence", "0.5", home=home)
    assert refused.returncode == 1 and refused.stderr.startswith("expledger: error: text.structure: ")


def test_the_cli_says_when_no_daemon_runs(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    result = expledger("status", home=home)
    assert result.returncode == 3 and "daemon.not_running" in result.stderr and str(home) in result.stderr
    (home / "rpc.url").write_text("http://127.0.0.1:9/\n")  # a stale file from a daemon that died
    (home / "rpc.cookie").write_text("__cookie__:stale")
    result = expledger("status", home=home)
    assert result.returncode == 3 and "daemon.unreachable" in result.stderr


def test_start_up_refuses_with_one_line(tmp_path, home, node):
    second = subprocess.run([str(EXPLEDGER), "daemon", "--home", str(home)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "already running" in second.stderr and len(second.stderr.splitlines()) == 1

    fresh = tmp_path / "fresh"
    init_home(fresh)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = (fresh / "config.toml").read_text().replace("127.0.0.1:0", f"127.0.0.1:{port}")
        (fresh / "config.toml").write_text(config)
        busy = subprocess.run(
            [str(EXPLEDGER), "daemon", "--home", str(fresh)], capture_output=True, text=True, timeout=60
        )
    assert busy.returncode == 2 and f"127.0.0.1:{port}" in busy.stderr and "in use" in busy.stderr

    (fresh / "config.toml").write_text("[rpc]\nlisten = 8645\n")
    bad = subprocess.run([str(EXPLEDGER), "daemon", "--home", str(fresh)], capture_output=True, text=True, timeout=60)
    assert (
        bad.returncode == 2
        and "config.type" in bad.stderr
        and "[rpc] listen" in bad.stderr
        and "config.toml" in bad.stderr
    )

    (fresh / "config.toml").write_text('[rpc]\nlisten = "127.0.0.1:0"\n')
    params = json.loads((fresh / "network.json").read_text())
    (fresh / "network.json").write_text(json.dumps({**params, "text_max": 64}))
    other = subprocess.run([str(EXPLEDGER), "daemon", "--home", str(fresh)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "store.network" in other.stderr
    (fresh / "network.json").write_text(json.dumps(params))

    for log in (fresh / "data" / "ledger.db").glob("*.log"):
        log.write_bytes(b"\x00" * 100)
    (fresh / "data" / "ledger.db" / "CURRENT").unlink()
    damaged = subprocess.run(
        [str(EXPLEDGER), "daemon", "--home", str(fresh)], capture_output=True, text=True, timeout=60
    )
    assert damaged.returncode == 2 and "store.missing" in damaged.stderr


def test_the_stop_method_stops_gracefully(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    daemon = start(home)
    assert daemon.call("stop") == {"stopping": True}
    assert daemon.process.wait(30) == 0
    assert not (home / "rpc.cookie").exists() and not (home / "rpc.url").exists() and not (home / "daemon.pid").exists()
    assert any(line["message"] == "stopped" for line in log_lines(home))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stop_during_a_stream_of_submissions_loses_nothing_acknowledged(tmp_path, sig):
    home = tmp_path / "home"
    init_home(home)
    daemon = start(home)
    acknowledged: list[str] = []
    stop = threading.Event()

    def stream(worker: int) -> None:
        client = httpx.Client(headers={"Authorization": f"Bearer {daemon.token}"}, timeout=30)
        index = 0
        while not stop.is_set():
            index += 1
            body = {
                "jsonrpc": "2.0",
                "id": index,
                "method": "add",
                "params": {
                    "text": f"When worker {worker} meets case {'i' * index}, check it.",
                    "domain": "m",
                    "confidence": 0.5,
                },
            }
            try:
                answer = client.post(daemon.url, json=body).json()
            except (httpx.HTTPError, ValueError):
                break  # the daemon went away mid-request: that one was not acknowledged
            if "result" in answer:
                acknowledged.append(answer["result"]["cid"])
        client.close()

    workers = [threading.Thread(target=stream, args=(worker,)) for worker in range(4)]
    for worker in workers:
        worker.start()
    while len(acknowledged) < 40:  # poll for a condition, not a fixed wait
        assert daemon.process.poll() is None
        time.sleep(0.01)
    daemon.process.send_signal(sig)
    status = daemon.process.wait(30)
    stop.set()
    for worker in workers:
        worker.join()
    daemon.stop()
    assert status == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    with running(home) as restarted:
        for cid in acknowledged:
            assert restarted.call("proof.inclusion", {"cid": cid})["cid"] == cid
        assert restarted.call("status")["pending"] == 0
    assert os.path.exists(home / "data" / "tree-head.cbor")


_METHODS = [
    "submit",
    "add",
    "modify",
    "delete",
    "merge",
    "vote",
    "get",
    "list",
    "history",
    "retrieve",
    "context",
    "coverage",
    "head",
    "proof.inclusion",
    "proof.consistency",
    "state_root",
    "status",
]  # every method but stop
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=10,
)
_params = st.one_of(
    _json,
    st.dictionaries(
        st.sampled_from(
            [
                "text",
                "domain",
                "confidence",
                "id",
                "target",
                "targets",
                "query",
                "k",
                "cid",
                "operation",
                "old_size",
                "size",
                "value",
                "reason",
                "limit",
                "cursor",
                "threshold",
                "queries",
            ]
        ),
        _json,
        max_size=5,
    ),
)
_requests = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0"]), "method": st.one_of(st.sampled_from(_METHODS), _json)},
    optional={"id": st.one_of(st.integers(), st.text(max_size=8), st.none(), st.booleans()), "params": _params},
)


def _valid_response(answer: object) -> None:
    assert isinstance(answer, dict) and answer.get("jsonrpc") == "2.0" and "id" in answer, answer
    assert ("result" in answer) != ("error" in answer), answer
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int) and isinstance(answer["error"]["message"], str), answer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_requests, st.lists(_requests, min_size=1, max_size=4), _json))
def test_generated_requests_get_valid_json_rpc_answers(node, body):
    response = node.post(json.dumps(body))
    assert response.status_code in (200, 204), response.text
    if response.status_code == 204:
        assert response.content == b""
    else:
        answer = response.json()
        for item in answer if isinstance(answer, list) else [answer]:
            _valid_response(item)
    assert node.http.get(node.url + "health").json()["status"] == "ok"
