"""How often this node served each experience (by `retrieve`, `context` and the proxy) and in which domains:
the format seed's `usage_count` and `domains_applied`.

Counts are this node's observations, not the network's: they live in their own LevelDB (HOME/usage), apart
from the ledger's data, so they never enter an operation, the log or the state root. Each serve is written
with a synced write before its answer goes out, so a count the client saw survives kill -9 (one fsync per
serve: bench/bench_usage.py measures it against an unsynced write). `domains_applied` are the domains the
experience was served for: the `domain` a retrieval asked for, else the experience's own domain; at most
MAX_DOMAINS per experience are kept (the most used; a new one replaces the least used once full).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plyvel

from ledger.cid import CID
from ledger.errors import LedgerError

SERVED_BY = ("retrieve", "context", "proxy")
MAX_DOMAINS = 16


class UsageError(LedgerError):
    """The usage database cannot be opened (in use by another process, or damaged) or written (a full disk)."""


@dataclass
class Usage:
    count: int = 0
    by: dict[str, int] = field(default_factory=dict)  # per way it was served (SERVED_BY)
    domains: dict[str, int] = field(default_factory=dict)  # per domain served for

    @property
    def domains_applied(self) -> list[str]:
        """The domains it was served for, most served first (then by name)."""
        return [name for name, _ in sorted(self.domains.items(), key=lambda item: (-item[1], item[0]))]

    def add(self, how: str, domain: str) -> None:
        self.count += 1
        self.by[how] = self.by.get(how, 0) + 1
        if domain in self.domains or len(self.domains) < MAX_DOMAINS:
            self.domains[domain] = self.domains.get(domain, 0) + 1
        else:  # full: the least used (the first by name among equals) gives way, so the list stays bounded
            del self.domains[min(sorted(self.domains), key=self.domains.__getitem__)]
            self.domains[domain] = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "usage_count": self.count,
            "domains_applied": self.domains_applied,
            "served_by": {how: self.by.get(how, 0) for how in SERVED_BY},
        }

    def encode(self) -> bytes:
        return json.dumps({"count": self.count, "by": self.by, "domains": self.domains}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Usage:
        value = json.loads(data)
        return cls(int(value["count"]), dict(value["by"]), dict(value["domains"]))


class UsageStats:
    """The counts, in memory for reads and in LevelDB for restarts; thread-safe (serves record from reader
    threads)."""

    def __init__(self, path: Path, sync: bool = True) -> None:
        """`sync=False` only for measuring what the synced writes cost (bench/bench_usage.py)."""
        self._sync = sync
        try:
            self._db = plyvel.DB(str(path), create_if_missing=True)
        except plyvel.Error as exc:
            raise UsageError("usage.open", f"{path}: cannot open the usage database ({exc})") from None
        self._lock = threading.Lock()  # the counts in memory, the writes not yet made, their sequence numbers
        self._writing = threading.Lock()  # one synced write at a time
        self._usage: dict[bytes, Usage] = {key: Usage.decode(value) for key, value in self._db}
        self._unwritten: dict[bytes, bytes] = {}
        self._recorded = 0  # serves recorded in memory
        self._written = 0  # serves on disk

    def record(self, served: Iterable[tuple[CID, str]], how: str, domain: str | None) -> None:
        """One serve of each (experience, its domain): counted, and on disk before this returns.

        Group commit: serves recorded while a synced write is under way are written together by the next one,
        so concurrent serves share an fsync instead of queueing for one each."""
        served = list(served)
        if not served:
            return
        with self._lock:
            for exp_id, own_domain in served:
                usage = self._usage.setdefault(exp_id.raw, Usage())
                usage.add(how, domain or own_domain)
                self._unwritten[exp_id.raw] = usage.encode()
            self._recorded += 1
            mine = self._recorded
        with self._writing:
            if self._written >= mine:
                return  # a write that began after this serve was recorded has synced it
            with self._lock:
                pending, self._unwritten = self._unwritten, {}
                covered = self._recorded
            try:
                with self._db.write_batch(sync=self._sync) as batch:
                    for key, value in pending.items():
                        batch.put(key, value)
            except plyvel.Error as exc:
                with self._lock:  # kept for the next write; what was recorded since is newer
                    self._unwritten = {**pending, **self._unwritten}
                raise UsageError("usage.write", f"the usage counts could not be written ({exc})") from None
            self._written = covered

    def of(self, exp_id: CID) -> Usage:
        with self._lock:
            found = self._usage.get(exp_id.raw)
            return Usage(found.count, dict(found.by), dict(found.domains)) if found else Usage()

    def top(self, limit: int) -> list[tuple[CID, Usage]]:
        """The most served experiences, most first (then by id)."""
        with self._lock:
            ranked = sorted(self._usage.items(), key=lambda item: (-item[1].count, item[0]))[:limit]
            return [(CID(key), Usage(u.count, dict(u.by), dict(u.domains))) for key, u in ranked]

    def __len__(self) -> int:
        return len(self._usage)

    def close(self) -> None:
        with self._writing, self._lock:
            self._db.close()
