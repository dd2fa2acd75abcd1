"""`expledger devnet` with real daemons: the Quickstart's demo from a fresh clone, the walkthrough of
docs/DEVNET.md run as written, and the errors and recoveries its troubleshooting section promises.

Every devnet gets its own directory and a base port whose ports were free a moment before (below
Linux's ephemeral range, where other tests' port-0 listeners land). Readiness, connection and
convergence are what the commands themselves wait for; the tests then read every node over RPC.
Whatever happens, every daemon a test started is stopped by the pid in its home.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devnet.cli import build_parser as devnet_parser
from devnet.demo import build, load_library
from devnet.network import port_free
from ledger.params import NetworkParams
from node import client as node_client
from node.cli import build_parser as node_parser
from node.client import Client, RpcFailed
from node.home import Home, process_alive

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "DEVNET.md"
BIN = Path(sys.executable).parent
COMMAND_TIMEOUT = 600  # seconds for one command on 2 shared cores (each daemon loads the model)
#: the sections of docs/DEVNET.md whose ```sh blocks run, in order, as one script
WALKTHROUGH = ("A devnet by hand", "A single node", "Joining a devnet from another home")
NOT_RUN = "source .venv/bin/activate"  # the test puts .venv/bin on PATH itself
SOLO_INIT = 'expledger init --home "$PWD/solo"'
FREE_PORTS = "--rpc 127.0.0.1:0 --p2p /ip4/127.0.0.1/tcp/0"  # the defaults (8645, 4645) may be taken here
TEARDOWN = "expledger devnet down --clean"


def free_base(count: int) -> int:
    """A base port whose 2·count ports are free now, between 20000 and 32000."""
    chooser = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(500):
        base = chooser.randrange(20000, 32000 - 2 * count, 2)
        if all(port_free(port) for port in range(base, base + 2 * count)):
            return base
    raise RuntimeError("no run of free ports between 20000 and 32000")


def environment(devnet: Path | None, base: int | None, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("EXPLEDGER_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    if devnet is not None:
        env["EXPLEDGER_DEVNET"] = str(devnet)
    if base is not None:
        env["EXPLEDGER_DEVNET_BASE_PORT"] = str(base)
    return {**env, **extra}


def devnet_cli(devnet: Path, *args: str, base: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "expledger"), "devnet", *args],
        capture_output=True,
        text=True,
        env=environment(devnet, base),
        timeout=COMMAND_TIMEOUT,
    )


def stop_by_pid(home: Path) -> None:
    """SIGTERM the daemon whose pid is in `home`, then SIGKILL it if it is still there 60 s later. Only a
    process that is an expledger daemon of this home is signalled (a stale pid may have been reused)."""
    try:
        pid = int((home / "daemon.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return
    if str(home).encode() not in cmdline or b"daemon" not in cmdline:
        return
    for sig, patience in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            signal.sigtimedwait([], 0.05)  # the daemon is not our child: poll instead of waitpid


def stop_everything(*roots: Path) -> None:
    for root in roots:
        for pid_file in root.glob("**/daemon.pid"):
            stop_by_pid(pid_file.parent)


def call(home: Path, method: str, **params: Any) -> Any:
    return Client(Home(home)).call(method, **params)


def node_homes(devnet: Path) -> list[Path]:
    return sorted(devnet.glob("node*"), key=lambda path: int(path.name.removeprefix("node")))


def cid_of(history: list[dict[str, Any]], cid: str) -> dict[str, Any]:
    return next(op["status"] for op in history if op["cid"] == cid)


# --- the Quickstart's demo, from a fresh clone ----------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """`scripts/demo.sh` run as the Quickstart says, in a clone of this checkout's HEAD, with its own
    directory and ports. EXPLEDGER_DEMO_VENV lets it use this test run's virtualenv (no second install):
    the clone's own code runs, through PYTHONPATH."""
    work = tmp_path_factory.mktemp("demo")
    clone, devnet = work / "clone", work / "devnet"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    base = free_base(3)
    try:
        result = subprocess.run(
            ["scripts/demo.sh"],
            cwd=clone,
            env=environment(devnet, base, EXPLEDGER_DEMO_VENV=sys.prefix),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        yield {"clone": clone, "devnet": devnet, "base": base, "output": result.stdout}
    finally:
        stop_everything(work)


def test_the_demo_converges_and_another_node_retrieves_the_experience(demo):
    devnet, output = demo["devnet"], demo["output"]
    homes = node_homes(devnet)
    assert [home.name for home in homes] == ["node1", "node2", "node3"]
    assert "state roots: all 3 nodes agree" in output
    final_table = output.rsplit("== 5.", 1)[1]
    assert "in sync" in final_table and "catching up" not in final_table  # roots agree, nothing is missing
    roots = {call(home, "state_root")["state_root"] for home in homes}
    assert len(roots) == 1

    library = load_library()
    plan = build(NetworkParams.from_file(devnet / "network.json"))  # the same bytes the demo signed
    g0 = str(plan.adds["G0"].cid)
    assert call(homes[0], "state_root")["log_size"] == len(plan.adds) + 3  # + modify, delete, near-duplicate
    # G0 went to node1; node3 never received it, and answers with it over RPC
    hits = call(homes[2], "retrieve", query=library["problem"], k=3)["hits"]
    assert hits[0]["id"] == g0 and hits[0]["text"] == library["experiences"][0]["text"]
    prompt = call(homes[2], "context", query=library["problem"], k=3)["prompt"]
    assert prompt.startswith(f"# Learned Experiences\n\n1. {hits[0]['text']}")
    assert prompt.endswith(f"# Problem\n\n{library['problem']}")
    assert "== 5. retrieval on node3" in output and prompt in output
    for home in homes:  # the conflict and the near-duplicate, by the rules, on every node
        target = str(plan.conflict_target.cid)
        assert call(home, "get", id=target)["library"]["status"] == "deleted"
        modify = cid_of(call(home, "history", id=target)["operations"], str(plan.modify.cid))
        assert modify["outcome"] in ("void", "superseded") and modify["code"] == "superseded.deleted"
        record = call(home, "get", id=g0)["library"]
        assert record["status"] == "live" and record["support"] == 2
        assert record["absorbed"] == [str(plan.near_duplicate.cid)]

    # the clone's code ran, not this checkout's: its daemons import from the clone
    pid = int((homes[0] / "daemon.pid").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"PYTHONPATH={demo['clone']}".encode() in environ


def test_the_demo_says_why_two_embedders_heads_its_status_table_and_how_to_query_a_node(demo):
    output = demo["output"]
    assert "why two embedders: every operation carries a WordLlama vector" in output
    assert "the network's consensus embedding" in output and "minilm-l6-int8 is a better retrieval model" in output
    prompt_end, heading = output.index("# Problem"), output.index("== 7. the devnet's nodes now (`devnet status`)")
    table = output.index("NODE ", heading)
    assert prompt_end < heading < table and output[heading:table].count("\n") == 1  # the table follows its heading
    node1 = demo["devnet"] / "node1"
    assert f'retrieve --home {node1} "your question"`, or `export EXPLEDGER_HOME={node1}`' in output


def test_a_command_on_a_home_with_no_node_points_at_the_running_devnet(demo, tmp_path):
    """A newcomer after the demo types `expledger retrieve …` with no home: the answer names the devnet's node
    to query instead of only `expledger init` (which would make a new, empty node)."""
    env = environment(demo["devnet"], None, HOME=str(tmp_path))  # ~/.expledger holds no node
    bare = subprocess.run([str(BIN / "expledger"), "retrieve", "bounds"], capture_output=True, text=True, env=env)
    node1 = demo["devnet"] / "node1"
    assert bare.returncode == 2 and bare.stderr.startswith("expledger: error: home.uninitialised: ")
    hint = bare.stderr.splitlines()[1]
    assert hint.startswith(f"expledger: hint: the devnet in {demo['devnet']} runs node1, node2, node3; ")
    assert f"add `--home {node1}` or `export EXPLEDGER_HOME={node1}`" in hint
    daemon = subprocess.run([str(BIN / "expledger"), "daemon"], capture_output=True, text=True, env=env)
    assert daemon.returncode == 2 and "home.uninitialised" in daemon.stderr and "hint" not in daemon.stderr
    followed = subprocess.run(
        [str(BIN / "expledger"), "list", "--limit", "3"],
        capture_output=True,
        text=True,
        env={**env, "EXPLEDGER_HOME": str(node1), "COLUMNS": "60"},
    )
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.startswith("ID ") and "more: --cursor" in followed.stdout


def test_retrieve_and_list_show_whole_texts_wrapped_to_the_terminal(demo):
    home = demo["devnet"] / "node3"
    library = load_library()
    texts = {experience["text"] for experience in library["experiences"]}
    for args in (["retrieve", library["problem"], "-k", "3"], ["list", "--limit", "1000"]):
        shown = subprocess.run(
            [str(BIN / "expledger"), *args, "--home", str(home)],
            capture_output=True,
            text=True,
            env=environment(None, None, COLUMNS="60"),
        )
        assert shown.returncode == 0, shown.stderr
        blocks = re.split(r"^(?=\S)", shown.stdout, flags=re.M)[1:]  # a row, then its text's lines indented
        shown_texts = {" ".join(line.strip() for line in block.splitlines()[1:]) for block in blocks}
        assert len(shown_texts & texts) >= 3 and "…" not in shown.stdout, shown.stdout
        texts_lines = [line for block in blocks for line in block.splitlines()[1:]]
        assert all(len(line) <= 60 for line in texts_lines), shown.stdout


def test_a_batch_of_gets_answers_in_order_across_requests_and_raises_the_first_error(demo, monkeypatch):
    """`list` fetches its texts with JSON-RPC batches of `get` (at most the server's 100 calls each)."""
    client = Client(Home(demo["devnet"] / "node2"))
    ids = [record["id"] for record in client.call("list", limit=1000)["experiences"]]
    monkeypatch.setattr(node_client, "BATCH", 7)
    assert [view["id"] for view in client.batch("get", [{"id": cid} for cid in ids])] == ids
    with pytest.raises(RpcFailed) as refused:
        client.batch("get", [{"id": ids[0]}, {"id": "not-a-cid"}])
    assert refused.value.rpc_code == -32602 and "id" in refused.value.message


def test_up_on_a_running_devnet_says_so_and_starts_only_what_is_down(demo):
    devnet = demo["devnet"]
    pids = {home.name: (home / "daemon.pid").read_text() for home in node_homes(devnet)}
    again = devnet_cli(devnet, "up")
    assert again.returncode == 1
    assert again.stderr.startswith("expledger: error: devnet.running: the devnet in")
    assert "already running (3 nodes)" in again.stderr
    assert {home.name: (home / "daemon.pid").read_text() for home in node_homes(devnet)} == pids
    start = devnet_cli(devnet, "start", "node2")
    assert start.returncode == 1 and "already running: node2" in start.stderr

    assert devnet_cli(devnet, "stop", "node2").returncode == 0
    partly = devnet_cli(devnet, "up")  # brings up what is down, and only that
    assert partly.returncode == 0, partly.stderr
    assert "1 of 3 nodes running" not in partly.stdout and "2 of 3 nodes running" in partly.stdout
    assert "starting 1 daemon(s): node2" in partly.stdout and "devnet up: 3 nodes" in partly.stdout
    for name in ("node1", "node3"):
        assert (devnet / name / "daemon.pid").read_text() == pids[name]


def test_a_port_in_use_is_named_with_its_node_and_nothing_is_made(demo, tmp_path):
    base = demo["base"]  # node1's RPC port belongs to the demo's node1
    taken = devnet_cli(tmp_path / "second", "up", "--nodes", "2", "--base-port", str(base))
    assert taken.returncode == 2
    assert f"devnet.port_in_use: node1's RPC port 127.0.0.1:{base} is in use" in taken.stderr
    assert not (tmp_path / "second").exists()

    other = free_base(3)
    with socket.socket() as holder:  # a program of someone else's on node2's p2p port
        holder.bind(("127.0.0.1", other + 3))
        holder.listen()
        taken = devnet_cli(tmp_path / "third", "up", "--base-port", str(other))
    assert taken.returncode == 2
    assert f"node2's p2p port 127.0.0.1:{other + 3} is in use" in taken.stderr
    assert not (tmp_path / "third").exists()


def test_unknown_nodes_and_missing_devnets_are_refused(demo, tmp_path):
    devnet = demo["devnet"]
    for args in (["stop", "node9"], ["start", "node0"], ["logs", "node4"], ["stop", "node1", "nodeX"]):
        refused = devnet_cli(devnet, *args)
        assert refused.returncode == 2, args
        assert "devnet.node: no node" in refused.stderr and "its nodes are node1, node2, node3" in refused.stderr
    assert all((home / "daemon.pid").exists() for home in node_homes(devnet))  # `stop node1 nodeX` stopped none
    missing = devnet_cli(tmp_path / "nothing-here", "status")
    assert missing.returncode == 3 and "devnet.missing" in missing.stderr
    grown = devnet_cli(devnet, "up", "--nodes", "4")
    assert grown.returncode == 2 and "holds a devnet of 3 nodes, not 4" in grown.stderr


def test_a_killed_node_and_a_refused_data_directory_recover_as_documented(demo):
    devnet = demo["devnet"]
    node3 = devnet / "node3"
    os.kill(int((node3 / "daemon.pid").read_text()), signal.SIGKILL)
    deadline = time.monotonic() + 60
    status = json.loads(devnet_cli(devnet, "status", "--json").stdout)
    while status["nodes"][2]["state"] == "running" and time.monotonic() < deadline:  # SIGKILL takes a moment
        signal.sigtimedwait([], 0.05)
        status = json.loads(devnet_cli(devnet, "status", "--json").stdout)
    assert status["nodes"][2]["state"] == "crashed" and (node3 / "rpc.cookie").exists()  # stale
    assert status["roots_agree"] is False and status["answering"] == 2

    genesis = (node3 / "network.json").read_text()
    params = json.loads(genesis)
    (node3 / "network.json").write_text(json.dumps({**params, "network_id": "elsewhere"}))
    refused = devnet_cli(devnet, "start", "node3")
    assert refused.returncode == 1
    assert "could not start node3: expledger: error: store.network:" in refused.stderr

    (node3 / "network.json").write_text(genesis)
    shutil.rmtree(node3 / "data")  # the documented remedy: fetch everything again from the other nodes
    shutil.rmtree(node3 / "p2p")
    assert subprocess.run([str(BIN / "expledger"), "init", "--home", str(node3)], capture_output=True).returncode == 0
    started = devnet_cli(devnet, "start", "node3")
    assert started.returncode == 0, started.stderr
    size = call(devnet / "node1", "state_root")["log_size"]
    assert f"node3 in sync: log {size}" in started.stdout
    status = json.loads(devnet_cli(devnet, "status", "--json").stdout)
    assert status["roots_agree"] is True and [row["state"] for row in status["nodes"]] == ["running"] * 3


def test_the_demo_run_again_submits_nothing_new(demo):
    devnet = demo["devnet"]
    before = {home.name: call(home, "state_root") for home in node_homes(devnet)}
    again = subprocess.run(
        ["scripts/demo.sh"],
        cwd=demo["clone"],
        env=environment(devnet, demo["base"], EXPLEDGER_DEMO_VENV=sys.prefix),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert again.returncode == 0, again.stderr
    assert "node1 took 14 duplicate" in again.stdout
    assert {home.name: call(home, "state_root") for home in node_homes(devnet)} == before


def test_logs_then_down_clean_removes_the_devnet(demo):
    devnet = demo["devnet"]
    logs = devnet_cli(devnet, "logs", "--tail", "1")
    assert logs.returncode == 0
    assert [line.split(" | ")[0].strip() for line in logs.stdout.splitlines()] == ["node1", "node2", "node3"]
    # the follower gets SIGINT's default action even when the suite runs in the background (`scripts/test.sh &`),
    # where the shell makes it ignored, a disposition Python keeps and every child inherits
    default_sigint = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    follow = subprocess.Popen(
        [sys.executable, "-c", default_sigint, str(BIN / "expledger"), "devnet", "logs", "node1", "-f"],
        stdout=subprocess.PIPE,
        bufsize=0,  # unbuffered: select() sees every byte not read yet
        env=environment(devnet, None),
    )
    assert follow.stdout is not None
    try:
        deadline = time.monotonic() + 60
        seen = b""
        while b"ready: RPC on" not in seen and select.select([follow.stdout], [], [], deadline - time.monotonic())[0]:
            seen = follow.stdout.readline()
        assert b"ready: RPC on" in seen  # node1's log, printed whole before following it
    finally:
        follow.send_signal(signal.SIGINT)
        try:
            follow.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            follow.kill()
            follow.communicate()
            raise
    assert follow.returncode == 0  # Ctrl-C ends `logs -f` quietly
    down = devnet_cli(devnet, "down", "--clean")
    assert down.returncode == 0, down.stderr
    assert sorted(re.findall(r"node\d stopped", down.stdout)) == ["node1 stopped", "node2 stopped", "node3 stopped"]
    assert not devnet.exists()


# --- docs/DEVNET.md, run as written ---------------------------------------------------------------------


def sh_blocks(section: str) -> list[str]:
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)


def walkthrough() -> tuple[str, str]:
    """The walkthrough's script up to the devnet's removal, and that last line."""
    lines = "".join(block for section in WALKTHROUGH for block in sh_blocks(section)).splitlines()
    assert sum(line.split("#")[0].strip() == NOT_RUN for line in lines) == 1, "the walkthrough changed"
    assert sum(line.startswith(SOLO_INIT) for line in lines) == 1, "the walkthrough changed"
    assert lines[-1].split("#")[0].strip() == TEARDOWN, "the walkthrough changed: it must end with the removal"
    kept = [
        line.replace(SOLO_INIT, f"{SOLO_INIT} {FREE_PORTS}", 1)
        for line in lines[:-1]
        if line.split("#")[0].strip() != NOT_RUN
    ]
    return "\n".join(kept) + "\n", lines[-1]


def test_the_walkthrough_runs_as_written_and_the_restarted_node_catches_up(tmp_path):
    """Five nodes; node5 stopped; an add, then a concurrent modify and delete through other nodes; node5
    started again catches up; every node agrees, and holds the experience deleted (delete beats modify)."""
    script, teardown = walkthrough()
    env = environment(None, free_base(5))
    try:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        assert "expledger: error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
        printed = result.stdout
        assert re.search(r"^node5 +stopped ", printed, flags=re.MULTILINE)  # the status while it was down
        devnet = tmp_path / "my-devnet"
        homes = node_homes(devnet)
        assert len(homes) == 5
        size = call(homes[0], "state_root")["log_size"]
        assert size == 3  # the add, the modify, the delete
        assert re.search(rf"^  node5 in sync: log {size}, [1-4] peer\(s\) reconciled$", printed, flags=re.MULTILINE)
        assert "state roots: all 5 nodes agree" in printed
        assert "status: deleted" in printed  # node5's `get`

        add = subprocess.run(
            [str(BIN / "expledger"), "op", "inspect", "add.cbor"], cwd=tmp_path, capture_output=True, text=True
        )
        modify = subprocess.run(
            [str(BIN / "expledger"), "op", "inspect", "modify.cbor"], cwd=tmp_path, capture_output=True, text=True
        )
        target, modify_cid = json.loads(add.stdout)["cid"], json.loads(modify.stdout)["cid"]
        assert len({call(home, "state_root")["state_root"] for home in homes}) == 1
        for home in homes:
            assert call(home, "get", id=target)["library"]["status"] == "deleted", home.name
            status = cid_of(call(home, "history", id=target)["operations"], modify_cid)
            # which of the two sorts first decides whether the modify is void or applied then superseded
            assert status["outcome"] in ("void", "superseded") and status["code"] == "superseded.deleted", home.name
        for joined in ("laptop-node", "far-node"):  # each joined, caught up, and was stopped by the script
            assert f"{tmp_path / joined} in sync: log 3" in printed
            assert not (tmp_path / joined / "daemon.pid").exists()
        assert printed.count("\nstopped\n") >= 3  # solo, laptop-node, far-node

        removed = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", f"export EXPLEDGER_DEVNET=$PWD/my-devnet\n{teardown}\n"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert removed.returncode == 0, removed.stderr
        assert not devnet.exists()
    finally:
        stop_everything(tmp_path)


def test_every_documented_command_parses():
    """Each `expledger …` line of docs/DEVNET.md's shell blocks is accepted by the CLI's own parsers, so a
    renamed command or flag fails here even where the block is not run (Docker, troubleshooting)."""
    text = DOC.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            commands += [words[1:]] if words[:1] == ["expledger"] else []
    assert len(commands) >= 25
    subcommands = set()
    for words in commands:
        if words[0] == "devnet":
            subcommands.add(words[1])
            devnet_parser().parse_args(words[1:])
        else:
            node_parser().parse_args(words)
    assert subcommands == {"up", "status", "logs", "stop", "start", "down", "join"}  # demo: scripts/demo.sh


def test_a_zombie_in_the_pid_file_does_not_block_a_start(tmp_path):
    """A daemon killed by a signal stays a zombie until its parent reaps it, and a detached daemon's parent is
    init, which may reap late: the pid of a zombie is not a running daemon (for `devnet status` as for the
    daemon's own check at start), so the troubleshooting's `start` works on a killed node."""
    home = tmp_path / "home"
    subprocess.run(
        [str(BIN / "expledger"), "init", "--home", str(home), *FREE_PORTS.split()], check=True, capture_output=True
    )
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once; not waited for: a zombie
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            signal.sigtimedwait([], 0.05)
        (home / "daemon.pid").write_text(f"{zombie.pid}\n")
        assert not process_alive(zombie.pid)
        started = subprocess.run(
            [str(BIN / "expledger"), "daemon", "--detach", "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert started.returncode == 0, started.stderr  # before: "a daemon is already running on … (pid N)"
    finally:
        stop_by_pid(home)
        zombie.wait()
