"""A node's home: where `expledger init` puts everything, and how commands find it again.

`init` is idempotent (Kubo's `ipfs init` refuses a second run; here a second run checks what it
finds and changes nothing), so scripts and containers can run it before every start.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ledger.keys import AuthorKey
from ledger.params import NetworkParams
from node.config import (
    AUTHOR_KEY,
    CONFIG_FILE,
    COOKIE_FILE,
    DATA_DIR,
    NETWORK_FILE,
    P2P_ADDRS_FILE,
    P2P_DIR,
    PEER_KEY,
    PID_FILE,
    URL_FILE,
    Config,
    ConfigError,
    P2PConfig,
    RpcConfig,
    check_value,
    load_config,
    render_config,
)


class Home:
    """The files of one node's home directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser()

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def network_file(self) -> Path:
        return self.path / NETWORK_FILE

    @property
    def author_key_file(self) -> Path:
        return self.path / AUTHOR_KEY

    @property
    def peer_key_file(self) -> Path:
        return self.path / PEER_KEY

    @property
    def p2p_dir(self) -> Path:
        return self.path / P2P_DIR

    @property
    def p2p_addrs_file(self) -> Path:
        return self.path / P2P_ADDRS_FILE

    @property
    def data_dir(self) -> Path:
        return self.path / DATA_DIR

    @property
    def cookie_file(self) -> Path:
        return self.path / COOKIE_FILE

    @property
    def url_file(self) -> Path:
        return self.path / URL_FILE

    @property
    def pid_file(self) -> Path:
        return self.path / PID_FILE

    def require(self) -> None:
        """Refuse a home that `init` has not made."""
        if not self.config_file.is_file():
            raise ConfigError(
                "home.uninitialised", f"{self.path}: no {CONFIG_FILE} here; run `expledger init --home {self.path}`"
            )

    def config(self) -> Config:
        self.require()
        return load_config(self.config_file)

    def network(self) -> NetworkParams:
        self.require()
        return NetworkParams.from_file(self.network_file)

    def author_key(self) -> AuthorKey:
        return AuthorKey.load(self.author_key_file)

    def peer_key(self) -> AuthorKey:
        """The libp2p identity's seed, kept like the author key (created if a home made before it lacks one)."""
        if not self.peer_key_file.exists():
            AuthorKey.generate().save(self.peer_key_file)
        return AuthorKey.load(self.peer_key_file)

    def init(
        self, network: NetworkParams | None = None, rpc_listen: str | None = None, p2p_listen: str | None = None
    ) -> list[str]:
        """Create what is missing, check what exists; returns one line per item saying which.

        `network` joins an existing network's parameters; a home made for another network is refused.
        """
        report = []
        if not self.path.exists():
            self.path.mkdir(parents=True, mode=0o700)
            report.append(f"created {self.path}")
        if self.config_file.exists():
            config = load_config(self.config_file)
            report.append(f"found {self.config_file} (RPC on {config.rpc.listen})")
        else:
            config = Config()
            if rpc_listen is not None:
                config = dataclasses.replace(
                    config, rpc=RpcConfig(listen=check_value("--rpc", "rpc", "listen", rpc_listen))
                )
            if p2p_listen is not None:
                listen = check_value("--p2p", "p2p", "listen", [p2p_listen] if p2p_listen else [])
                config = dataclasses.replace(config, p2p=P2PConfig(listen=listen))
            _write_new(self.config_file, render_config(config))
            report.append(f"created {self.config_file} (RPC on {config.rpc.listen})")
        if self.network_file.exists():
            found = NetworkParams.from_file(self.network_file)
            if network is not None and network != found:
                raise ConfigError(
                    "home.network",
                    f"{self.network_file}: this home belongs to network {found.network_id!r} with other parameters; "
                    "use another --home to join a different network",
                )
            report.append(f"found {self.network_file} (network {found.network_id!r})")
            network = found
        else:
            network = network or NetworkParams()
            _write_new(self.network_file, network.to_json())
            report.append(f"created {self.network_file} (network {network.network_id!r})")
        if self.author_key_file.exists():
            report.append(f"found {self.author_key_file} (author {self.author_key().did})")
        else:
            key = AuthorKey.generate()
            key.save(self.author_key_file)
            report.append(f"created {self.author_key_file} (author {key.did})")
        if self.peer_key_file.exists():
            report.append(f"found {self.peer_key_file} (the libp2p identity; `expledger id` prints it)")
        else:
            self.peer_key()
            report.append(f"created {self.peer_key_file} (the libp2p identity; `expledger id` prints it)")
        existed = (self.data_dir / "ledger.db").exists()
        from ledger.ledger import Ledger  # the storage stack loads for `init`, not for every client command

        ledger = Ledger.open(self.data_dir, network)  # creates it, or checks it belongs to this network
        try:
            view = ledger.view()
            node, size = ledger.node_key.did, view.log_size
        finally:
            ledger.close()
        report.append(f"{'found' if existed else 'created'} {self.data_dir} (node {node}, {size} operations)")
        return report


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs. A daemon killed by a signal stays a zombie until its parent reaps it, and a
    detached daemon's parent is init (in a container, whatever runs first), which may reap late or never:
    `kill(pid, 0)` still succeeds on a zombie, so its state in /proc decides."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): kill(pid, 0) is all there is to know
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")  # the state follows the command name's ")"


def _write_new(path: Path, text: str) -> None:
    """Create `path` with `text`, readable by its owner only; never overwrite."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
