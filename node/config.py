"""A node's home directory and its config.toml: what `expledger init` creates and the daemon reads.

Layout (like Kubo's repo or Bitcoin Core's datadir):

    config.toml     listen addresses, bootstrap peers, RPC, logs, ingest limits, the free-space reserve
    network.json    the genesis: the network's parameters (ledger.params), shared by every node
    author.key      signs the operations this node makes for its RPC clients (0600)
    p2p.key         the libp2p identity: the peer id others dial (0600)
    p2p/            what this node has read of other nodes' logs, and evidence of forks
    data/           the ledger: LevelDB, node key, high-water mark, vector index
    usage/          how often this node served each experience (LevelDB, outside the ledger and its state root)
    rpc.cookie      while the daemon runs: the token every RPC request carries (0600)
    rpc.url         while the daemon runs: where its RPC server listens
    p2p.addrs       while the daemon runs: its full libp2p multiaddrs, one per line
    daemon.pid      while the daemon runs

Every problem with the config names the file, the key and what was expected.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.errors import LedgerError
from ledger.local_model import DEFAULT_MODEL, MODELS, NETWORK

HOME_ENV = "EXPLEDGER_HOME"
CONFIG_FILE = "config.toml"
NETWORK_FILE = "network.json"
AUTHOR_KEY = "author.key"
PEER_KEY = "p2p.key"
P2P_DIR = "p2p"
P2P_ADDRS_FILE = "p2p.addrs"
DATA_DIR = "data"
COOKIE_FILE = "rpc.cookie"
URL_FILE = "rpc.url"
PID_FILE = "daemon.pid"
DEFAULT_RPC_PORT = 8645
DEFAULT_P2P_PORT = 4645
_MAX_CONFIG_BYTES = 256 * 1024
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "text", "json")
LLM_RESPONSE_FORMATS = ("auto", "json_schema", "json_object", "none")


class ConfigError(LedgerError):
    """A config file that cannot be read or holds a bad value; the message names the file and the key."""


def default_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".expledger")


class _HttpListener:
    """A `host:port` listen address (RPC and proxy), split for the HTTP server that binds it."""

    __slots__ = ()
    listen: str

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


@dataclass(frozen=True, slots=True)
class RpcConfig(_HttpListener):
    #: host:port; port 0 takes a free port (the daemon writes the address it got into rpc.url)
    listen: str = f"127.0.0.1:{DEFAULT_RPC_PORT}"
    #: extra static tokens accepted beside the cookie (for clients that cannot read the home)
    tokens: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    max_batch: int = 100
    #: connections open at once; when full, a new one evicts the oldest that has shown no token (503 if none)
    max_connections: int = 1024
    #: seconds a request's head may take to arrive whole (a connection's first: from its accept)
    header_timeout: int = 5


@dataclass(frozen=True, slots=True)
class P2PConfig:
    #: TCP multiaddrs to listen on; empty: no network (a node on its own)
    listen: tuple[str, ...] = (f"/ip4/127.0.0.1/tcp/{DEFAULT_P2P_PORT}",)
    #: peers (multiaddrs ending in /p2p/PEERID) dialled at start and redialled while the node has fewer than `peers`
    bootstrap: tuple[str, ...] = ()
    #: connections peer discovery keeps: it dials peers its peers name up to this many and closes the newest beyond
    #: three times as many; 0: no discovery (only the bootstrap peers, always redialled, and `peers.connect`)
    peers: int = 8
    #: operations per gossip message at most (1: each alone, which costs every node far more CPU)
    gossip_batch: int = 1000
    #: new operations per second one publisher (origin) may have this node take and forward by gossip; past it
    #: its messages are dropped unpenalised and sync brings the operations (valid operations are the cheapest
    #: flood: every node stores and forwards them)
    gossip_rate: int = 50
    #: and at once
    gossip_burst: int = 1000


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "info"
    #: "auto": readable text on a terminal, JSON lines otherwise
    format: str = "auto"


@dataclass(frozen=True, slots=True)
class IngestConfig:
    #: submissions waiting for the writer; when full, new ones are refused (RPC) or dropped and counted
    queue: int = 10_000
    #: the most operations one synced write takes
    batch: int = 1000


@dataclass(frozen=True, slots=True)
class StoreConfig:
    #: writes that would leave less free space (MiB) on the data directory's file system are refused
    #: (`store.unwritable`) before LevelDB meets a full disk, like geth's --datadir.minfreedisk: a memtable flush
    #: and a compaction need a few hundred MB while they run; small disks (tests, devnets) set it lower
    min_free_mb: int = 512


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    #: the model that ranks experiences for a query: a node-local model (its vectors are computed in the
    #: background; until then the network's embedding ranks), or "network" for the network's embedding only
    model: str = DEFAULT_MODEL


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """An OpenAI-compatible chat endpoint for `expledger dso` and the curator; EXPLEDGER_LLM_* variables override it."""

    base_url: str = "http://127.0.0.1:8080/v1"
    #: "" asks the server for its models and takes the first (llama.cpp, vLLM and Ollama serve one by default)
    model: str = ""
    #: prefer the EXPLEDGER_LLM_API_KEY variable: config.toml is not a place for secrets
    api_key: str = ""
    timeout: int = 120  # seconds per request
    max_retries: int = 4  # after a time-out, a connection error, a 429 or a 5xx, with exponential backoff
    #: "auto" tries a JSON schema, then a JSON object, then plain text (tolerant parsing) as the server allows
    response_format: str = "auto"
    #: the daemon curates: resolves conflicted experiences and merges paraphrases, signed by its author key
    curate: bool = False
    curate_interval: int = 60  # seconds between curation passes
    curate_similarity: float = 0.9  # live experiences at least this similar (cosine) are candidates for a merge
    curate_calls_per_minute: int = 10  # LLM calls the curator makes at most


@dataclass(frozen=True, slots=True)
class ProxyConfig(_HttpListener):
    """The OpenAI-compatible proxy that injects experiences into an agent's LLM calls (node/proxy.py)."""

    #: host:port on which to serve /v1/chat/completions and /v1/models; "" (the default): no proxy
    listen: str = ""
    #: the OpenAI-compatible server to forward to; "": [llm] base_url (or EXPLEDGER_LLM_BASE_URL)
    upstream: str = ""
    k: int = 5  # experiences injected at most
    budget: int = 2048  # tokens the injected prompt may use (the retrieval seed's max context length)
    timeout: int = 300  # seconds to wait for the upstream's answer, or for its next bytes when streaming
    max_body_bytes: int = 8 << 20


