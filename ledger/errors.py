"""The one error family of the data layer: a stable dotted code plus a message naming the field."""


class LedgerError(Exception):
    """Base of every error the ledger reports about outside input; `code` is stable, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class EmbedderError(LedgerError):
    """The network's pinned embedding model, or a node's local retrieval model, cannot be provided here."""
