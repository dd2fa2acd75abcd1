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
