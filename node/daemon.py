"""`expledger daemon`: one process, one `trio.run`: the ledger's ingest task, the RPC server, signals.

Start-up refuses, with one line and exit status 2, a bad config, a second daemon on the same
home, a port in use, or a data directory that is damaged, foreign or of another network. Once
ready it prints `expledger daemon ready: rpc URL` and writes the URL to rpc.url and its token to
rpc.cookie (0600). The first SIGINT/SIGTERM (or the `stop` method) stops it gracefully: no new
requests, the requests and the ingest batch in flight finish, the index is saved, LevelDB closed,
the cookie removed; a second signal cancels what is left, and 5 s later the process exits hard.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import secrets
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ledger.errors import LedgerError
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.local_index import LocalRetrieval
from ledger.local_model import load_model
from ledger.store import write_file_atomically
from node import api, logs
from node.config import Config
from node.detach import EXIT_REFUSED
from node.events import EventHub
from node.home import Home, process_alive
from node.httpserver import HttpServer
from node.jsonrpc import Dispatcher
from node.local_embedding import LocalEmbedding
from node.metrics import NodeMetrics
from node.server import NodeRoutes, ServerState, is_authorized, presented_token
from node.service import Node
from node.usage import UsageStats

if TYPE_CHECKING:
    from p2p.service import P2PNode

log = logging.getLogger("expledger.daemon")

EXIT_FORCED = 1
EXIT_HARD = 3
EXIT_INTERRUPTED = 130
HARD_EXIT_AFTER = 5.0  # seconds after the second signal, for code that ignores cancellation
GRACEFUL_TIMEOUT = 10.0  # seconds requests in flight get to finish after the first signal
# seconds an idle keep-alive connection stays open (Bitcoin Core's rpcservertimeout). Above the 5 s after which
# clients such as httpx drop idle connections themselves: with equal timeouts the server closes a connection just
# as a client sends on it, and the call fails with "connection reset" (seen under load)
KEEP_ALIVE_TIMEOUT = 30.0
#: a client that stops reading is dropped by the kernel after this long with data unacknowledged
TCP_USER_TIMEOUT_MS = 30_000
LISTEN_BACKLOG = 128
PROXY_URL_FILE = "proxy.url"  # while the daemon runs with a proxy: its base URL (for OpenAI clients)
USAGE_DIR = "usage"  # the usage counts' LevelDB, in the home (node/usage.py)
#: file descriptors the daemon needs besides its RPC connections: LevelDB keeps up to 1000 table files open,
#: then block files, libp2p connections, logs
OTHER_DESCRIPTORS = 2048
MIN_RPC_CONNECTIONS = 64


class StartupError(Exception):
    """The daemon cannot start; the message is the one line the user sees."""


@dataclass(frozen=True)
class Startup:
    """What start-up opened: the daemon owns it until it exits."""

    config: Config
    ledger: Ledger
    author: AuthorKey
    sock: socket.socket
    peer_key: AuthorKey  # the libp2p identity's seed
    local: LocalRetrieval | None  # the node-local retrieval model and its index ([retrieval] model)
    rpc_connections: int  # [rpc] max_connections, or fewer when the open-files limit is short
    usage: UsageStats  # how often each experience was served (HOME/usage, apart from the ledger)
    proxy_sock: socket.socket | None = None  # the OpenAI-compatible proxy's listener ([proxy] listen)


@dataclass
class StopControl:
    """What the signal watcher (and the `stop` method) can do: drain (first) or cancel (second)."""

    drain: trio.Event = field(default_factory=trio.Event)
    ready: trio.Event = field(default_factory=trio.Event)
    node_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    forced: bool = False


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind here, before trio runs: a port in use is then a plain OSError, reported before anything starts."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # inherited by accepted sockets (Linux)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def rpc_connections(wanted: int) -> int:
    """How many RPC connections to serve at once: `wanted` ([rpc] max_connections), or fewer if the open-files limit
    cannot be raised for them. The soft limit is raised as far as the hard limit allows (Bitcoin Core and geth do
    the same at start): at a soft limit of 1024 a full RPC server would fail to accept, or LevelDB to open a table
    file; when even the hard limit is short, half of it goes to RPC and the log says so (as Bitcoin Core reduces
    -maxconnections)."""
    needed = wanted + OTHER_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # macOS refuses more than its kernel's per-process maximum
        target = soft
    if target >= needed:
        return wanted
    served = min(wanted, max(MIN_RPC_CONNECTIONS, target // 2))
    log.warning(
        "open files are limited to %d (ulimit -n): serving %d RPC connections at once, not [rpc] max_connections = %d",
        target,
        served,
        wanted,
    )
    return served


def _multiaddr_host_port(addr: str) -> tuple[str, int]:
    """(host, port) of a /ip4|ip6/HOST/tcp/PORT multiaddr (config.py checked its form)."""
    parts = addr.split("/")
    return parts[2], int(parts[4])


def _running_daemon(home: Home) -> int | None:
    """The pid of a live daemon on this home, from its pid file (a stale file, whose process is gone or a zombie,
    is ignored)."""
    try:
        pid = int(home.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and process_alive(pid) else None


def start(home: Home, log_level: str | None = None) -> Startup:
    """Everything that can refuse to start, in the order a user would want to hear about it."""
    config = home.config()
    params = home.network()
    logs.configure(log_level or config.log.level, config.log.format)
    pid = _running_daemon(home)
    if pid is not None:
        raise StartupError(f"a daemon is already running on {home.path} (pid {pid}); stop it first")
    connections = rpc_connections(config.rpc.max_connections)
    try:
        sock = bind_listener(config.rpc.host, config.rpc.port)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {config.rpc.listen} for RPC: {exc.strerror}; "
            f"is another node using it? Change [rpc] listen in {home.config_file}"
        ) from None
    proxy_sock = None
    if config.proxy.listen:
        try:
            proxy_sock = bind_listener(config.proxy.host, config.proxy.port)
        except OSError as exc:
            sock.close()
            raise StartupError(
                f"cannot listen on {config.proxy.listen} for the proxy: {exc.strerror}; "
                f"Change [proxy] listen in {home.config_file}"
            ) from None
    for addr in config.p2p.listen:
        host, port = _multiaddr_host_port(addr)
        try:
            bind_listener(host, port).close()  # a port in use is reported now, in one line, not deep in libp2p
        except OSError as exc:
            _close(sock, proxy_sock)
            raise StartupError(
                f"cannot listen on {addr} for p2p: {exc.strerror}; is another node using it? "
                f"Change [p2p] listen in {home.config_file}"
            ) from None
    try:
        author = home.author_key()
        peer_key = home.peer_key()
        model = load_model(config.retrieval.model)  # refused before the data is opened if it cannot be loaded
        ledger = Ledger.open(home.data_dir, params, min_free_bytes=config.store.min_free_mb << 20)
    except LedgerError as exc:
        _close(sock, proxy_sock)
        if exc.code == "store.open" and "lock" in exc.message.lower():
            raise StartupError(f"{home.data_dir} is in use by another process (a daemon or a tool)") from None
        raise
    local = LocalRetrieval(ledger, model) if model is not None else None
    try:
        usage = UsageStats(home.path / USAGE_DIR)
    except LedgerError:
        _close(sock, proxy_sock)
        ledger.close()
        raise
    return Startup(config, ledger, author, sock, peer_key, local, connections, usage, proxy_sock)


def _close(*socks: socket.socket | None) -> None:
    for sock in socks:
        if sock is not None:
            sock.close()


async def _watch_signals(control: StopControl, *, task_status: trio.TaskStatus[None]) -> None:
    """First SIGINT/SIGTERM: graceful stop. Second: cancel. Then a hard exit if something still hangs."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not control.ready.is_set():
                log.warning("%s during start-up: aborting", name)
                control.node_scope.cancel()
                return
            if not control.drain.is_set():
                log.warning("%s: stopping gracefully (send it again to force)", name)
                control.drain.set()
                continue
            log.warning("%s again: forcing the stop", name)
            control.forced = True
            control.node_scope.cancel()
            break
    # database calls in threads ignore cancellation: bound the wait
    await trio.sleep(HARD_EXIT_AFTER)
    log.error("still running %.0f s after a forced stop; exiting hard", HARD_EXIT_AFTER)
    os._exit(EXIT_HARD)


