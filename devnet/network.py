"""A devnet: N node homes under one directory, their ports, their wiring, and their daemons.

    DIR/devnet.json   the manifest `up` writes: node count and base port (every other command reads it)
    DIR/network.json  the genesis every home was made from
    DIR/node1 … nodeN the homes (node/home.py), each with its daemon's log in daemon.log

Node i (from 1) listens for RPC on 127.0.0.1:BASE+2(i-1) and for libp2p on BASE+2(i-1)+1, so every
address is known before anything starts. Node i > 1 knows only node1 (its [p2p] bootstrap); peer discovery
(p2p/discovery.py) connects each node to up to 8 others, so stopping any one node (node1 included) leaves the
others connected, and a restarted node dials node1 and finds the rest again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.params import NetworkParams
from node.client import Client, DaemonUnavailable, RpcFailed
from node.config import LogConfig, check_value, load_config, render_config
from node.detach import LOG_FILE
from node.home import Home, process_alive

DIR_ENV = "EXPLEDGER_DEVNET"
BASE_PORT_ENV = "EXPLEDGER_DEVNET_BASE_PORT"
DEFAULT_NODES = 3
MAX_NODES = 20
DEFAULT_BASE_PORT = 8700
HOST = "127.0.0.1"
MANIFEST = "devnet.json"
NETWORK = "network.json"
#: seconds `up`, `start` and `demo` wait for nodes to be healthy, connected or converged (2 shared cores, a
#: model to load per daemon: generous)
WAIT_TIMEOUT = 240.0
POLL = 0.25
PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines
MIN_PEERS = 6  # GossipSub's mesh degree: `up` waits until every node has this many peers, or all the others

EXIT_STATE = 1  # the devnet is not in a state that allows the command (already running, not converging)
EXIT_USAGE = 2  # bad arguments or unusable input: an unknown node, a port in use, a foreign directory
EXIT_MISSING = 3  # no devnet in the directory


class DevnetError(LedgerError):
    """A devnet command that cannot be done; `exit_status` is the CLI's status for it."""

    def __init__(self, code: str, message: str, exit_status: int = EXIT_STATE) -> None:
        super().__init__(code, message)
        self.exit_status = exit_status


def default_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".expledger-devnet")


def default_base_port() -> int:
    text = os.environ.get(BASE_PORT_ENV)
    if not text:
        return DEFAULT_BASE_PORT
    if not text.isdigit():
        raise DevnetError("args.base_port", f"${BASE_PORT_ENV}: {text[:20]!r} is not a port number", EXIT_USAGE)
    return int(text)


