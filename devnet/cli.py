"""`expledger devnet …`: the command line of the local devnet (`devnet.command` hands its arguments here).

Errors are one line, `expledger: error: <code>: <message>`, like every other command. Exit status: 0
success, 1 the devnet is not in a state that allows the command (already running, a node that did not
start, no convergence in time), 2 bad arguments or unusable input (an unknown node, a port in use, a
directory that is not a devnet), 3 no devnet in the directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from devnet.network import (
    BASE_PORT_ENV,
    DEFAULT_NODES,
    DIR_ENV,
    EXIT_STATE,
    EXIT_USAGE,
    MAX_NODES,
    Devnet,
    DevnetError,
    NodeSpec,
    check_base_port,
    check_ports,
    default_base_port,
    default_dir,
    join,
    wait_caught_up,
)
from ledger.errors import LedgerError
from ledger.params import NetworkParams
from node.client import Client
from node.config import HOME_ENV, default_home
from node.home import Home

FOLLOW_POLL = 0.25  # seconds between reads of the logs `logs -f` follows


class _Parser(argparse.ArgumentParser):
    """Usage errors reported like every other error: one line with a code, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise DevnetError("args.invalid", message, EXIT_USAGE)


def say(line: str) -> None:
    print(line, flush=True)


def _node_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: give a number of nodes from 1 to {MAX_NODES}")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or not 1024 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}: give a port from 1024 to 65535")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="expledger devnet",
        description="A local devnet: several nodes on 127.0.0.1, each an ordinary home under one directory.",
    )
    commands = parser.add_subparsers(dest="devnet_command", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--dir", type=Path, default=None, help=f"the devnet's directory (default: ${DIR_ENV} or ~/.expledger-devnet)"
    )

    def layout(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--nodes", type=_node_count, help=f"how many nodes (default {DEFAULT_NODES}; a new devnet only)"
        )
        command.add_argument(
            "--base-port",
            type=_port,
            help=f"node i listens for RPC on BASE+2(i-1) and p2p on the next port (default: ${BASE_PORT_ENV} or 8700)",
        )
        command.add_argument("--network", type=Path, metavar="FILE", help="network parameters (default: built-in)")

    up = commands.add_parser(
        "up", parents=[where], help="create the nodes if need be, start them, wait until all are connected"
    )
    layout(up)
    up.add_argument("--demo", action="store_true", help="then run the demo (see `devnet demo`)")
    status = commands.add_parser("status", parents=[where], help="one row per node, then whether all roots agree")
    status.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    logs = commands.add_parser("logs", parents=[where], help="the daemons' logs (all nodes, or the ones named)")
    logs.add_argument("nodes", nargs="*", metavar="NODE")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what they log (Ctrl-C ends)")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines of each log")
    stop = commands.add_parser("stop", parents=[where], help="stop nodes gracefully (the others go on)")
    stop.add_argument("nodes", nargs="+", metavar="NODE")
    start = commands.add_parser("start", parents=[where], help="start stopped nodes; return once they caught up")
    start.add_argument("nodes", nargs="+", metavar="NODE")
    down = commands.add_parser("down", parents=[where], help="stop every node gracefully")
    down.add_argument("--clean", action="store_true", help="then delete the devnet's directory and all its data")
    demo_command = commands.add_parser(
        "demo", parents=[where], help="bring the devnet up if need be, load the seed library, show convergence"
    )
    layout(demo_command)
    joining = commands.add_parser(
        "join",
        parents=[where],
        help="make a node in another home join a running devnet (or any network, with --bootstrap)",
    )
    joining.add_argument(
        "--home", type=Path, default=default_home(), help=f"the node's home (default: ${HOME_ENV} or ~/.expledger)"
    )
    joining.add_argument(
        "--bootstrap",
        action="append",
        metavar="MULTIADDR",
        help="a peer to dial, /ip4/…/tcp/…/p2p/PEERID; repeatable (default: every running node of the devnet)",
    )
    joining.add_argument(
        "--network", type=Path, metavar="FILE", help="network parameters (default: the devnet's network.json)"
    )
    joining.add_argument("--rpc", default="127.0.0.1:0", metavar="HOST:PORT", help="RPC address (default: a free port)")
    joining.add_argument(
        "--p2p", default="/ip4/127.0.0.1/tcp/0", metavar="MULTIADDR", help="libp2p address (default: a free port)"
    )
    joining.add_argument(
        "--no-start", action="store_true", help="only make the home and its config (to run the daemon yourself)"
    )
    return parser