async def _serve(home: Home, startup: Startup, control: StopControl, *, task_status: trio.TaskStatus[str]) -> None:
    config, ledger = startup.config, startup.ledger
    metrics = NodeMetrics()
    hub = EventHub(metrics)
    node = Node(ledger, startup.author, config, metrics, hub, startup.local)
    embedding = LocalEmbedding(startup.local) if startup.local else None
    if embedding:
        node.committed.append(embedding.committed)
    network = _network(home, startup, node) if config.p2p.listen else None
    dispatcher = Dispatcher(max_batch=config.rpc.max_batch, observer=metrics)
    api.register(dispatcher, node, control.drain, network, startup.usage)
    token = secrets.token_hex(32)
    write_file_atomically(home.cookie_file, f"__cookie__:{token}".encode())
    view = ledger.view()
    state = ServerState(
        [token, *config.rpc.tokens],
        dispatcher,
        hub,
        metrics,
        health={"network_id": ledger.params.network_id, "node": ledger.node_key.did},
    )
    metrics.log_size.set(view.log_size)
    metrics.pending.set(ledger.pending_count())
    metrics.live_experiences.set(ledger.live_count())
    routes = NodeRoutes(state)
    server = HttpServer(
        routes.handle,
        routes.websocket,
        max_body=config.rpc.max_body_bytes,
        idle_timeout=KEEP_ALIVE_TIMEOUT,
        graceful_timeout=GRACEFUL_TIMEOUT,
        header_timeout=config.rpc.header_timeout,
        max_connections=startup.rpc_connections,
        holds_token=routes.holds_token,
        refused=lambda reason: metrics.http_rejected.labels(reason).inc(),
    )
    server_stopping = trio.Event()

    async def stop_serving() -> None:
        await control.drain.wait()
        if embedding:
            embedding.stop()
        state.stopping.set()
        hub.close()  # websocket subscribers get close code 1001 instead of waiting for the grace period
        server_stopping.set()

    network_stopped = trio.Event()

    async def run_network(*, task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            if network is None:
                task_status.started([])
                return
            await network.run(task_status=task_status)
        finally:
            network_stopped.set()

    async def stop_network() -> None:
        await control.drain.wait()
        if network is not None:
            network.stop.set()  # first: peers stop feeding the queue before it closes

    async def serve_then_close_queue(*, task_status: trio.TaskStatus[None]) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(startup.sock))
        await server.serve(listener, server_stopping, task_status=task_status)
        await network_stopped.wait()
        node.close_queue()  # every request has been answered: the ingest task drains what is queued, then ends

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run_ingest)
            nursery.start_soon(node.recover_writes, control.drain)
            if embedding:
                await nursery.start(embedding.run)
            nursery.start_soon(stop_network)
            p2p_addrs: list[str] = await nursery.start(run_network)
            if p2p_addrs:
                write_file_atomically(home.p2p_addrs_file, "".join(f"{addr}\n" for addr in p2p_addrs).encode())
                log.info("p2p: listening on %s", ", ".join(p2p_addrs))
            startup.sock.listen(LISTEN_BACKLOG)
            host, port = startup.sock.getsockname()[:2]
            nursery.start_soon(stop_serving)
            await nursery.start(serve_then_close_queue)
            if startup.proxy_sock is not None:
                proxy_url = await nursery.start(_serve_proxy, startup, node, state, server_stopping)
                write_file_atomically(home.path / PROXY_URL_FILE, (proxy_url + "\n").encode())
                log.info("proxy: OpenAI-compatible endpoint on %s", proxy_url)
            if config.llm.curate:
                from node.dso import curator  # the model's client loads only in a daemon that curates

                nursery.start_soon(curator.run_until, node, config.llm, control.drain)
            # start-up objects (modules, models, the network stack) live as long as the daemon: frozen, a full
            # garbage collection no longer walks them (~35 ms of each on a 100k ledger's heap; docs/ARCHITECTURE.md)
            gc.freeze()
            url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"  # the RPC endpoint is POST /
            write_file_atomically(home.url_file, (url + "\n").encode())
            task_status.started(url)
    finally:
        for path in (home.cookie_file, home.url_file, home.p2p_addrs_file, home.path / PROXY_URL_FILE):
            path.unlink(missing_ok=True)


