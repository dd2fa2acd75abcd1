"""What a data directory gets at open, and clearing the library for a rebuild (docs/ARCHITECTURE.md, "Who owns what").

Rule: a data directory an earlier version wrote opens: its bucket marks move into the key filter (I is dropped),
its table of add vectors (F) is dropped, its records' long lists move into U. `clear` empties every table the fold
writes but the order O, which `Ledger.rebuild_library` folds again from nothing.
Invariant: each step writes in synced chunks and is resumable: interrupted, it goes on at the next open, and what
it leaves reads as the same library.
"""

from __future__ import annotations

import logging

from ledger.cid import CID_LENGTH
from ledger.library.tables import TABLES, _listed_in
from ledger.records import INLINE_LIST, ExperienceRecord
from ledger.store import Store
from ledger.tables import BUCKET_MARK, BUCKETS_MARKED, EXPERIENCE, LAST_ADD, LISTS_OUTSIDE, ORDER, VECTOR, listed_key

log = logging.getLogger(__name__)
#: bucket marks deleted per write when a data directory that stored them is opened
_DROP_CHUNK = 100_000
#: keys per synced write when long lists move out of the records of a data directory written before the U table
_MOVE_CHUNK = 100_000
_CLEARED = tuple(table for table in TABLES if table != ORDER)  # a rebuild reads the order, and writes it the same


def _delete_table(store: Store, prefix: bytes, what: str) -> int:
    """Delete every key under `prefix` in synced chunks read from one iterator (its snapshot does not see the
    deletions), logging progress; returns how many: one write of millions of keys holds them all in memory."""
    deleted, chunk = 0, {}
    for key, _ in store.scan(prefix):
        chunk[key] = None
        if len(chunk) == _DROP_CHUNK:
            store.write(chunk)
            deleted, chunk = deleted + len(chunk), {}
            log.info("%s: deleted %d %s", store.path, deleted, what)
    if chunk:
        store.write(chunk)
    return deleted + len(chunk)


class Upgrades:
    """The upgrades at open and the rebuild's clearing, as methods of the `Library`."""

    @staticmethod
    def drop_bucket_marks(store: Store) -> None:
        """Delete the bucket marks a data directory written before they moved into the key filter holds (I).

        Deleted in chunks (`_delete_table`), then compacted away: until then every open would seek over their
        tombstones. An interrupted drop goes on at the next open.
        """
        dropped = _delete_table(store, BUCKET_MARK, "bucket marks")
        if not dropped and store.get(BUCKETS_MARKED) is None:
            return
        store.write({BUCKETS_MARKED: None})
        store.compact(BUCKET_MARK)
        log.info("%s: dropped %d bucket marks: the key filter holds them", store.path, dropped)

    @staticmethod
    def drop_vectors(store: Store) -> None:
        """Delete the vectors of adds (F) a data directory written before the fold read them from the operations
        holds, in chunks (`_delete_table`), then compact them away; an interrupted drop goes on at the next open."""
        dropped = _delete_table(store, VECTOR, "vectors of adds")
        if dropped:
            store.compact(VECTOR)
            log.info("%s: dropped %d vectors of adds: the fold reads them from the operations", store.path, dropped)

    @staticmethod
    def list_outside(store: Store) -> None:
        """Move the long lists of records written before the U table held them there, once per data directory (at
        open; the bytes of such a record change, nothing it says does).

        Records are rewritten with their U keys in synced chunks, and the directory is marked done after the last;
        an interrupted move goes on at the next open (a record moved already packs as it is stored).
        """
        if store.get(LISTS_OUTSIDE) is not None:
            return
        moved, writes = 0, {}
        listed = _listed_in(store)
        for key, raw in store.scan(EXPERIENCE):
            if len(raw) <= INLINE_LIST * CID_LENGTH:  # too short to hold a list longer than a record keeps itself
                continue
            record = ExperienceRecord.unpack(raw, listed)
            if (packed := record.pack()) == raw:
                continue
            writes[key] = packed
            writes.update((listed_key(record.id.raw, entry), b"") for entry in record.outside())
            moved += 1
            if len(writes) >= _MOVE_CHUNK:
                store.write(writes)
                writes = {}
                log.info("%s: moved the long lists of %d records into their own table", store.path, moved)
        store.write({**writes, LISTS_OUTSIDE: b""})
        if moved:
            log.info("%s: the long lists of %d records are in their own table", store.path, moved)

    @staticmethod
    def clear(store: Store) -> None:
        """Delete every table the fold writes but the canonical order of the applied operations (a rebuild folds
        them again from nothing, in that order, and the fold writes the same keys there), in synced chunks
        (`_delete_table`): one transaction held the whole library (9.55 GB at 1M operations)."""
        cleared = sum(_delete_table(store, table, "keys of the library") for table in _CLEARED)
        store.write({LAST_ADD: None})
        log.info("%s: cleared the library (%d keys)", store.path, cleared)

    @staticmethod
    def compact(store: Store) -> None:
        """Compact the tables `clear` emptied: their deleted keys go (once no snapshot taken before lives), which
        every scan of the fold would seek over (18 ms per bucket scan at 1M)."""
        for table in _CLEARED:
            store.compact(table)
        log.info("%s: compacted the cleared library", store.path)