def _bring_up(args: argparse.Namespace, path: Path, refuse_running: bool) -> Devnet:
    """Create the devnet if there is none, start its nodes that are not running, wait until all are connected."""
    started = time.monotonic()
    if Devnet.exists(path):
        devnet = Devnet.load(path)
        if args.nodes is not None and args.nodes != len(devnet.nodes):
            raise DevnetError(
                "devnet.nodes",
                f"{path} holds a devnet of {len(devnet.nodes)} nodes, not {args.nodes}; "
                "`expledger devnet down --clean` removes it, or choose another --dir",
                EXIT_USAGE,
            )
        if args.base_port is not None and args.base_port != devnet.base_port:
            raise DevnetError(
                "devnet.ports",
                f"{path} holds a devnet on base port {devnet.base_port}, not {args.base_port}",
                EXIT_USAGE,
            )
        idle = [node for node in devnet.nodes if node.state() != "running"]
        if not idle:
            if refuse_running:
                raise DevnetError(
                    "devnet.running",
                    f"the devnet in {path} is already running ({len(devnet.nodes)} nodes); nothing was started. "
                    "`expledger devnet status` shows it, `expledger devnet down` stops it",
                )
            say(f"the devnet in {path} is running ({len(devnet.nodes)} nodes)")
            return devnet
        running = len(devnet.nodes) - len(idle)
        say(f"the devnet in {path}: {running} of {len(devnet.nodes)} nodes running")
    else:
        count = args.nodes or DEFAULT_NODES
        base_port = args.base_port or default_base_port()
        check_base_port(base_port, count)
        params = NetworkParams.from_file(args.network) if args.network else NetworkParams()
        check_ports(Devnet(path, count, base_port).nodes)  # before anything is written
        devnet = Devnet.create(path, count, base_port, params)
        say(
            f"created {count} node homes in {path} (network {params.network_id!r}, "
            f"ports {base_port}-{base_port + 2 * count - 1} on 127.0.0.1)"
        )
        idle = devnet.nodes
    devnet.start(idle, say)
    say("waiting until every node is connected to its neighbours")
    devnet.wait_connected(idle, say)
    say(f"devnet up: {len(devnet.nodes)} nodes connected and healthy ({time.monotonic() - started:.0f} s)")
    return devnet


def cmd_up(args: argparse.Namespace, path: Path) -> int:
    devnet = _bring_up(args, path, refuse_running=True)
    if args.demo:
        return _demo(devnet)
    say("`expledger devnet status` shows the nodes; `expledger devnet down` stops them")
    return 0


def cmd_demo(args: argparse.Namespace, path: Path) -> int:
    return _demo(_bring_up(args, path, refuse_running=False))


def _demo(devnet: Devnet) -> int:
    from devnet import demo  # operations and the embedder (numpy) load only for the demo

    demo.run(devnet, say)
    say(f"\n== {demo.STEPS + 1}. the devnet's nodes now (`devnet status`)")
    print_status(devnet.status())
    command, home = _expledger(), devnet.nodes[0].home.path
    say(
        f"\nthe devnet keeps running in {devnet.path}. Next: `{command} devnet status`, "
        f"`{command} devnet logs node1`, `{command} devnet down --clean` (stops it and deletes its data)"
    )
    say(
        f'query a node by its home: `{command} retrieve --home {home} "your question"`, or '
        f"`export {HOME_ENV}={home}` and then `{command} list`, `{command} get ID`"
    )
    return 0


def _expledger() -> str:
    """How the user can call this very CLI: `expledger` when PATH finds it, else its path (scripts/demo.sh
    runs .venv's without activating it)."""
    beside = Path(sys.executable).parent / "expledger"
    found = shutil.which("expledger")
    if found and Path(found).resolve() == beside.resolve():
        return "expledger"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def _short(text: str | None, head: int, tail: int = 0) -> str:
    if not text:
        return "-"
    return text if len(text) <= head + tail + 1 else text[:head] + "…" + (text[-tail:] if tail else "")


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB"):
        if count < 1024:
            return f"{count}{unit}"
        count //= 1024
    return f"{count}GB"


