"""The materialized library: a deterministic fold of the applied operations, one component at a time.

The library is a pure function of the SET of applied operations (docs/PROTOCOL.md §7). Votes are
tallied without regard to order: each author's latest vote counts (§7.7). Every other operation
belongs to a *component*: experiences linked by absorption (§7.6) and by merges, with
the operations acting on them. No rule reads outside its component, so a component's records are
the fold of its own operations in canonical order (Lamport clock, binary CID), and an operation
that arrives late changes what it touches in its component, not the library (§7.5). One that
sorts after everything in its component, the usual case, is folded on top.

The library owns its tables (X experiences, U their lists too long to keep in them, D by domain,
V statuses, O order, T by target, Y and R votes, C/G/Q components, E the add each absorbed add is
absorbed into, Z hash buckets). Reading takes any `ReadView`; folding writes into
the batch's transaction and returns a `Fold` of what changed for the vector index, which the
ledger publishes after the commit. It keeps no per-experience state in memory, but for the decoded
forms of a few large records, each checked against the bytes it was decoded from before it is used.

One module per rule, each stating its rule and invariant: `tables` (kinds, verdicts, records), `order` (canonical
order, causality, resolution where an operation sorts), `batch` (a fold in progress), `reading`, `upgrades` (at
open, and clearing for a rebuild), `components`, `absorption`, `edits` (modifies and deletes), `merges`, `votes`,
`rewind` (take-backs), `takeover` and `regroup` (late adds taking adds over), and `fold` (the driver, `Library`).
"""

from ledger.library.batch import Fold, _LargeRecords, _Records
from ledger.library.fold import Library
from ledger.library.order import OpMeta
from ledger.library.tables import TABLES

__all__ = ["TABLES", "Fold", "Library", "OpMeta", "_LargeRecords", "_Records"]