@dataclass(frozen=True, slots=True)
class Config:
    rpc: RpcConfig = RpcConfig()
    p2p: P2PConfig = P2PConfig()
    log: LogConfig = LogConfig()
    ingest: IngestConfig = IngestConfig()
    store: StoreConfig = StoreConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    llm: LlmConfig = LlmConfig()
    proxy: ProxyConfig = ProxyConfig()


#: per section, each key with its expected type and a check of its value (None: any value of the type)
_SCHEMA: dict[str, dict[str, tuple[type, str]]] = {
    "rpc": {
        "listen": (str, "host:port, the host an IP address"),
        "tokens": (list, "a list of strings of 16 to 256 characters"),
        "max_body_bytes": (int, "an integer from 1024 to 67108864"),
        "max_batch": (int, "an integer from 1 to 10000"),
        "max_connections": (int, "an integer from 2 to 100000"),
        "header_timeout": (int, "seconds, an integer from 1 to 300"),
    },
    "p2p": {
        "listen": (list, "a list of TCP multiaddrs such as /ip4/127.0.0.1/tcp/4645"),
        "bootstrap": (list, "a list of multiaddrs ending in /p2p/PEERID"),
        "peers": (int, "an integer from 0 to 100"),
        "gossip_batch": (int, "an integer from 1 to 1000"),
        "gossip_rate": (int, "an integer from 1 to 1000000"),
        "gossip_burst": (int, "an integer from 1 to 1000000"),
    },
    "log": {"level": (str, " or ".join(LOG_LEVELS)), "format": (str, " or ".join(LOG_FORMATS))},
    "ingest": {"queue": (int, "an integer from 1 to 1000000"), "batch": (int, "an integer from 1 to 100000")},
    "store": {"min_free_mb": (int, "MiB, an integer from 0 to 1073741824")},
    "retrieval": {"model": (str, " or ".join(f'"{name}"' for name in (*MODELS, NETWORK)))},
    "llm": {
        "base_url": (str, "an http:// or https:// URL"),
        "model": (str, "a model name of at most 200 characters"),
        "api_key": (str, "a key of at most 500 printable characters"),
        "timeout": (int, "seconds, an integer from 1 to 3600"),
        "max_retries": (int, "an integer from 0 to 20"),
        "response_format": (str, " or ".join(LLM_RESPONSE_FORMATS)),
        "curate": (bool, "true or false"),
        "curate_interval": (int, "seconds, an integer from 1 to 86400"),
        "curate_similarity": (float, "a cosine from 0.5 to 1.0"),
        "curate_calls_per_minute": (int, "an integer from 1 to 10000"),
    },
    "proxy": {
        "listen": (str, 'host:port, the host an IP address, or "" for no proxy'),
        "upstream": (str, 'an http:// or https:// URL, or "" for [llm] base_url'),
        "k": (int, "an integer from 1 to 100"),
        "budget": (int, "tokens, an integer from 16 to 1048576"),
        "timeout": (int, "seconds, an integer from 1 to 3600"),
        "max_body_bytes": (int, "an integer from 1024 to 67108864"),
    },
}
_SECTIONS = {
    "rpc": RpcConfig,
    "p2p": P2PConfig,
    "log": LogConfig,
    "ingest": IngestConfig,
    "store": StoreConfig,
    "retrieval": RetrievalConfig,
    "llm": LlmConfig,
    "proxy": ProxyConfig,
}