@dataclass(frozen=True)
class NodeSpec:
    """One node of the devnet: its name, home and ports (fixed by its index and the base port)."""

    index: int
    home: Home
    rpc_port: int
    p2p_port: int

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def rpc_listen(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    @property
    def p2p_listen(self) -> str:
        return f"/ip4/{HOST}/tcp/{self.p2p_port}"

    @property
    def log_file(self) -> Path:
        return self.home.path / LOG_FILE

    def peer_id(self) -> str:
        """The libp2p peer id, from the home's p2p.key (libp2p loads only when a command needs it; the
        manifest keeps every node's, so `status` does without)."""
        from p2p.host import key_pair, peer_id

        return str(peer_id(key_pair(self.home.peer_key().seed)))

    def pid(self) -> int | None:
        """The daemon's pid while its process lives; None when stopped (or only a stale pid file is left)."""
        try:
            pid = int(self.home.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if process_alive(pid) else None

    def state(self) -> str:
        """running, stopped, or crashed: a pid file whose process is gone (killed; its cookie may be stale)."""
        if self.pid() is not None:
            return "running"
        return "crashed" if self.home.pid_file.exists() else "stopped"

    def client(self, timeout: float = 10.0) -> Client:
        return Client(self.home, timeout)


def ports_of(index: int, base_port: int) -> tuple[int, int]:
    """(RPC port, p2p port) of node `index` (from 1)."""
    return base_port + 2 * (index - 1), base_port + 2 * (index - 1) + 1


def bootstrap_of(index: int) -> list[int]:
    """The nodes node `index` knows at start: node1 (discovery finds the others)."""
    return [] if index == 1 else [1]


def _natural(name: str) -> tuple[int, str]:
    """node2 before node10."""
    digits = name.removeprefix("node")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def check_base_port(base_port: int, count: int) -> None:
    top = base_port + 2 * count - 1
    if base_port < 1024 or top > 65535:
        raise DevnetError(
            "args.base_port",
            f"--base-port {base_port}: {count} nodes use ports {base_port}-{top}, which must lie within 1024-65535",
            EXIT_USAGE,
        )


def port_free(port: int) -> bool:
    """Whether a listener could bind the port now (as the daemon binds: SO_REUSEADDR, so TIME_WAIT is no obstacle)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def check_ports(nodes: Iterable[NodeSpec]) -> None:
    """Refuse, before anything starts, a port another program holds, naming the node and the port."""
    for node in nodes:
        for what, port in (("RPC", node.rpc_port), ("p2p", node.p2p_port)):
            if not port_free(port):
                raise DevnetError(
                    "devnet.port_in_use",
                    f"{node.name}'s {what} port {HOST}:{port} is in use by another program (another devnet or "
                    f"node?); nothing was started. Choose other ports with --base-port (or ${BASE_PORT_ENV}), "
                    f"or stop what holds port {port}",
                    EXIT_USAGE,
                )


class Devnet:
    """The devnet in one directory, as its manifest describes it."""

    def __init__(self, path: Path, count: int, base_port: int, peer_ids: dict[str, str] | None = None) -> None:
        self.path = path
        self.base_port = base_port
        self.nodes = [NodeSpec(i, Home(path / f"node{i}"), *ports_of(i, base_port)) for i in range(1, count + 1)]
        self._peer_ids = dict(peer_ids or {})

    def peer_id(self, node: NodeSpec) -> str:
        if node.name not in self._peer_ids:
            self._peer_ids[node.name] = node.peer_id()
        return self._peer_ids[node.name]

    @property
    def network_file(self) -> Path:
        return self.path / NETWORK

    @classmethod
    def exists(cls, path: Path) -> bool:
        return (path / MANIFEST).is_file()

    @classmethod
    def load(cls, path: Path) -> Devnet:
        manifest = path / MANIFEST
        if not manifest.is_file():
            raise DevnetError(
                "devnet.missing",
                f"{path}: no devnet here (no {MANIFEST}); create one with `expledger devnet up`, or name its "
                f"directory with --dir or ${DIR_ENV}",
                EXIT_MISSING,
            )
        try:
            raw = json.loads(manifest.read_text())
            count, base_port, peer_ids = raw["nodes"], raw["base_port"], raw.get("peer_ids", {})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DevnetError("devnet.manifest", f"{manifest}: unreadable ({exc})", EXIT_USAGE) from None
        if type(count) is not int or type(base_port) is not int or not 1 <= count <= MAX_NODES:
            raise DevnetError("devnet.manifest", f"{manifest}: nodes or base_port is not a valid number", EXIT_USAGE)
        if not isinstance(peer_ids, dict) or not all(isinstance(value, str) for value in peer_ids.values()):
            raise DevnetError(
                "devnet.manifest", f"{manifest}: peer_ids is not a map of node names to peer ids", EXIT_USAGE
            )
        return cls(path, count, base_port, peer_ids)

    @classmethod
    def create(cls, path: Path, count: int, base_port: int, params: NetworkParams) -> Devnet:
        """Make the homes (one genesis, fixed ports, bootstrap wiring) and then the manifest, which marks a
        devnet as complete: a directory without it is never taken for one."""
        devnet = cls(path, count, base_port)
        if path.exists() and any(path.iterdir()):
            raise DevnetError(
                "devnet.dir",
                f"{path}: exists and is not empty, but holds no devnet ({MANIFEST}); choose another --dir",
                EXIT_USAGE,
            )
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        devnet.network_file.write_text(params.to_json())
        for node in devnet.nodes:
            node.home.init(params, node.rpc_listen, node.p2p_listen)
        peer_ids = {node.index: devnet.peer_id(node) for node in devnet.nodes}
        for node in devnet.nodes:
            config = load_config(node.home.config_file)
            bootstrap = tuple(
                f"{devnet.node_at(other).p2p_listen}/p2p/{peer_ids[other]}" for other in bootstrap_of(node.index)
            )
            config = dataclasses.replace(
                config,
                p2p=dataclasses.replace(config.p2p, bootstrap=bootstrap),
                log=LogConfig(level=config.log.level, format="text"),  # `devnet logs` is read by people
            )
            node.home.config_file.write_text(render_config(config))
        manifest = {"nodes": count, "base_port": base_port, "peer_ids": devnet._peer_ids}
        (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        return devnet

    def node_at(self, index: int) -> NodeSpec:
        return self.nodes[index - 1]

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise DevnetError(
            "devnet.node",
            f"no node {name!r} in the devnet at {self.path}; its nodes are {', '.join(n.name for n in self.nodes)}",
            EXIT_USAGE,
        )

    def select(self, names: Iterable[str]) -> list[NodeSpec]:
        """The named nodes, each once, in the devnet's order; every name checked before anything is done."""
        wanted = {self.node(name).index for name in names}
        return [node for node in self.nodes if node.index in wanted]

    def running(self) -> list[NodeSpec]:
        return [node for node in self.nodes if node.state() == "running"]

    # --- starting -------------------------------------------------------------------------------------

    def start(self, nodes: list[NodeSpec], say: Callable[[str], None]) -> None:
        """Start the daemons of `nodes` at once and return when each is ready (its RPC answers)."""
        check_ports(nodes)
        say(f"starting {len(nodes)} daemon(s): {', '.join(node.name for node in nodes)} (logs: expledger devnet logs)")
        launches = {
            node.name: subprocess.Popen(
                [sys.executable, "-m", "node.cli", "daemon", "--detach", "--home", str(node.home.path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for node in nodes
        }
        failures = []
        for name, launch in launches.items():
            out, err = launch.communicate()
            if launch.returncode == 0:
                say(f"  {name} ready: {out.strip().removeprefix('expledger daemon ready: ')}")
            else:
                failures.append(f"{name}: {(err.strip() or out.strip()).splitlines()[-1]}")
        if failures:
            raise DevnetError(
                "devnet.start",
                "could not start " + "; ".join(failures) + " (the nodes that started keep running; "
                "`expledger devnet logs NODE` shows why, `expledger devnet down` stops the rest)",
            )

    def wait_connected(self, nodes: list[NodeSpec], say: Callable[[str], None], timeout: float = WAIT_TIMEOUT) -> None:
        """Wait until each of `nodes` is connected to its running bootstrap node and to at least
        min(MIN_PEERS, other running nodes) peers (found by discovery), saying so node by node."""
        peer_ids = {node.index: self.peer_id(node) for node in self.nodes}
        names = {peer: f"node{index}" for index, peer in peer_ids.items()}
        started = time.monotonic()
        waiting = {node.index: "not answering yet" for node in nodes}
        next_progress = started + PROGRESS_EVERY
        while waiting:
            running = {node.index for node in self.nodes if node.state() == "running"}
            for index in list(waiting):
                node = self.node_at(index)
                try:
                    table = node.client(timeout=10).call("peers")
                except (DaemonUnavailable, RpcFailed) as exc:
                    waiting[index] = f"not answering ({exc.code})"
                    continue
                connected = {p["peer_id"] for p in table["peers"] if p["connected"]}
                wanted = min(MIN_PEERS, len(running - {index}))
                bootstrap = [n for n in bootstrap_of(index) if n in running and peer_ids[n] not in connected]
                if bootstrap or len(connected) < wanted:
                    waiting[index] = f"connected to {len(connected)} of {wanted} peers"
                    continue
                del waiting[index]
                shown = ", ".join(sorted((names.get(peer, peer) for peer in connected), key=_natural))
                say(f"  {node.name} connected: {shown or 'no running neighbour'}")
            elapsed = time.monotonic() - started
            if not waiting:
                break
            if elapsed > timeout:
                raise DevnetError(
                    "devnet.timeout",
                    f"after {timeout:.0f} s still waiting for "
                    + "; ".join(f"node{i} ({why})" for i, why in sorted(waiting.items()))
                    + " (`expledger devnet logs NODE` shows what it did)",
                )
            if time.monotonic() > next_progress:
                next_progress += PROGRESS_EVERY
                say(f"  … {elapsed:.0f} s: " + "; ".join(f"node{i} {why}" for i, why in sorted(waiting.items())))
            time.sleep(POLL)

    def wait_caught_up(self, node: NodeSpec, say: Callable[[str], None], timeout: float = WAIT_TIMEOUT) -> None:
        """Wait until `node` holds at least what every other running node held when the wait began, and has
        read the log of each peer it is connected to."""
        target = 0
        for other in self.running():
            if other is not node:
                try:
                    target = max(target, other.client().call("status")["log_size"])
                except (DaemonUnavailable, RpcFailed):
                    continue
        wait_caught_up(node.client(), node.name, say, target, timeout)

    # --- stopping -------------------------------------------------------------------------------------

    def stop(self, nodes: list[NodeSpec], say: Callable[[str], None], timeout: float = 120.0) -> None:
        """Ask each running daemon of `nodes` to stop (RPC `stop`, else SIGTERM to its pid), then wait for all."""
        pending = {}
        for node in nodes:
            pid = node.pid()
            if pid is None:
                say(f"  {node.name} was not running")
                continue
            try:
                node.client(timeout=10).call("stop")
            except (DaemonUnavailable, RpcFailed):  # a stale cookie or a hung server: the signal still works
                os.kill(pid, signal.SIGTERM)
            pending[node.name] = (node, pid)
        deadline = time.monotonic() + timeout
        while pending:
            for name, (node, pid) in list(pending.items()):
                if not process_alive(pid):
                    del pending[name]
                    node.home.pid_file.unlink(missing_ok=True)  # gone already after a clean stop
                    say(f"  {name} stopped")
            if pending and time.monotonic() > deadline:
                raise DevnetError(
                    "devnet.stop",
                    f"still running after {timeout:.0f} s: {', '.join(pending)} (pids "
                    f"{', '.join(str(pid) for _, pid in pending.values())})",
                )
            time.sleep(POLL / 2)

    def remove(self) -> None:
        """Delete the devnet's directory: only a devnet's (it has a manifest), and only with no daemon running."""
        running = self.running()
        if running:
            raise DevnetError(
                "devnet.running", f"not removing {self.path}: {', '.join(n.name for n in running)} still running"
            )
        if not (self.path / MANIFEST).is_file():
            raise DevnetError("devnet.missing", f"not removing {self.path}: it holds no {MANIFEST}", EXIT_MISSING)
        shutil.rmtree(self.path)

    # --- looking ----------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """One entry per node (what its RPC says, or why there is nothing to say) and whether the roots agree."""
        rows = [_node_status(node, self.peer_id(node)) for node in self.nodes]
        roots = {row["state_root"] for row in rows if row["state_root"]}
        answering = [row for row in rows if row["state_root"]]
        return {
            "dir": str(self.path),
            "nodes": rows,
            "answering": len(answering),
            "roots_agree": len(roots) == 1 and len(answering) == len(rows),
        }


def _node_status(node: NodeSpec, peer_id: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": node.name,
        "state": node.state(),
        "pid": node.pid(),
        "peer_id": peer_id,
        "rpc": f"http://{node.rpc_listen}/",
        "p2p": node.p2p_listen,
        "peers": None,
        "log_size": None,
        "pending": None,
        "state_root": None,
        "sync": None,
        "behind": None,
        "log_bytes": node.log_file.stat().st_size if node.log_file.exists() else 0,
        "error": None,
    }
    if row["state"] != "running":
        return row
    try:
        status = node.client(timeout=10).call("status")
    except (DaemonUnavailable, RpcFailed) as exc:
        row["state"] = "not answering"
        row["error"] = f"{exc.code}: {exc.message}"
        return row
    sync = (status.get("p2p") or {}).get("sync") or {}
    row.update(
        peers=sync.get("peers"),
        log_size=status["log_size"],
        pending=status["pending"],
        state_root=status["state_root"],
        sync=sync.get("state"),
        behind=sync.get("behind"),
    )
    return row


def wait_caught_up(
    client: Client, name: str, say: Callable[[str], None], target: int = 0, timeout: float = WAIT_TIMEOUT
) -> None:
    """Wait until the node holds `target` operations or more, has reconciled with every connected peer, and its
    own sync says "in sync" (nothing found missing is still missing); says its progress whenever it changes."""
    started, shown = time.monotonic(), ""
    while True:
        table = client.call("peers")
        log_size = client.call("status")["log_size"]
        sync = table["self"]["sync"]
        connected = [peer for peer in table["peers"] if peer["connected"]]
        unreconciled = [peer for peer in connected if not peer["sync"]["last"]]
        if connected and not unreconciled and sync["state"] == "in sync" and log_size >= target:
            say(f"  {name} in sync: log {log_size}, {len(connected)} peer(s) reconciled")
            return
        of = f" of {target}" if target else ""
        line = (
            f"  {name} catching up: log {log_size}{of}, {sync['behind']} missing,"
            f" {len(unreconciled)} peer(s) to reconcile"
        )
        if line != shown:
            say(line)
            shown = line
        if time.monotonic() - started > timeout:
            raise DevnetError("devnet.timeout", f"{name} did not catch up within {timeout:.0f} s ({line.strip()})")
        time.sleep(POLL)


def join(
    home: Home,
    bootstrap: list[str],
    params: NetworkParams | None,
    rpc_listen: str,
    p2p_listen: str,
) -> list[str]:
    """Make (or check) a home for `params` and set its bootstrap peers: `init`, then [p2p] bootstrap.

    Idempotent like `init`: run again, it keeps the home and its keys and only rewrites the bootstrap list.
    """
    checked = check_value("--bootstrap", "p2p", "bootstrap", list(bootstrap))
    report = home.init(params, rpc_listen, p2p_listen)
    config = home.config()
    if config.p2p.bootstrap != checked:
        updated = dataclasses.replace(config, p2p=dataclasses.replace(config.p2p, bootstrap=checked))
        home.config_file.write_text(render_config(updated))
        report.append(f"set [p2p] bootstrap in {home.config_file}: {', '.join(checked)}")
    else:
        report.append(f"found [p2p] bootstrap in {home.config_file}: {', '.join(checked)}")
    return report
