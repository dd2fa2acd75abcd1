"""docker/ on a real container engine: the image builds from docker/Dockerfile, and two containers of it, a
bootstrap node and one that joins it through the published peer id, peer and reach the same state root.

It needs an engine that answers (`podman info` or `docker info`, asked, not only found on PATH) and is opted
into with EXPLEDGER_ENGINE_TEST=1: a first build takes minutes, too long for every run of the suite.
scripts/docker-check.sh installs Podman where none answers, makes a base image where Docker Hub is out of reach,
and runs this file (docs/DEVNET.md). The containers share the host's network, each node on its own free ports of
127.0.0.1, as tests/test_docker_files.py runs the entrypoint without an engine; compose's network is not used.

  EXPLEDGER_CONTAINER_ENGINE   docker or podman (default: the first of them whose `info` answers)
  EXPLEDGER_BASE_IMAGE         the Dockerfile's BASE_IMAGE (default its own, python:3.11-slim-bookworm)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.test_docker_files import free_ports

ROOT = Path(__file__).resolve().parent.parent
TAG = "experience-ledger:engine-test"
BUILD_TIMEOUT = 1800.0  # a first build downloads ~100 wheels and compiles one
READY_TIMEOUT = 180.0  # seconds for a container's first start (init, the model) on 2 shared cores
CONVERGE_TIMEOUT = 120.0


def engine_answering() -> tuple[str | None, str]:
    """The first engine whose `info` answers, or None and what each one said instead."""
    wanted = os.environ.get("EXPLEDGER_CONTAINER_ENGINE")
    said = []
    for name in [wanted] if wanted else ["docker", "podman"]:
        path = shutil.which(name)
        if path is None:
            said.append(f"{name} is not installed")
            continue
        try:
            answer = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            said.append(f"`{name} info` did not answer in 60 s")
            continue
        if answer.returncode == 0:
            return path, ""
        lines = answer.stderr.strip().splitlines() or [f"exit status {answer.returncode}"]
        said.append(f"`{name} info`: {lines[-1]}")
    return None, "; ".join(said)


@pytest.fixture(scope="module")
def engine() -> str:
    path, said = engine_answering()
    if path is None:
        pytest.skip(f"no container engine answers ({said}); scripts/docker-check.sh installs Podman")
    if os.environ.get("EXPLEDGER_ENGINE_TEST") != "1":
        pytest.skip(
            f"{Path(path).name} answers, but building the image takes minutes: "
            "run scripts/docker-check.sh (or set EXPLEDGER_ENGINE_TEST=1)"
        )
    return path


def run(engine: str, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([engine, *argv], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image(engine: str) -> str:
    """The project's image, built from the repository root as compose.yaml builds it."""
    argv = ["build", "-f", str(ROOT / "docker" / "Dockerfile"), "-t", TAG]
    if Path(engine).name == "podman":
        argv += ["--format", "docker"]  # the OCI format has no HEALTHCHECK
    if base := os.environ.get("EXPLEDGER_BASE_IMAGE"):
        argv += ["--build-arg", f"BASE_IMAGE={base}"]
    built = run(engine, *argv, str(ROOT), timeout=BUILD_TIMEOUT)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    return TAG


