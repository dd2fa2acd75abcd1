"""A second hard link to each LevelDB table file, so that LevelDB's deletes do not stall reads and writes
(docs/ARCHITECTURE.md, "Table links"). The store starts one per open database."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: the subdirectory of the database holding a second link to each table file (LevelDB ignores names it did not make)
TABLE_LINKS = "links"
#: seconds between two passes of the table links (a table deleted within a pass of its creation is freed slowly)
_LINK_INTERVAL = 0.1


class TableLinks:
    """A second hard link to every LevelDB table file, dropped once LevelDB has deleted its own.

    LevelDB 1.22 (plyvel's wheels) deletes the tables a compaction replaced while it holds the
    database mutex, which every read and write takes. Unlinking a table of 8 MB frees its cached
    pages: ~0.8 ms on an idle machine, 7-8 ms each while ingesting at 1M operations, and a
    compaction deletes 4-12 tables, so reads and writes stalled for 20-60 ms at a time (once
    941 ms). With a second link LevelDB's unlink removes only a name (~7 us); this thread frees
    the table afterwards, outside the mutex.
    """

    def __init__(self, database: Path, interval: float = _LINK_INTERVAL) -> None:
        self._database = database
        self._links = database / TABLE_LINKS
        self._interval = interval
        self._stop = threading.Event()
        self._linking = True  # until the file system refuses a hard link
        self._thread = threading.Thread(target=self._run, name="ledger-table-links", daemon=True)
        try:
            self._links.mkdir(mode=0o700, exist_ok=True)
            self._drop_copies()
            self.sweep()  # and the links of tables deleted while the node was down
        except OSError as exc:
            log.warning("cannot keep LevelDB table links in %s (%s); compactions will stall reads", self._links, exc)
            return
        self._thread.start()

    def _drop_copies(self) -> None:
        """A data directory copied without its hard links holds copies: they would never be freed."""
        for entry in os.scandir(self._links):
            if entry.stat().st_nlink == 1:
                os.unlink(entry.path)

    def sweep(self) -> None:
        """One pass: free the links whose table LevelDB deleted, then link the tables that have none.

        LevelDB never reuses a table's name, so a link whose name is not in the database is one to free.
        """
        tables = {entry.name for entry in os.scandir(self._database) if entry.name.endswith(".ldb")}
        linked = {entry.name for entry in os.scandir(self._links)}
        for name in linked - tables:
            with contextlib.suppress(FileNotFoundError):  # a test's pass may race the thread's
                os.unlink(self._links / name)
        if self._linking:
            for name in tables - linked:
                self._link(name)

    def _link(self, name: str) -> None:
        try:
            os.link(self._database / name, self._links / name)
        except (FileNotFoundError, FileExistsError):
            pass  # deleted by a compaction meanwhile, or linked by a test's pass
        except OSError as exc:  # a file system without hard links: LevelDB deletes the slow way
            log.warning("cannot hard-link LevelDB tables (%s); compactions will stall reads while they delete", exc)
            self._linking = False

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep()
            except OSError:  # the links directory went away, say: stop (the next start frees what is left)
                log.exception("keeping LevelDB table links failed; LevelDB deletes tables the slow way from now on")
                return

    def close(self) -> None:
        """Stop, then free what the database deleted last (call after closing the database)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            self._linking = False
            self.sweep()
