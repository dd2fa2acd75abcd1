"""The background task that computes the node-local retrieval model's vectors of live experiences.

It runs `LocalRetrieval.step` on a thread of its own (never a reader's: queries must not wait behind it) until
nothing is missing, then sleeps until the next committed batch. Steps are short (`STEP` texts, under a second
with MiniLM) so that a stop is not held up. Progress survives restarts: the local index is on disk.
"""

from __future__ import annotations

import logging

import trio

from ledger.ingest import Receipt
from ledger.local_index import LocalRetrieval

log = logging.getLogger(__name__)

STEP = 64  # texts per step: ~0.8 s with MiniLM on one core


class LocalEmbedding:
    """Keeps a local index in step with the library: woken by every commit, ended by `stop`."""

    def __init__(self, local: LocalRetrieval) -> None:
        self.local = local
        self._wake = trio.Event()
        self._stopping = False
        self._thread = trio.CapacityLimiter(1)

    def committed(self, receipts: list[Receipt], submitted: list[bytes]) -> None:
        """A `Node.committed` listener: the library may have changed."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        reported = False
        while not self._stopping:
            self._wake = trio.Event()
            try:
                done = await trio.to_thread.run_sync(
                    self.local.step, STEP, lambda: self._stopping, limiter=self._thread
                )
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