async def _serve_proxy(
    startup: Startup, node: Node, state: ServerState, stopping: trio.Event, *, task_status: trio.TaskStatus[str]
) -> None:
    """The OpenAI-compatible proxy (node/proxy.py) until the node drains; started with its base URL."""
    import httpx  # loaded only by a daemon with a proxy

    from node.dso.llm import NO_KEY, LlmSettings
    from node.proxy import ProxyRoutes, Upstream

    config = startup.config.proxy
    llm = LlmSettings.resolve(startup.config.llm)
    upstream = Upstream(config.upstream or llm.base_url, None if llm.api_key == NO_KEY else llm.api_key, config.timeout)
    timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
    sock = startup.proxy_sock
    assert sock is not None
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client, trio.open_nursery() as nursery:
        routes = ProxyRoutes(state, node, startup.usage, upstream, client, config.k, config.budget)
        server = HttpServer(
            routes.handle,
            routes.websocket,
            max_body=config.max_body_bytes,
            idle_timeout=KEEP_ALIVE_TIMEOUT,
            graceful_timeout=GRACEFUL_TIMEOUT,
            header_timeout=startup.config.rpc.header_timeout,  # slow clients cannot starve agents either
            max_connections=startup.rpc_connections,
            holds_token=lambda authorization: is_authorized(presented_token(authorization.decode("latin-1")), state),
        )
        sock.listen(LISTEN_BACKLOG)
        host, port = sock.getsockname()[:2]
        await nursery.start(server.serve, trio.SocketListener(trio.socket.from_stdlib_socket(sock)), stopping)
        task_status.started(f"http://{f'[{host}]' if ':' in host else host}:{port}/v1")