def load_config(path: Path) -> Config:
    """Read and check a config.toml; missing keys take their defaults, unknown ones are refused."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError("config.file", f"{path}: cannot read the config ({exc.strerror})") from None
    if len(data) > _MAX_CONFIG_BYTES:
        raise ConfigError("config.file", f"{path}: larger than {_MAX_CONFIG_BYTES} bytes; not a config file")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("config.syntax", f"{path}: not valid TOML ({exc})") from None
    sections = {}
    for name, table in raw.items():
        if name not in _SCHEMA:
            raise ConfigError("config.unknown", f"{path}: unknown section [{name}] (known: {', '.join(_SCHEMA)})")
        if not isinstance(table, dict):
            raise ConfigError("config.type", f"{path}: {name}: expected a [{name}] section")
        sections[name] = _SECTIONS[name](
            **{key: check_value(f"{path}: [{name}] {key}", name, key, value) for key, value in table.items()}
        )
    return Config(**sections)


def check_value(where: str, section: str, key: str, value: Any) -> Any:
    """`value` for `key` of `section`, checked; `where` names it in the error (the file and key, or a flag)."""
    if key not in _SCHEMA[section]:
        raise ConfigError("config.unknown", f"{where}: unknown key (known: {', '.join(_SCHEMA[section])})")
    kind, expected = _SCHEMA[section][key]
    if type(value) is not kind:
        raise ConfigError("config.type", f"{where}: expected {expected}, got {type(value).__name__} {value!r}")
    if kind is list:
        if not all(isinstance(item, str) for item in value):
            raise ConfigError("config.type", f"{where}: expected {expected}")
        value = tuple(value)
    if not _acceptable(section, key, value):
        raise ConfigError("config.value", f"{where}: expected {expected}, got {value!r}")
    return value


def _acceptable(section: str, key: str, value: Any) -> bool:
    match section, key:
        case "rpc", "listen":
            return _host_port(value)
        case "rpc", "tokens":
            return all(16 <= len(token) <= 256 and token.isprintable() and " " not in token for token in value)
        case "rpc", "max_body_bytes":
            return 1024 <= value <= 64 << 20
        case "rpc", "max_batch":
            return 1 <= value <= 10_000
        case "rpc", "max_connections":
            return 2 <= value <= 100_000
        case "rpc", "header_timeout":
            return 1 <= value <= 300
        case "p2p", "listen":
            return all(_tcp_multiaddr(item) for item in value)
        case "p2p", "bootstrap":
            return all(_tcp_multiaddr(item, peer=True) for item in value)
        case "p2p", "peers":
            return 0 <= value <= 100
        case "p2p", "gossip_batch":
            return 1 <= value <= 1000
        case "p2p", "gossip_rate" | "gossip_burst":
            return 1 <= value <= 1_000_000
        case "log", "level":
            return value in LOG_LEVELS
        case "log", "format":
            return value in LOG_FORMATS
        case "ingest", "queue":
            return 1 <= value <= 1_000_000
        case "ingest", "batch":
            return 1 <= value <= 100_000
        case "store", "min_free_mb":
            return 0 <= value <= 1 << 30
        case "retrieval", "model":
            return value == NETWORK or value in MODELS
        case "llm", "base_url":
            return re.fullmatch(r"https?://[^\s]+", value) is not None and len(value) <= 500
        case "llm", "model":
            return len(value) <= 200 and value.isprintable()
        case "llm", "api_key":
            return len(value) <= 500 and value.isprintable()
        case "llm", "timeout":
            return 1 <= value <= 3600
        case "llm", "max_retries":
            return 0 <= value <= 20
        case "llm", "response_format":
            return value in LLM_RESPONSE_FORMATS
        case "llm", "curate":
            return True
        case "llm", "curate_interval":
            return 1 <= value <= 86_400
        case "llm", "curate_similarity":
            return 0.5 <= value <= 1.0
        case "llm", "curate_calls_per_minute":
            return 1 <= value <= 10_000
        case "proxy", "listen":
            return value == "" or _host_port(value)
        case "proxy", "upstream":
            return value == "" or _acceptable("llm", "base_url", value)
        case "proxy", "k":
            return 1 <= value <= 100
        case "proxy", "budget":
            return 16 <= value <= 1 << 20
        case "proxy", "timeout":
            return 1 <= value <= 3600
        case "proxy", "max_body_bytes":
            return 1024 <= value <= 64 << 20
    return False


_TCP_MULTIADDR = re.compile(r"/(ip4|ip6)/([^/]+)/tcp/(\d{1,5})(/p2p/([1-9A-HJ-NP-Za-km-z]{40,60}))?")


def _tcp_multiaddr(text: str, peer: bool = False) -> bool:
    """/ip4|ip6/ADDRESS/tcp/PORT, with /p2p/PEERID exactly when `peer` (checked without importing libp2p)."""
    match = _TCP_MULTIADDR.fullmatch(text)
    if match is None or bool(match.group(4)) != peer or int(match.group(3)) > 65535:
        return False
    try:
        address = ipaddress.ip_address(match.group(2))
    except ValueError:
        return False
    return address.version == (4 if match.group(1) == "ip4" else 6)


def _host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def render_config(config: Config) -> str:
    """config.toml with every key and a comment on each: what `init` writes."""
    rpc, p2p, log, ingest = config.rpc, config.p2p, config.log, config.ingest

    def strings(values: tuple[str, ...]) -> str:
        return "[" + ", ".join(f'"{value}"' for value in values) + "]"

    return f"""# Experience Ledger node configuration (written by `expledger init`).
