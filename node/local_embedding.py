"""The background task that computes the node-local retrieval model's vectors of live experiences.

It runs `LocalRetrieval.step` on a thread of its own (never a reader's: queries must not wait behind it) until
nothing is missing, then sleeps until the next committed batch. Steps are short (`STEP` texts, under a second
with MiniLM) so that a stop is not held up, and after each it rests as long as it worked, so it takes at most
half a core from ingest, gossip and queries (the network embedding ranks meanwhile). Progress survives
restarts: the local index is on disk.
"""

from __future__ import annotations

import logging
import time

import trio

from ledger.ingest import Receipt
from ledger.local_index import LocalRetrieval

log = logging.getLogger(__name__)

STEP = 64  # texts per step: ~0.8 s with MiniLM on one core
REST = 1.0  # seconds of rest per second of work


class LocalEmbedding:
    """Keeps a local index in step with the library: woken by every commit, ended by `stop`."""

    def __init__(self, local: LocalRetrieval) -> None:
        self.local = local
        self._wake = trio.Event()
        self._stopped = trio.Event()  # also ends a rest at once
        self._thread = trio.CapacityLimiter(1)

    def committed(self, receipts: list[Receipt], submitted: list[bytes]) -> None:
        """A `Node.committed` listener: the library may have changed."""
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        reported = False
        while not self._stopped.is_set():
            self._wake = trio.Event()
            started = time.monotonic()
            try:
                done = await trio.to_thread.run_sync(self.local.step, STEP, self._stopped.is_set, limiter=self._thread)
            except Exception:  # the library is safe; the local index only ranks. Retried at the next commit
                log.exception("embedding live experiences for local retrieval failed")
                done = 0
            if done and not reported:
                log.info("local retrieval: embedding %d live experiences with %s", self.local.missing + done,
                         self.local.model.name)  # fmt: skip
                reported = True
            if not done:
                if reported:
                    log.info("local retrieval: all %d live experiences embedded", self.local.live)
                    reported = False
                await self._wake.wait()
            else:
                with trio.move_on_after((time.monotonic() - started) * REST):
                    await self._stopped.wait()