def _network(home: Home, startup: Startup, node: Node) -> P2PNode:
    """The p2p layer, fed by and feeding the node's ingest queue. libp2p loads only here: a node on its own ([p2p]
    listen empty) starts without it (it is most of a daemon's start-up imports)."""
    from p2p.gossip import Allowance
    from p2p.host import key_pair
    from p2p.service import P2PNode, route_library_logs
    from p2p.sync import LogStates

    route_library_logs()
    network = P2PNode(
        key_pair(startup.peer_key.seed),
        startup.config.p2p.listen,
        startup.config.p2p.bootstrap,
        node,
        LogStates(home.p2p_dir),
        startup.config.p2p.gossip_batch,
        Allowance(startup.config.p2p.gossip_rate, startup.config.p2p.gossip_burst),
        startup.config.p2p.peers,
    )
    node.committed.append(network.committed)
    node.metrics.watch_network(lambda: (network.counter_values(), network.gauges()))
    return network


async def _main(home: Home, startup: Startup) -> int:
    control = StopControl()
    async with trio.open_nursery() as nursery:
        # opened before anything slow and outliving the node: no signal interrupts the clean-up
        await nursery.start(_watch_signals, control)
        with control.node_scope:
            async with trio.open_nursery() as node_nursery:
                url = await node_nursery.start(_serve, home, startup, control)
                control.ready.set()
                log.info("ready: RPC on %s (node %s)", url, startup.ledger.node_key.did)
                print(f"expledger daemon ready: rpc {url}", flush=True)
        nursery.cancel_scope.cancel()
    return EXIT_FORCED if control.forced else 0


def run(home: Home, log_level: str | None = None) -> int:
    """Run the daemon in the foreground until it is stopped; returns the exit status."""
    try:
        startup = start(home, log_level)
    except StartupError as exc:
        print(f"expledger: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except LedgerError as exc:  # a bad config or parameter file, a damaged or foreign data directory, a key
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    write_file_atomically(home.pid_file, f"{os.getpid()}\n".encode())
    # outside trio's signal receiver SIGTERM now raises KeyboardInterrupt like SIGINT: clean-up still runs
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    status = EXIT_INTERRUPTED
    try:
        status = trio.run(_main, home, startup)
    except* KeyboardInterrupt:  # raised inside a nursery it arrives wrapped in a BaseExceptionGroup
        log.warning("interrupted before the signal handler was ready")
    finally:
        _close(startup.sock, startup.proxy_sock)  # a no-op once the servers' listeners closed them
        if startup.local:
            startup.local.close()
        startup.usage.close()
        startup.ledger.close()  # saves the vector index, closes LevelDB
        home.pid_file.unlink(missing_ok=True)
        log.info("stopped")
    return status
