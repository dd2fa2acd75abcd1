"""What the learning loop reads from and writes to a node, over its RPC (node.client.Client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.cid import CID
from ledger.ops import Block
from node.client import Client, RpcFailed


@dataclass(frozen=True, slots=True)
class Entry:
    """A live experience as an operation on it must know it: its visible text, and what to build on."""

    id: CID
    text: str
    domain: str
    confidence: float
    #: the operations a new one must name as parents to take effect on it (its concurrent heads, else its version)
    parents: tuple[CID, ...]
    #: the highest clock among the operations on it: a new operation's clock must exceed it
    clock: int


class NodeLink:
    """The node's RPC as the learning loop uses it; experiences read once per run are cached."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._entries: dict[CID, Entry | None] = {}

    def retrieve(self, query: str, k: int) -> list[dict[str, Any]]:
        return self.client.call("retrieve", query=query, k=k)["hits"]

    def context(self, query: str, k: int) -> str:
        return self.client.call("context", query=query, k=k)["prompt"]

    def status(self) -> dict[str, Any]:
        return self.client.call("status")

    def submit(self, block: Block) -> dict[str, Any]:
        return self.client.call("submit", operation=block.data.hex())

    def forget(self) -> None:
        """Drop cached experiences: after a batch is submitted they have changed."""
        self._entries.clear()

    def entry(self, exp_id: CID) -> Entry | None:
        """The live experience `exp_id` stands for now (following merges), or None if it is gone."""
        if exp_id not in self._entries:
            self._entries[exp_id] = self._read(exp_id)
        return self._entries[exp_id]

    def _read(self, exp_id: CID) -> Entry | None:
        try:
            shown = self.client.call("get", id=str(exp_id))
            for _ in range(16):  # an alias resolves to what it was merged or absorbed into
                if shown["library"]["status"] != "alias":
                    break
                shown = self.client.call("get", id=shown["library"]["alias_of"])
            history = self.client.call("history", id=shown["id"])
        except RpcFailed as exc:
            if exc.code == "not_found.experience":
                return None
            raise
        library = shown["library"]
        if library["status"] != "live":
            return None
        heads = library["heads"] or [library["version"]]
        return Entry(
            id=CID.parse(shown["id"]),
            text=shown["text"],
            domain=shown["domain"],
            confidence=float(shown["confidence"]),
            parents=tuple(sorted((CID.parse(head) for head in heads), key=lambda cid: cid.raw)),
            clock=max(operation["clock"] for operation in history["operations"]),
        )
