"""docker/: checked without a Docker engine. The compose file must pass `docker-compose config --quiet` and
the Dockerfile `hadolint` (both from PyPI, in the dev extras); each tool is first shown to refuse a broken
file, so a pass means something. The image's entrypoint and health check are shell and Python: they run
here as plain processes — a bootstrap node publishing its peer id, a second node joining it through that
file, and a restart on the same home (the entrypoint's `init` must be idempotent).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devnet.network import port_free
from node.client import Client, RpcFailed
from node.home import Home
from tests.daemons import READY

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
CONNECT_TIMEOUT = 120.0
READY_TIMEOUT = 180.0  # seconds for init and a daemon start on 2 shared cores


def tool(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_compose_file_is_valid():
    checked = tool("docker-compose", "-f", str(DOCKER / "compose.yaml"), "config", "--quiet")
    assert checked.returncode == 0, checked.stderr


def test_docker_compose_config_refuses_a_broken_file(tmp_path):
    broken = (DOCKER / "compose.yaml").read_text().replace("condition: service_healthy", "condition: service_happy")
    (tmp_path / "compose.yaml").write_text(broken)
    checked = tool("docker-compose", "-f", str(tmp_path / "compose.yaml"), "config", "--quiet")
    assert checked.returncode != 0 and "services.node.depends_on.bootstrap.condition" in checked.stderr


def test_the_compose_devnet_is_one_bootstrap_node_and_nodes_that_wait_for_its_health():
    config = json.loads(tool("docker-compose", "-f", str(DOCKER / "compose.yaml"), "config", "--format", "json").stdout)
    bootstrap, node = config["services"]["bootstrap"], config["services"]["node"]
    published = node["environment"]["EXPLEDGER_BOOTSTRAP_ID"]
    assert bootstrap["environment"]["EXPLEDGER_PUBLISH_ID"] == published
    assert node["environment"]["EXPLEDGER_BOOTSTRAP_HOST"] == "bootstrap"
    assert node["depends_on"]["bootstrap"]["condition"] == "service_healthy"
    assert {port["host_ip"] for service in (bootstrap, node) for port in service["ports"]} == {"127.0.0.1"}
    # one service builds the image, the others run it and never pull it
    assert bootstrap["build"]["dockerfile"] == "docker/Dockerfile" and "build" not in node
    assert bootstrap["image"] == node["image"] and node["pull_policy"] == "never"
    assert "BASE_IMAGE" in bootstrap["build"]["args"]  # EXPLEDGER_BASE_IMAGE, else the Dockerfile's own


def test_the_dockerfile_passes_hadolint():
    linted = tool("hadolint", str(DOCKER / "Dockerfile"))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^USER \d+", text, flags=re.MULTILINE)  # not root
    assert re.search(r"^HEALTHCHECK .*expledger-healthcheck", text, flags=re.MULTILINE)
    assert 'VOLUME ["/data"]' in text and "ENV EXPLEDGER_HOME=/data" in text


def test_hadolint_refuses_a_bad_dockerfile(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:latest\nRUN pip install requests\n")
    linted = tool("hadolint", str(tmp_path / "Dockerfile"))
    assert linted.returncode != 0 and "DL3007" in linted.stdout  # "latest" is not a pinned image


def free_ports(count: int) -> list[int]:
    """`count` ports free now, between 20000 and 32000 (below the ephemeral range port-0 listeners use)."""
    chooser = random.Random(os.getpid() ^ time.time_ns())
    ports: list[int] = []
    while len(ports) < count:
        port = chooser.randrange(20000, 32000)
        if port not in ports and port_free(port):
            ports.append(port)
    return ports


@contextmanager
def entrypoint(env: dict[str, str]) -> Iterator[list[str]]:
    """docker/entrypoint.sh as the image runs it; it execs the daemon, so its pid is the daemon's. Yields
    the lines it printed until the daemon was ready; stops it by pid (SIGTERM, as `docker stop`) whatever
    happens."""
    process = subprocess.Popen(
        [str(DOCKER / "entrypoint.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        printed = []
        deadline = time.monotonic() + READY_TIMEOUT
        while not printed or not printed[-1].startswith(READY):
            line = process.stdout.readline()  # the entrypoint's lines, then the daemon's one line when ready
            assert line, f"the entrypoint ended ({process.wait()}): {process.stderr.read()}"
            assert time.monotonic() < deadline, "the daemon was not ready in time"
            printed.append(line)
        yield printed
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        process.stdout.close()
        process.stderr.close()


def healthy(rpc_port: int) -> bool:
    check = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env={**os.environ, "EXPLEDGER_RPC_PORT": str(rpc_port)},
        capture_output=True,
        timeout=30,
    )
    return check.returncode == 0


def wait_connected(home: Path, peer_id: str) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        peers = Client(Home(home)).call("peers")["peers"]
        if any(peer["peer_id"] == peer_id and peer["connected"] for peer in peers):
            return
        assert time.monotonic() < deadline, f"{home} did not connect to {peer_id}"
        time.sleep(0.1)


def test_the_entrypoint_publishes_joins_and_restarts_on_the_same_home(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    boot_rpc, boot_p2p, node_rpc, node_p2p = free_ports(4)
    base = {key: value for key, value in os.environ.items() if not key.startswith("EXPLEDGER_")}
    base.update(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", EXPLEDGER_LISTEN="127.0.0.1")
    bootstrap_env = {
        **base,
        "EXPLEDGER_HOME": str(tmp_path / "bootstrap"),
        "EXPLEDGER_RPC_PORT": str(boot_rpc),
        "EXPLEDGER_P2P_PORT": str(boot_p2p),
        "EXPLEDGER_PUBLISH_ID": str(shared / "bootstrap.id"),
    }
    node_env = {
        **base,
        "EXPLEDGER_HOME": str(tmp_path / "node"),
        "EXPLEDGER_RPC_PORT": str(node_rpc),
        "EXPLEDGER_P2P_PORT": str(node_p2p),
        "EXPLEDGER_BOOTSTRAP_HOST": "localhost",  # resolved by name, as compose's service names are
        "EXPLEDGER_BOOTSTRAP_ID": str(shared / "bootstrap.id"),
        "EXPLEDGER_BOOTSTRAP_PORT": str(boot_p2p),
    }
    assert not healthy(boot_rpc)
    with entrypoint(bootstrap_env):
        assert healthy(boot_rpc)
        bootstrap_id = (shared / "bootstrap.id").read_text().strip()
        shown = subprocess.run(
            [str(BIN / "expledger"), "id", "--home", str(tmp_path / "bootstrap"), "--json"],
            capture_output=True,
            text=True,
        )
        assert json.loads(shown.stdout)["peer_id"] == bootstrap_id
        with entrypoint(node_env) as printed:
            assert any(line.startswith("set [p2p] bootstrap") and bootstrap_id in line for line in printed)
            wait_connected(tmp_path / "node", bootstrap_id)
            text = "When a container restarts, check that its volume kept the data."
            added = Client(Home(tmp_path / "node")).call("add", text=text, domain="ops.docker", confidence=0.7)
            deadline = time.monotonic() + CONNECT_TIMEOUT
            while not present(tmp_path / "bootstrap", added["cid"]):
                assert time.monotonic() < deadline, "the joined node's experience never reached the bootstrap node"
                time.sleep(0.1)
            node_id = Client(Home(tmp_path / "node")).call("status")["p2p"]["peer_id"]
        assert not healthy(node_rpc)  # stopped with SIGTERM, as `docker stop` does
        with entrypoint(node_env) as printed:  # the same home again: init finds everything, changes nothing
            assert not any(line.startswith(("created", "set")) for line in printed), printed
            assert healthy(node_rpc)
            assert Client(Home(tmp_path / "node")).call("status")["p2p"]["peer_id"] == node_id
            wait_connected(tmp_path / "node", bootstrap_id)
            assert Client(Home(tmp_path / "node")).call("get", id=added["cid"])["library"]["status"] == "live"


def present(home: Path, cid: str) -> bool:
    try:
        Client(Home(home)).call("get", id=cid)
    except RpcFailed as exc:
        assert exc.code == "not_found.experience", exc
        return False
    return True