def test_the_image_runs_the_node_as_its_user_with_a_health_check_and_no_compiler(engine, image):
    inspected = json.loads(run(engine, "image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "10001:10001"
    health = config.get("Healthcheck") or inspected["Healthcheck"]  # Docker's place, then Podman's
    assert health["Test"] == ["CMD", "expledger-healthcheck"]
    assert config["Entrypoint"] == ["expledger-entrypoint"]
    probe = (
        "id -u; id -g; id -gn; command -v gcc || echo no-gcc; "
        "python -c 'import fastecdsa.curvemath, plyvel, node; print(\"imports\")'"
    )
    shown = run(engine, "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", probe)
    assert shown.returncode == 0, shown.stderr
    # the group is the user's own, the compiler went with its layer, and GMP's library stayed for fastecdsa
    assert shown.stdout.split() == ["10001", "10001", "expledger", "no-gcc", "imports"]


@contextmanager
def container(engine: str, image: str, name: str, env: dict[str, str], shared: str) -> Iterator[str]:
    """A node's container on the host's network, its home in an anonymous volume (the image's /data); stopped
    (SIGTERM, then SIGKILL after 30 s) and removed with its volume whatever happens."""
    environment = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
    started = run(engine, "run", "-d", "--name", name, "--network", "host", "-v", shared, *environment, image)
    try:
        assert started.returncode == 0, started.stderr
        yield name
    finally:
        run(engine, "stop", "-t", "30", name, timeout=60)
        run(engine, "rm", "-f", "-v", name)


def wait_healthy(engine: str, name: str) -> None:
    """Until the image's own health check passes in the container (Podman runs HEALTHCHECK only with systemd)."""
    deadline = time.monotonic() + READY_TIMEOUT
    while run(engine, "exec", name, "expledger-healthcheck").returncode != 0:
        state = run(engine, "inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        logs = run(engine, "logs", "--tail", "20", name)
        assert state == "true", f"{name} stopped: {logs.stdout}{logs.stderr}"
        assert time.monotonic() < deadline, f"{name} was not healthy in time: {logs.stdout}{logs.stderr}"
        time.sleep(1.0)


def cli(engine: str, name: str, *argv: str) -> dict[str, Any]:
    """`expledger ARGV --json` in the container: the CLI, through the node's RPC on its cookie."""
    answer = run(engine, "exec", name, "expledger", *argv, "--json")
    assert answer.returncode == 0, answer.stdout + answer.stderr
    return json.loads(answer.stdout)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = CONVERGE_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def same_root(engine: str, names: list[str], log_size: int) -> bool:
    answers = [cli(engine, name, "status") for name in names]
    return {(answer["log_size"], answer["state_root"]) for answer in answers} == {(log_size, answers[0]["state_root"])}


def test_two_containers_peer_and_converge_to_one_state_root(engine, image, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the containers' user (10001) writes the bootstrap node's peer id here
    boot_rpc, boot_p2p, node_rpc, node_p2p = free_ports(4)
    prefix = f"expledger-engine-test-{os.getpid()}"
    boot_env = {
        "EXPLEDGER_LISTEN": "127.0.0.1",
        "EXPLEDGER_RPC_PORT": str(boot_rpc),
        "EXPLEDGER_P2P_PORT": str(boot_p2p),
        "EXPLEDGER_PUBLISH_ID": "/shared/bootstrap.id",
    }
    node_env = {
        "EXPLEDGER_LISTEN": "127.0.0.1",
        "EXPLEDGER_RPC_PORT": str(node_rpc),
        "EXPLEDGER_P2P_PORT": str(node_p2p),
        "EXPLEDGER_BOOTSTRAP_HOST": "localhost",  # resolved by name, as compose's service names are
        "EXPLEDGER_BOOTSTRAP_PORT": str(boot_p2p),
    }
    with (
        container(engine, image, f"{prefix}-bootstrap", boot_env, f"{shared}:/shared") as boot,
        container(engine, image, f"{prefix}-node", node_env, f"{shared}:/shared:ro") as node,
    ):
        wait_healthy(engine, boot)
        wait_healthy(engine, node)
        boot_id = cli(engine, boot, "id")["peer_id"]
        assert (shared / "bootstrap.id").read_text().strip() == boot_id

        def joined() -> bool:
            return any(peer["peer_id"] == boot_id and peer["connected"] for peer in cli(engine, node, "peers")["peers"])

        wait_until(joined, "the joined node never connected to the bootstrap node")
        added = [
            cli(engine, name, "add", "--text", text, "--domain", "ops.docker", "--confidence", "0.7")["cid"]
            for name, text in [
                (node, "When a container restarts, check that its volume kept the node's home."),
                (boot, "When two containers share the host's network, give each node its own ports."),
            ]
        ]
        wait_until(lambda: same_root(engine, [boot, node], 2), "the two containers never reached one state root")
        for name in (boot, node):
            assert {cli(engine, name, "get", cid)["library"]["status"] for cid in added} == {"live"}

        node_id = cli(engine, node, "status")["p2p"]["peer_id"]
        assert run(engine, "restart", "-t", "30", node, timeout=90).returncode == 0
        wait_healthy(engine, node)  # the same volume: the node's key and ledger are still there
        assert cli(engine, node, "status")["p2p"]["peer_id"] == node_id
        assert same_root(engine, [boot, node], 2)