def print_status(status: dict[str, Any]) -> None:
    header = ["NODE", "STATE", "PID", "PEER ID", "RPC", "PEERS", "LOG", "PENDING", "STATE ROOT", "SYNC", "LOG FILE"]

    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    rows = [
        [
            row["name"],
            row["state"],
            cell(row["pid"]),
            _short(row["peer_id"], 12, 6),
            row["rpc"],
            cell(row["peers"]),
            cell(row["log_size"]),
            cell(row["pending"]),
            _short(row["state_root"], 12),
            row["sync"] or "-",
            _size(row["log_bytes"]),
        ]
        for row in status["nodes"]
    ]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        say("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())
    for row in status["nodes"]:
        if row["error"]:
            say(f"{row['name']}: {row['error']}")
    say(roots_line(status))


def roots_line(status: dict[str, Any]) -> str:
    """The verdict: do all nodes hold the same operations (PROTOCOL §9: equal roots exactly then)?"""
    nodes = status["nodes"]
    silent = [row["name"] for row in nodes if not row["state_root"]]
    groups: dict[str, list[str]] = {}
    for row in nodes:
        if row["state_root"]:
            groups.setdefault(row["state_root"], []).append(row["name"])
    if status["roots_agree"]:
        return f"state roots: all {len(nodes)} nodes agree ({nodes[0]['state_root'][:12]})"
    if not groups:
        return "state roots: no node is answering"
    described = "; ".join(f"{', '.join(names)}: {root[:12]}" for root, names in groups.items())
    verdict = "agree" if len(groups) == 1 else "differ"
    unknown = f" ({', '.join(silent)}: not answering)" if silent else ""
    return f"state roots: the answering nodes {verdict} — {described}{unknown}"


def cmd_status(args: argparse.Namespace, path: Path) -> int:
    status = Devnet.load(path).status()
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print_status(status)
    return 0


def cmd_logs(args: argparse.Namespace, path: Path) -> int:
    devnet = Devnet.load(path)
    nodes = devnet.select(args.nodes) if args.nodes else devnet.nodes
    with contextlib.suppress(KeyboardInterrupt):  # how `logs -f` ends; also a reader who stops a long listing
        _print_logs(nodes, args.tail, args.follow)
    return 0


def _print_logs(nodes: list[NodeSpec], tail: int | None, follow: bool) -> None:
    prefix = len(nodes) > 1
    width = max(len(node.name) for node in nodes)
    positions = {}
    for node in nodes:
        data = node.log_file.read_bytes() if node.log_file.exists() else b""
        lines = data.decode(errors="replace").splitlines()
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        for line in lines:
            say(f"{node.name.ljust(width)} | {line}" if prefix else line)
        positions[node.name] = len(data)
    partial = dict.fromkeys(positions, b"")
    while follow:
        for node in nodes:
            if not node.log_file.exists():
                continue
            with open(node.log_file, "rb") as handle:
                handle.seek(positions[node.name])
                data = handle.read()
            positions[node.name] += len(data)
            *complete, partial[node.name] = (partial[node.name] + data).split(b"\n")
            for line in complete:
                text = line.decode(errors="replace")
                say(f"{node.name.ljust(width)} | {text}" if prefix else text)
        time.sleep(FOLLOW_POLL)


def cmd_stop(args: argparse.Namespace, path: Path) -> int:
    devnet = Devnet.load(path)
    devnet.stop(devnet.select(args.nodes), say)
    return 0


def cmd_start(args: argparse.Namespace, path: Path) -> int:
    devnet = Devnet.load(path)
    nodes = devnet.select(args.nodes)
    running = [node.name for node in nodes if node.state() == "running"]
    if running:
        raise DevnetError("devnet.running", f"already running: {', '.join(running)}; nothing was started")
    devnet.start(nodes, say)
    devnet.wait_connected(nodes, say)
    for node in nodes:
        if len(devnet.running()) > 1:
            devnet.wait_caught_up(node, say)
    return 0


def cmd_down(args: argparse.Namespace, path: Path) -> int:
    devnet = Devnet.load(path)
    devnet.stop(devnet.nodes, say)
    if args.clean:
        devnet.remove()
        say(f"removed {path}")
    return 0


def cmd_join(args: argparse.Namespace, path: Path) -> int:
    params = NetworkParams.from_file(args.network) if args.network else None
    bootstrap = args.bootstrap
    if bootstrap is None:  # the devnet's: its running nodes, and its genesis unless --network says otherwise
        devnet = Devnet.load(path)
        running = devnet.running()
        if not running:
            raise DevnetError("devnet.stopped", f"no node of the devnet in {path} is running; give --bootstrap")
        bootstrap = [f"{node.p2p_listen}/p2p/{devnet.peer_id(node)}" for node in running]
        params = params or NetworkParams.from_file(devnet.network_file)
    home = Home(args.home)
    for line in join(home, bootstrap, params, args.rpc, args.p2p):
        say(line)
    if args.no_start:
        say(f"start it with: expledger daemon --home {home.path}")
        return 0
    launch = subprocess.run(
        [sys.executable, "-m", "node.cli", "daemon", "--detach", "--home", str(home.path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if launch.returncode != 0:
        raise DevnetError("devnet.start", f"{home.path}: {(launch.stderr or launch.stdout).strip()}")
    say(launch.stdout.strip())
    wait_caught_up(Client(home), str(home.path), say)
    say(f"joined: `expledger status --home {home.path}`; `expledger stop --home {home.path}` stops it")
    return 0


COMMANDS = {
    "up": cmd_up,
    "status": cmd_status,
    "logs": cmd_logs,
    "stop": cmd_stop,
    "start": cmd_start,
    "down": cmd_down,
    "demo": cmd_demo,
    "join": cmd_join,
}


def main(argv: Sequence[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        path = (args.dir or default_dir()).expanduser().absolute()
        return COMMANDS[args.devnet_command](args, path)
    except DevnetError as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return exc.exit_status
    except LedgerError as exc:  # a bad parameter file, config or key: unusable input
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("expledger: interrupted; the nodes started so far keep running", file=sys.stderr)
        return EXIT_STATE
