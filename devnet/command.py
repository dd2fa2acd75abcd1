"""`expledger devnet …`, registered as a command of `expledger` (pyproject.toml's `expledger.commands` entry points).

The launcher sits on top of the node: `node.cli` finds it by name and imports nothing of it. Loading this module
is cheap (`expledger --help` lists it); the launcher itself loads only when it runs.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    """a local devnet of several nodes: up, status, logs, stop, start, down, demo, join"""
    from devnet.cli import main as devnet_main

    return devnet_main(argv)


def home_hint() -> str | None:
    """The hint `expledger` prints when a command's home holds no node while a devnet runs: which node to query."""
    from devnet.network import Devnet, DevnetError, default_dir
    from node.config import HOME_ENV

    path = default_dir()
    try:
        running = Devnet.load(path).running() if Devnet.exists(path) else []
    except DevnetError:
        return None
    if not running:
        return None
    home = running[0].home.path
    names = ", ".join(node.name for node in running)
    return (
        f"the devnet in {path} runs {names}; to query {running[0].name}, add `--home {home}` or "
        f"`export {HOME_ENV}={home}` (`expledger init` would make a new, empty node)"
    )