# The network's own rules (text limits, embedding model, thresholds) are in network.json.

[rpc]
# JSON-RPC over HTTP. Keep it on 127.0.0.1: every request needs the token of rpc.cookie
# (rewritten at each start) or one of `tokens`. Port 0 takes a free port, written to rpc.url.
listen = "{rpc.listen}"
tokens = {strings(rpc.tokens)}
max_body_bytes = {rpc.max_body_bytes}
max_batch = {rpc.max_batch}
max_connections = {rpc.max_connections}  # when full, a new one evicts the oldest that has shown no token
header_timeout = {rpc.header_timeout}      # seconds a request's headers may take to arrive

[p2p]
# libp2p (Noise-encrypted TCP). `expledger id` prints the addresses to give to other nodes;
# bootstrap peers are dialled at start and redialled while the node has fewer than `peers`; discovery
# finds the others (peers = 0: none, only the bootstrap peers). listen = [] runs the node on its own.
listen = {strings(p2p.listen)}
bootstrap = {strings(p2p.bootstrap)}
peers = {p2p.peers}  # connections discovery keeps (it closes the newest beyond three times as many)
gossip_batch = {p2p.gossip_batch}  # operations per gossip message, at most
gossip_rate = {p2p.gossip_rate}     # new operations/s one publisher may have this node take by gossip (then sync)
gossip_burst = {p2p.gossip_burst}  # and at once

[log]
level = "{log.level}"    # {", ".join(LOG_LEVELS)}
format = "{log.format}"  # auto: text on a terminal, JSON lines otherwise

[ingest]
queue = {ingest.queue}   # submissions waiting for the writer; more are refused
batch = {ingest.batch}   # operations per synced write, at most

[store]
# writes that would leave less free space (MiB) on the data directory's disk are refused until space is
# freed (reads go on), before the database ever meets a full disk
min_free_mb = {config.store.min_free_mb}

[retrieval]
# the model that ranks experiences for a query: "{DEFAULT_MODEL}" (computed by this node in the background,
# the network's embedding meanwhile) or "network" (the network's embedding only)
model = "{config.retrieval.model}"

# [llm]
# An OpenAI-compatible chat endpoint for `expledger dso` and curation (see README). Environment
# variables EXPLEDGER_LLM_BASE_URL, EXPLEDGER_LLM_MODEL and EXPLEDGER_LLM_API_KEY override it.
# base_url = "http://127.0.0.1:8080/v1"
# model = ""               # "": the server's first model
# curate = false           # true: this daemon resolves conflicts and merges paraphrases with the LLM

# [proxy]
# An OpenAI-compatible endpoint for agents (see README): their chat requests get the library's experiences
# and go on to `upstream` ("": [llm] base_url). Its api_key is the RPC token. Off unless `listen` is set.
# listen = "127.0.0.1:8646"
# upstream = ""
# k = 5
# budget = 2048
"""
