"""Reads before background work: a query does not wait behind a batch of writes or of index inserts.

On 2 cores a query (3-10 ms of CPU) competed with the writer, the index thread and the signature
threads for the GIL. Each time it let the GIL go (a LevelDB get, a vector search) it waited for
a busy thread to give it back, up to the interpreter's switch interval (5 ms) each time, so a
query of a few milliseconds took 40-140 ms while ingest ran. Background threads now call
`pause()` between units of work: while a read is in flight they wait for it, up to `longest`
seconds, and afterwards work at least as long as they waited before waiting again, so a steady
stream of reads takes at most half of a background thread's time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ReadPriority:
    """Counts reads in flight; background work pauses for them (bounded, see the module docstring)."""

    def __init__(self, longest: float = 0.02) -> None:
        self._longest = longest
        self._reads = 0
        self._idle = threading.Condition(threading.Lock())
        self._resume = threading.local()  # per background thread: when it may pause again

    @property
    def reading_now(self) -> bool:
        return self._reads > 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a read in flight (reads may nest and run on any number of threads)."""
        with self._idle:
            self._reads += 1
        try:
            yield
        finally:
            with self._idle:
                self._reads -= 1
                if not self._reads:
                    self._idle.notify_all()

    def pause(self) -> None:
        """Called by background work between units: wait while reads are in flight, within the bounds."""
        if not self._reads:
            return
        start = time.monotonic()
        if start < getattr(self._resume, "at", 0.0):
            return
        with self._idle:
            self._idle.wait_for(lambda: not self._reads, timeout=self._longest)
        now = time.monotonic()
        self._resume.at = now + (now - start)


#: for work that has nothing to give way to (tests, tools, rebuilds)
NEVER = ReadPriority()
