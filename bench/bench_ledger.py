"""Ledger benchmark: ingest up to a million operations, the cost of a late operation, stalls, memory, restart.

Usage: python -m bench.bench_ledger [--ops N] [--checkpoints 10000,100000] [--batch B] [--model hashing]
                                   [--absorption-horizon H]

Figures, all from one run on one stream of operations (bench/workload.py):
  ingest        validate + check embeddings + store + log + fold + index, ops/s per tenth of the run,
                and the whole run's ratio to decode+validate+verify of the same kind of operations
                (target >= 0.25; the last tenth at least 0.8 of the first); the baseline is measured
                before and after ingest, and the faster of the two counts. Per tenth, the CPU per
                operation of the writer and of all other threads (index, signatures, the querying
                thread, LevelDB's compaction): what slows the later tenths
  late add      at each checkpoint, an add with clock 1 and no parents from a new author (it sorts
                before everything) against an add that sorts last: the ratio of their costs
                (target <= 20 at 10k, 100k and 1M operations)
  largest       at each checkpoint, in the library's largest component (experiences linked by
  component     near-duplicate absorption and merges, PROTOCOL.md 7.5: what one operation may have to fold
                again): a merge of two of its roots, signed by a new key; an add with clock 1 from a new
                author repeating one of its adds and sorting before every copy (each round's before the
                last's: it takes over the copies of its window of absorption_horizon clocks, and renames
                their experience where it sorts), then one sorting after it (absorbed: it reads the
                copies of that window); a
                modify, a delete and a copy that sort just after early members no merge names (folded
                where they sort), and a modify and a delete of two such
                members in one batch; a delete of one an applied merge names (it voids the merge, which
                is taken back with what acted on it since), then another once the merge is void (its
                verdict is reworded); a modify of another such member and one of a member no merge names
                in one batch (the merge is undone before either is folded); a merge of two early roots
                sorting just after them; medians of 3,
                what one peer can make a node spend; at the last checkpoint, after the other probes, a
                merge of an early add that a merge took and a new add, sorting just after them (the merge
                that took the add takes the late one instead), and a late copy taking adds out of an
                experience that an applied merge and a delete name (it rewinds what it touches)
  splits and    at each checkpoint, in the repeated insight's experience: a late add near an add absorbed
  joins         into it but not near the insight takes adds out of it, then a late copy of the insight near
                the experience that add now stands for (with a modify) joins the two (PROTOCOL.md 7.5); the
                operations they fold again; medians of 3. At the last checkpoint the same with a delete of an
                add that leaves (the split makes the insight live again, the join deletes it again)
  stalls        the longest ingest batch against the median one (and the writer's CPU in it: the rest
                is waiting), and the longest query of a thread that retrieves once every 50 ms while
                ingest runs, against its median
  memory        the process's resident set at each checkpoint (the generator keeps little)
  duplicates    the first operations submitted again: ignored before decoding or checking a
                signature; their cost per operation as a share of a new one's (target < 0.1)
  restart, disk opening the data directory again (target < 1 s); bytes on disk per operation
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workload import REPEATED, operations
from ledger.cid import CID
from ledger.embedder import embedder_for, pack_float16
from ledger.ingest import Verdict
from ledger.keys import AuthorKey
from ledger.ledger import Ledger
from ledger.neardup import exact_cosine_exceeds
from ledger.ops import Block, Embedding, Experience, Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.records import Life, Outcome
from ledger.retrieval import Retriever
from ledger.tables import COMPONENT_SIZE, member_prefix, parse_member_key, read_u64
from ledger.validation import validate
from ledger.view import LedgerView

QUERIES = (
    "Which points of a line and a segment count as solutions?",
    "How should I bound a sum of positive terms?",
    "A proof by induction fails for small cases.",
    "How many lattice paths cross the grid?",
)


def _process_cpu() -> float:
    """CPU seconds of every thread of this process, native ones (LevelDB's compaction) and ended ones included."""
    times = os.times()
    return times.user + times.system


def _threads_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread but the main one, by native id, with a label: a Python thread's name less
    its number (ledger-verify_0 -> ledger-verify), a native thread's (LevelDB's compaction) "native:" and its comm."""
    names = {thread.native_id: thread.name.rstrip("0123456789").rstrip("_-") for thread in threading.enumerate()}
    main, ticks, threads = threading.main_thread().native_id, os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc/self/task").iterdir():
        tid = int(entry.name)
        try:
            stat, comm = (entry / "stat").read_text(), (entry / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile: before the open, or during the read
            continue
        if tid != main:
            fields = stat[stat.rindex(")") + 2 :].split()  # after the comm, which may hold spaces
            threads[tid] = (names.get(tid) or f"native:{comm}", (int(fields[11]) + int(fields[12])) / ticks)
    return threads


def _by_thread(before: dict[int, tuple[str, float]], others: float, operations: int) -> dict[str, float]:
    """The other threads' CPU per operation since `before`, by label; what threads that ended since spent (the index
    thread ends whenever its backlog empties) is what the live ones do not account for."""
    spent: dict[str, float] = {}
    for tid, (label, cpu) in _threads_cpu().items():
        spent[label] = spent.get(label, 0.0) + (cpu - before[tid][1] if tid in before else cpu) / operations
    spent["ended threads"] = others / operations - sum(spent.values())
    return spent


def _rss_mb() -> float:
    """The resident set size of this process now (not its peak), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _disk_bytes(path: Path) -> int:
    """Bytes of the files under `path`, a file with two names (LevelDB's table links) counted once."""
    sizes = {}
    for file in path.rglob("*"):
        if file.is_file():
            stat = file.stat()
            sizes[(stat.st_dev, stat.st_ino)] = stat.st_size
    return sum(sizes.values())


def _add(params: NetworkParams, clock: int, serial: int, parents: tuple = (), key: int = 99) -> bytes:
    """A fresh add (a distinct text each time), signed by a key the workload does not use."""
    embedder = embedder_for(params)
    text = f"When a late insight arrives about topic {_word(serial)}, fold it in order and check it against its cases."
    vector = pack_float16(embedder.embed([text])[0])
    content = Experience(text, ("bench",), 0.5, Embedding(embedder.model_id, embedder.dim, vector))
    return sign(
        Operation(Kind.ADD, "", clock, parents, 1_700_000_000, content=content), AuthorKey(bytes([key]) * 32)
    ).data


def _validate_rate(sample: list[bytes], params: NetworkParams) -> float:
    start = time.perf_counter()
    for data in sample:
        validate(data, params)
    return len(sample) / (time.perf_counter() - start)


def _word(serial: int) -> str:
    return "".join(chr(ord("a") + int(digit)) for digit in str(serial))


def _timed(ledger: Ledger, *data: bytes) -> float:
    """Seconds to ingest `data` as one batch."""
    start = time.perf_counter()
    receipts = ledger.ingest(list(data))
    elapsed = time.perf_counter() - start
    assert all(receipt.verdict is Verdict.ACCEPTED for receipt in receipts), receipts
    return elapsed


def _late_vs_last(ledger: Ledger, params: NetworkParams, serial: int) -> tuple[float, float]:
    """Median cost of an add that sorts first (clock 1, no parents, a new author) and of one that sorts last."""
    early, last = [], []
    for round_ in range(5):
        early.append(_timed(ledger, _add(params, 1, serial + 2 * round_, key=100 + round_)))
        parents, clock = ledger.view().parents_and_clock()
        last.append(_timed(ledger, _add(params, clock, serial + 2 * round_ + 1, parents)))
    return statistics.median(early), statistics.median(last)


def _late_behind(ledger: Ledger, params: NetworkParams, behind: int, serial: int) -> float:
    """Cost of an add whose clock puts it `behind` operations before the newest."""
    applied = ledger.view().applied_in_order()
    anchor = applied[-behind - 1] if behind < len(applied) else applied[0]
    return _timed(ledger, _add(params, ledger.view().clock(anchor), serial, key=98))


@dataclass
class _ComponentProbe:
    """What one peer can make a node spend in its largest component: seconds, medians of 3."""

    members: int
    merge: float | None  # a merge of two of its roots (None: fewer than 6 roots)
    late_merge: float | None  # two early roots of one add only votes and void merges name, merged just after them
    late_merge_refolded: int  # the operations such a merge folds again (median)
    takeover: float  # an add with clock 1 repeating one of its adds, first among their copies: it takes them over
    taken: int  # the adds such a takeover took over: now absorbed into it (median)
    refolded: int  # the operations such a takeover folds again (median): none if it only renames an experience
    after_takeover: float  # then a copy at clock 1 that sorts after those: absorbed into them
    in_place: dict[str, float]  # late modify / delete / absorbed copy of early members no merge names
    late_pair: float | None  # a late modify and a late delete of two such members in one batch
    merge_voided: float | None  # a late delete of an early member an applied merge names (None: none found)
    voided_again: float | None  # then another: the merge is void already
    #: a late modify of a target of an applied merge (concurrent with it: it voids the merge) and one of an early
    #: member no merge names, in one batch (None: no merge became void)
    voided_in_batch: float | None
    voided_in_batch_refolded: int  # the operations such a batch folds again (median)
    reworded: float | None  # a late delete voiding a merge that void merges name (None: no such merge)
    reworded_refolded: int  # the operations such a delete folds again (median)


#: the late operations that change one record or two (PROTOCOL.md 7.5: folded where they sort)
IN_PLACE = ("modify", "delete", "absorbed add")


def _largest(ledger: Ledger) -> tuple[bytes, int]:
    """The largest component's id and its number of experiences."""
    sizes = ((key[1:], read_u64(raw)) for key, raw in ledger.store.scan(COMPONENT_SIZE))
    return max(sizes, key=lambda item: (item[1], item[0]))


def _only_voted(view: LedgerView, exp_id: CID) -> bool:
    """Whether only votes and void merges name `exp_id`: nothing else acted on it."""
    return all(
        view.kind(named) is Kind.VOTE or (view.kind(named) is Kind.MERGE and view.status(named).outcome is Outcome.VOID)
        for named in view.by_target(exp_id)
    )


#: texts of the adds the late merges of taken adds merge them with, far from the workload's and each other's
PARTNER_TEXTS = (
    "When a proof by induction stalls, strengthen the hypothesis before adding more cases.",
    "When parsing dates from logs, normalise the time zones before comparing two timestamps.",
    "When a measured reaction yield exceeds the theoretical one, recheck the limiting reagent.",
)


def _late_merges_of_taken(ledger: Ledger, probe: int) -> tuple[float, int, int] | None:
    """In the largest component, merges of an early add that an applied merge took, in a live experience, and a
    new add with clock 1 (ingested first, not timed), each merge with a clock just above the two and no parents,
    signed by keys of this probe: the merge that took the first add takes the late one instead, and what acted on
    it since is folded again (PROTOCOL.md 7.5). Their median cost, the median count of operations each folds
    again and the median count of the component's operations sorting after each (what refolding the component
    from it would fold again); None if the component has no such add. The last probe of a run: its merges change
    what the others probe."""
    component, _ = _largest(ledger)
    view = ledger.view()
    members = [CID(parse_member_key(key)) for key, _ in ledger.store.scan(member_prefix(component))]
    early = sorted((m for m in members if view.kind(m) is Kind.ADD), key=lambda m: (view.clock(m), m.raw))[:200]
    taken = [
        m
        for m in early
        if (record := view.experience(m)) and record.alias_of and view.kind(record.alias_of) is Kind.MERGE
    ]
    embedder = embedder_for(ledger.params)
    vectors = [pack_float16(values) for values in embedder.embed(list(PARTNER_TEXTS))]
    times, refolded, behind = [], [], []
    for round_, (text, vector) in enumerate(zip(PARTNER_TEXTS, vectors, strict=True)):
        now = ledger.view()
        add = next((m for m in taken if (record := now.experience(now.resolve(m))) and record.live), None)
        if add is None:
            break
        taken.remove(add)
        content = Experience(text, ("bench",), 0.5, Embedding(embedder.model_id, embedder.dim, vector))
        partner = sign(Operation(Kind.ADD, "", 1, (), 1_700_000_000, content=content), _probe_key(220, round_, probe))
        ledger.ingest([partner.data])
        before, merge = ledger.refolded, _merge(ledger, add, partner.cid, _probe_key(210, round_, probe), late=True)
        times.append(_timed(ledger, merge))
        refolded.append(ledger.refolded - before)
        behind.append(_sorting_after(ledger.view(), members, CID.for_block(merge)))
    if not times:
        return None
    return statistics.median(times), int(statistics.median(refolded)), int(statistics.median(behind))


def _sorting_after(view: LedgerView, members: list[CID], late: CID) -> int:
    """The applied operations on `members` (their adds and merges, and what names them) that sort after `late`."""
    operations = set(members) | {named for member in members for named in view.by_target(member)}
    after = (view.clock(late), late.raw)
    return sum(
        1
        for cid in operations
        if (view.clock(cid), cid.raw) > after and (status := view.status(cid)) and status.outcome is Outcome.APPLIED
    )


def _probe_key(base: int, offset: int, probe: int) -> AuthorKey:
    """A key of the probe with serial `probe`: each probe's operations come from new authors."""
    return AuthorKey(bytes([base + offset, probe]) * 16)


def _largest_component(ledger: Ledger, probe: int) -> _ComponentProbe:
    """Probe the largest component with operations signed by new keys (`probe`: a serial for the keys)."""
    component, size = _largest(ledger)
    view = ledger.view()
    members = [CID(parse_member_key(key)) for key, _ in ledger.store.scan(member_prefix(component))]
    roots = [m for m in members if (record := view.experience(m)) is not None and record.live]
    adds = [m for m in members if view.kind(m) is Kind.ADD]
    early = sorted(adds, key=lambda m: (view.clock(m), m.raw))[:200]
    merging = {m: [o for o in view.by_target(m) if view.kind(o) is Kind.MERGE] for m in early}
    free = [m for m in early if not merging[m]]
    # named by a merge that is applied: a delete voids it (one void already would only be reworded)
    named = {m for m in early if any(view.status(merge).outcome is Outcome.APPLIED for merge in merging[m])}
    merges, takeovers, taken, refolded, absorbed, pairs, voided, again = [], [], [], [], [], [], [], []
    late_merges, late_refolded, reworded, reworded_refolded = [], [], [], []
    voided_in_batch, voided_in_batch_refolded = [], []
    # sources of applied merges that void merges name (98 of the 114 that took adds of the 1M workload's largest
    # component): a delete of one voids its merge, which is undone, and the void merges naming it are reworded
    rewording = _named_by_void_merges(view, members)
    # roots of one add that only votes and void merges name, which the merges on top leave alone, earliest first: a
    # merge of two of them with a clock just above theirs sorts before most of the component, and changes no more
    spared = roots[6:] if len(roots) >= 6 else roots
    untaken = sorted(
        (m for m in spared if (record := view.experience(m)) and record.support == 1 and _only_voted(view, m)),
        key=lambda m: (view.clock(m), m.raw),
    )
    first = (view.clock(early[0]), early[0].raw)  # what a copy must sort before to take the component's copies over
    # applied merges no merge took, the middle ones by clock: a modify of a target with a clock just above it and no
    # parents is concurrent with the merge (unless the merge is more than the causal horizon above it) and voids it
    live_merges = sorted((m for m in roots if view.kind(m) is Kind.MERGE), key=lambda m: (view.clock(m), m.raw))
    in_place: dict[str, list[float]] = {kind: [] for kind in IN_PLACE}
    for round_ in range(3):
        if len(roots) >= 6:
            key = _probe_key(120, round_, probe)
            merges.append(_timed(ledger, _merge(ledger, roots[2 * round_], roots[2 * round_ + 1], key)))
        if len(untaken) >= 2 * round_ + 2:
            key = _probe_key(170, round_, probe)
            before = ledger.refolded
            pair = untaken[2 * round_], untaken[2 * round_ + 1]
            late_merges.append(_timed(ledger, _merge(ledger, *pair, key, late=True)))
            late_refolded.append(ledger.refolded - before)
        original = view.content(adds[round_ % len(adds)])
        key = _probe_key(110, round_, probe)
        copy = _copy_at_clock_1(original, key, first, before=True)
        before = ledger.refolded
        takeovers.append(_timed(ledger, copy.data))
        refolded.append(ledger.refolded - before)
        after = ledger.view()
        record = after.experience(copy.cid)
        listed = record.absorbed if record is not None else []
        taken.append(sum(1 for add in listed if (status := after.status(add)) and status.into == copy.cid))
        first = (1, copy.cid.raw)
        key = _probe_key(115, round_, probe)
        absorbed.append(_timed(ledger, _copy_at_clock_1(original, key, first, before=False).data))
        for number, kind in enumerate(IN_PLACE):
            if len(free) > 3 * round_ + number:
                key = _probe_key(130, 3 * round_ + number, probe)
                target = free[3 * round_ + number]
                in_place[kind].append(_timed(ledger, _late_on(ledger, kind, target, key)))
        if len(free) > 10 + 2 * round_:
            keys = [_probe_key(150, 2 * round_ + number, probe) for number in range(2)]
            pair = [_late_on(ledger, kind, free[9 + 2 * round_ + number], keys[number]) for number, kind in
                    enumerate(("modify", "delete"))]  # fmt: skip
            pairs.append(_timed(ledger, *pair))
        if len(rewording) > round_:
            key = _probe_key(190, round_, probe)
            before = ledger.refolded
            reworded.append(_timed(ledger, _late_on(ledger, "delete", rewording[round_], key)))
            reworded_refolded.append(ledger.refolded - before)
        if len(named) > round_:
            for attempt, times in enumerate((voided, again)):
                key = _probe_key(140, 2 * round_ + attempt, probe)
                times.append(_timed(ledger, _late_on(ledger, "delete", sorted(named)[round_], key)))
        if len(live_merges) > 6 and len(free) > 15 + round_:
            merge = live_merges[len(live_merges) // 2 + round_]
            block, record = view.block(merge), ledger.view().experience(merge)
            if block is not None and record is not None and record.live:
                keys = [_probe_key(180, 2 * round_ + number, probe) for number in range(2)]
                targets = (block.op.targets[0], free[15 + round_])
                batch = [_late_on(ledger, "modify", target, key) for target, key in zip(targets, keys, strict=True)]
                before = ledger.refolded
                seconds = _timed(ledger, *batch)
                status = ledger.view().status(merge)
                if status is not None and status.outcome is Outcome.VOID:
                    voided_in_batch.append(seconds)
                    voided_in_batch_refolded.append(ledger.refolded - before)
    return _ComponentProbe(
        size,
        statistics.median(merges) if merges else None,
        statistics.median(late_merges) if late_merges else None,
        int(statistics.median(late_refolded)) if late_refolded else 0,
        statistics.median(takeovers),
        int(statistics.median(taken)),
        int(statistics.median(refolded)),
        statistics.median(absorbed),
        {kind: statistics.median(times) for kind, times in in_place.items() if times},
        statistics.median(pairs) if pairs else None,
        statistics.median(voided) if voided else None,
        statistics.median(again) if again else None,
        statistics.median(voided_in_batch) if voided_in_batch else None,
        int(statistics.median(voided_in_batch_refolded)) if voided_in_batch_refolded else 0,
        statistics.median(reworded) if reworded else None,
        int(statistics.median(reworded_refolded)) if reworded_refolded else 0,
    )


def _named_by_void_merges(view: LedgerView, members: list[CID]) -> list[CID]:
    """Up to three adds that are sources of an applied merge that a void merge names and nothing but votes and void
    merges acted on, each named by nothing but votes and that merge, earliest first."""
    found = []
    for member in sorted(members, key=lambda m: (view.clock(m), m.raw)):
        record = view.experience(member)
        if record is None or record.alias_of is None or view.kind(member) is not Kind.ADD:
            continue
        merge = record.alias_of
        merged = view.experience(merge) if view.kind(merge) is Kind.MERGE else None
        if merged is None or merged.status != "live" or merged.heads or not _only_voted(view, merge):
            continue
        if any(view.kind(named) is Kind.MERGE for named in view.by_target(merge)) and all(
            view.kind(named) is Kind.VOTE or named == merge for named in view.by_target(member)
        ):
            found.append(member)
        if len(found) == 3:
            break
    return found


#: texts near the workload's repeated insight, each with one near it but not near the insight, no text of a pair
#: near one of another pair (found by a search over one-word insertions with the default model; checked before use)
REGROUPING_TEXTS = (
    (
        "When all working on geometry problems with intersections, check the boundary cases.",
        "When all all working on geometry problems with intersections, check the boundary cases.",
    ),
    (
        "When both working on geometry problems with intersections, check the boundary cases.",
        "When also both working on geometry problems with intersections, check the boundary cases.",
    ),
    (
        "When carefully working on geometry problems with intersections, check the boundary cases.",
        "When carefully carefully working on geometry problems with intersections, check the boundary cases.",
    ),
)


@dataclass
class _RegroupProbe:
    """What one peer can make a node spend moving adds between experiences of the repeated insight's cluster (a
    late add that takes over adds whose chains end in other experiences, PROTOCOL.md 7.6): seconds, medians of 3."""

    copies: int  # the insight's copies
    split: float  # an add near an add absorbed into the insight (and so in its experience) but not near the insight
    join: float  # then a copy of the insight near that add's experience, which has a modify: it joins the two
    refolded: int  # the operations all of them folded again


def _regrouping_contents(params: NetworkParams) -> dict[str, Experience] | None:
    """The contents of the repeated insight and of the regrouping texts; None if the model does not place them as
    the probes need: each X near the insight, each Y near its X and not near the insight."""
    embedder = embedder_for(params)
    texts = [REPEATED, *(text for pair in REGROUPING_TEXTS for text in pair)]
    contents = {
        text: Experience(text, ("math", "geometry"), 0.5, Embedding(embedder.model_id, embedder.dim, vector))
        for text, vector in zip(texts, (pack_float16(values) for values in embedder.embed(texts)), strict=True)
    }

    def near(a: str, b: str) -> bool:
        threshold = params.near_duplicate_cosine
        return exact_cosine_exceeds(contents[a].embedding.values, contents[b].embedding.values, threshold)

    if not all(near(REPEATED, x) and near(x, y) and not near(REPEATED, y) for x, y in REGROUPING_TEXTS):
        return None
    return contents


def _split_named_by_merge_and_delete(ledger: Ledger, probe: int) -> tuple[float, int] | None:
    """In the largest component, late copies taking adds out of an experience that an applied merge and a delete
    name, which the in-place takeover refuses (it rewinds what it touches, PROTOCOL.md 7.5). Per round, with its own
    texts and keys of this probe, at a clock far above the component's: W (the insight's text; a new experience),
    X near it one clock above, Y near X two above (both absorbed into W), a merge of X and a live experience of
    the component on top of the node's heads, a delete of Y after the merge (it deletes the merged experience), then Y
    again just below W: it takes X over, and Y with it, into the merge. Median seconds of the last copy and median
    operations it folds again; None where the model does not place the texts as this needs. The last probe of a
    run."""
    params = ledger.params
    contents = _regrouping_contents(params)
    if contents is None:
        return None
    component, _ = _largest(ledger)
    view = ledger.view()
    members = [CID(parse_member_key(key)) for key, _ in ledger.store.scan(member_prefix(component))]
    roots = [m for m in members if (record := view.experience(m)) is not None and record.live]
    top = max(view.clock(m) for m in members)

    def signed(number: int, kind: Kind, at: int, text: str | None, parents: tuple = (), **fields: Any) -> Block:
        content = contents[text] if text is not None else None
        late = Operation(kind, "", at, tuple(sorted(parents)), 1_700_000_000, content=content, **fields)
        return sign(late, _probe_key(230, number, probe))

    times, refolded = [], []
    for round_, ((x, y), root) in enumerate(zip(REGROUPING_TEXTS, roots, strict=False)):  # as many as both have
        clock, first = top + 10 * params.absorption_horizon * (round_ + 1), 6 * round_
        w, absorbed_x, absorbed_y = (signed(first + n, Kind.ADD, clock + n, t) for n, t in enumerate((REPEATED, x, y)))
        ledger.ingest([w.data, absorbed_x.data, absorbed_y.data])
        targets = tuple(sorted((absorbed_x.cid, root), key=lambda cid: cid.raw))
        parents, at = ledger.view().parents_and_clock(targets)  # no modify of the root is concurrent with it
        merge = signed(first + 3, Kind.MERGE, at, REPEATED, parents, targets=targets, reason="same insight")
        delete = signed(first + 4, Kind.DELETE, at + 1, None, (merge.cid,), target=absorbed_y.cid, reason="wrong")
        ledger.ingest([merge.data, delete.data])
        copy = signed(first + 5, Kind.ADD, clock - 1, y)
        before = ledger.refolded
        seconds = _timed(ledger, copy.data)
        after = ledger.view()
        status = after.status(absorbed_x.cid)
        if status is not None and status.into == copy.cid and after.resolve(copy.cid) == merge.cid:
            times.append(seconds)
            refolded.append(ledger.refolded - before)
    return (statistics.median(times), int(statistics.median(refolded))) if times else None


def _splits_and_joins(
    ledger: Ledger, probe: int, region: int, clocks: list[int], *, deleting: bool = False
) -> _RegroupProbe | None:
    """Split and join the repeated insight's experience (its copies at `clocks`), each round with its own texts,
    signed by keys of this probe (`probe`: its serial), in a region of the insight's clocks no earlier probe used
    (`region`: how many did); None where the copies span too few clocks or the model does not place the texts as
    this needs.

    Per round, with X near the insight and Y near X but not near the insight, at a clock `a` just above a copy:
    X at `a` (absorbed into a copy within the horizon below it), Y at `a` + 1 (absorbed into X); then Y at `a` - H,
    which sorts before X's F and takes X over, and with it Y: the two leave the insight's experience (a split).
    A modify of that late Y, then X at `a` - H - 1: absorbed into a copy below, it takes the late Y over, and
    the experience Y stood for joins the insight's (a join).

    `deleting`: a delete of Y at `a` + 2 deletes the insight's experience before the split, which moves the delete
    with Y (the insight's experience is live again, its modifies after the delete act on it again); the join then
    brings the delete back (its modifies after the delete are void again). The insight's experience stays deleted:
    the last probe of a run."""
    params = ledger.params
    contents = _regrouping_contents(params)
    if contents is None:
        return None
    horizon = params.absorption_horizon
    copied = set(clocks)
    lowest = clocks[0] + 2 * horizon + 1 + 4 * horizon * region if clocks else 0  # below: earlier probes' regions

    def fits(a: int) -> bool:  # a copy below the late X within the horizon; no copy at the late adds' clocks
        below = any(a - 2 * horizon - 1 <= clock < a - horizon - 1 for clock in clocks)
        return a >= lowest and below and not copied & {a - horizon, a - horizon - 1}

    a = next((clock + 1 for clock in clocks if fits(clock + 1)), None)
    if a is None:
        return None

    def signed(number: int, kind: Kind, clock: int, text: str | None, target: CID | None = None) -> Block:
        content, reason = (contents[text], None) if text is not None else (None, "probe")  # None: a delete
        late = Operation(kind, "", clock, (), 1_700_000_000, content=content, target=target, reason=reason)
        return sign(late, _probe_key(160, number, probe))

    splits, joins, refolded = [], [], 0
    for round_, (x, y) in enumerate(REGROUPING_TEXTS):
        _timed(ledger, signed(6 * round_, Kind.ADD, a, x).data)
        absorbed = signed(6 * round_ + 1, Kind.ADD, a + 1, y)
        _timed(ledger, absorbed.data)
        if deleting:
            _timed(ledger, signed(6 * round_ + 5, Kind.DELETE, a + 2, None, target=absorbed.cid).data)
        before, split = ledger.refolded, signed(6 * round_ + 2, Kind.ADD, a - horizon, y)
        splits.append(_timed(ledger, split.data))
        record = ledger.view().experience(split.cid)
        assert record is not None and record.support == 3, f"the late Y took over X and Y: {record}"
        assert deleting == (record.status is Life.DELETED), f"the delete of Y went with it: {record}"
        _timed(ledger, signed(6 * round_ + 3, Kind.MODIFY, a - horizon + 1, x, target=split.cid).data)
        join = signed(6 * round_ + 4, Kind.ADD, a - horizon - 1, x)
        joins.append(_timed(ledger, join.data))
        refolded += ledger.refolded - before
        status = ledger.view().status(split.cid)
        assert status is not None and status.into == join.cid, f"the late X took the late Y over: {status}"
    return _RegroupProbe(len(clocks), statistics.median(splits), statistics.median(joins), refolded)


def _noting_copies(block: Block, clocks: list[int]) -> bytes:
    """The block's bytes, its clock noted in `clocks` if it adds the workload's repeated insight."""
    if block.op.kind is Kind.ADD and block.op.content is not None and block.op.content.text == REPEATED:
        clocks.append(block.op.clock)
    return block.data


def _copy_at_clock_1(content: Experience, key: AuthorKey, first: tuple[int, bytes], *, before: bool) -> Block:
    """An add of `content` with clock 1 and no parents that sorts before `first` (or after it), found by trying
    timestamps: where a copy sorts among the others at clock 1 is its author's choice, for a signature or two."""
    copies = (sign(Operation(Kind.ADD, "", 1, (), at, content=content), key) for at in itertools.count(1_700_000_000))
    return next(copy for copy in copies if ((1, copy.cid.raw) < first) == before)


def _late_on(ledger: Ledger, kind: str, target: CID, key: AuthorKey) -> bytes:
    """An operation without parents that sorts just after `target`: a modify or delete of it, or a copy of it."""
    view = ledger.view()
    clock, content = view.clock(target) + 1, view.content(target)
    if kind == "modify":
        late = Operation(Kind.MODIFY, "", clock, (), 1_700_000_000, content=content, target=target)
    elif kind == "delete":
        late = Operation(Kind.DELETE, "", clock, (), 1_700_000_000, target=target, reason="proven incorrect")
    else:
        late = Operation(Kind.ADD, "", clock, (), 1_700_000_000, content=content)
    return sign(late, key).data


def _merge(ledger: Ledger, a: CID, b: CID, key: AuthorKey, *, late: bool = False) -> bytes:
    """A merge of `a` and `b` on top of the node's newest heads (it may still be void: §7.4), signed by `key`;
    `late`: with no parents and a clock just above theirs, so it sorts before what came after them."""
    embedder = embedder_for(ledger.params)
    text = "When two insights say the same, keep one and check it against both of their cases."
    vector = pack_float16(embedder.embed([text])[0])
    content = Experience(text, ("bench",), 0.5, Embedding(embedder.model_id, embedder.dim, vector))
    view = ledger.view()
    parents, clock = ((), 1 + max(view.clock(a), view.clock(b))) if late else view.parents_and_clock([a, b])
    merge = Operation(
        Kind.MERGE, "", clock, parents, 1_700_000_000, content=content, targets=tuple(sorted((a, b))), reason="same"
    )
    return sign(merge, key).data


#: one query per this many seconds while ingest runs: a steady client load, the same at every size (back-to-back
#: queries took a share of the 2 cores that changed when search switched from exact to HNSW at 20k live)
QUERY_INTERVAL = 0.05


class _Querier(threading.Thread):
    """Retrieves at a steady pace while ingest runs, recording each query's latency."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(name="bench-queries", daemon=True)
        self.retriever = Retriever(ledger)
        self.latencies: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        for query in itertools.cycle(QUERIES):
            if self.done.is_set():
                return
            start = time.perf_counter()
            self.retriever.retrieve(query, 5)
            elapsed = time.perf_counter() - start
            self.latencies.append(elapsed)
            self.done.wait(max(0.0, QUERY_INTERVAL - elapsed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--checkpoints", default="10000,100000", help="where to measure the late add and memory")
    parser.add_argument("--batch", type=int, default=1000, help="operations per ingest batch (one synced write)")
    parser.add_argument("--model", choices=["default", "hashing"], default="default", help="the network's embedder")
    parser.add_argument(
        "--absorption-horizon", type=int, default=NetworkParams().absorption_horizon, help="the network's (PROTOCOL 5)"
    )
    args = parser.parse_args(argv)
    model = {} if args.model == "default" else {"embedding_model": "feature-hash-v1"}
    params = NetworkParams(**model, absorption_horizon=args.absorption_horizon)
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",") if int(c) <= args.ops} | {args.ops})

    sample = [block.data for block in operations(min(args.ops, 20_000), params, seed=7)]
    validate_before = _validate_rate(sample, params)

    tenth = max(1, args.ops // 10)
    tenths, batch_times, batch_cpus, marks = [], [], [], []
    components: list[_ComponentProbe] = []  # per checkpoint: the largest component's probe
    regroups: list[_RegroupProbe | None] = []  # per checkpoint: splits and joins of the repeated insight
    deleted: _RegroupProbe | None = None  # at the last checkpoint: the same with a delete of what leaves
    merged_late: tuple[float, int, int] | None = None  # then late merges of adds merges took: seconds, refolded, after
    named_split: tuple[float, int] | None = None  # then splits of adds an applied merge and a delete name: the same
    tenths_cpu: list[tuple[float, float]] = []  # per tenth: the writer's and the other threads' CPU per operation
    tenths_threads: list[dict[str, float]] = []  # per tenth: the other threads' CPU per operation, by thread
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = Path(tmp) / "node"
        ledger = Ledger.open(path, params)
        gc.freeze()  # as the daemon does once started: full collections skip the start-up objects
        querier = _Querier(ledger)
        querier.start()
        copies: list[int] = []  # the clocks of the workload's copies of its repeated insight
        stream = (_noting_copies(block, copies) for block in operations(args.ops, params))
        done, ingest_seconds, tenth_start, serial = 0, 0.0, 0.0, 10_000_000
        writer_cpu, cpu_start, cpu_done = 0.0, (_process_cpu(), time.thread_time()), 0
        threads_start = _threads_cpu()
        last_report = time.perf_counter()
        while done < args.ops:
            batch = list(itertools.islice(stream, min(args.batch, args.ops - done)))
            start, start_cpu = time.perf_counter(), time.thread_time()
            receipts = ledger.ingest(batch)
            elapsed, batch_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
            writer_cpu += batch_cpu
            assert all(r.verdict is Verdict.ACCEPTED for r in receipts), receipts[0]
            batch_times.append(elapsed)
            batch_cpus.append(batch_cpu)
            ingest_seconds += elapsed
            done += len(batch)
            if done // tenth > len(tenths) and len(tenths) < 10:
                tenths.append(tenth / (ingest_seconds - tenth_start))
                tenth_start = ingest_seconds
                # the main thread also generates the workload: the other threads are the process less it
                others = _process_cpu() - cpu_start[0] - (time.thread_time() - cpu_start[1])
                tenths_cpu.append((writer_cpu / (done - cpu_done), others / (done - cpu_done)))
                tenths_threads.append(_by_thread(threads_start, others, done - cpu_done))
                writer_cpu, cpu_start, cpu_done = 0.0, (_process_cpu(), time.thread_time()), done
                threads_start = _threads_cpu()
            if checkpoints and done >= checkpoints[0]:
                early, last = _late_vs_last(ledger, params, serial)
                serial += 100
                marks.append((checkpoints.pop(0), early, last, _rss_mb(), ledger.live_count()))
                components.append(_largest_component(ledger, len(components)))
                region = sum(1 for regroup in regroups if regroup is not None)  # the regions of clocks used
                regroups.append(_splits_and_joins(ledger, len(regroups), region, sorted(copies)))
                if not checkpoints:  # last: it leaves the insight's experience deleted
                    region += regroups[-1] is not None
                    deleted = _splits_and_joins(ledger, len(regroups), region, sorted(copies), deleting=True)
                    merged_late = _late_merges_of_taken(ledger, len(components))
                    named_split = _split_named_by_merge_and_delete(ledger, len(components))
            if time.perf_counter() - last_report > 10:
                last_report = time.perf_counter()
                print(
                    f"  ingested {done:,}/{args.ops:,} ({done / ingest_seconds:,.0f} ops/s)",
                    file=sys.stderr,
                    flush=True,
                )
        querier.done.set()
        querier.join()
        ingest_rate = args.ops / ingest_seconds
        # the machine's load changes during a long run: the faster baseline gives the lower (safer) ratio
        validate_after = _validate_rate(sample, params)
        validate_rate = max(validate_before, validate_after)

        again = sample[:20_000]
        ledger_dup = Ledger.open(Path(tmp) / "dup", params)
        ledger_dup.ingest(again)
        start = time.perf_counter()
        for index in range(0, len(again), args.batch):
            ledger_dup.ingest(again[index : index + args.batch])
        duplicate_rate = len(again) / (time.perf_counter() - start)
        ledger_dup.close()

        late = {behind: _late_behind(ledger, params, behind, 20_000_000 + behind) for behind in (0, 10, 100, 1000)}
        ledger.store._db.compact_range()
        ledger.close()
        disk = _disk_bytes(path)
        restarts = []
        for _ in range(5):
            start = time.perf_counter()
            ledger = Ledger.open(path, params)
            restarts.append(time.perf_counter() - start)
            ledger.close()

    print(f"{args.ops:,} operations, batches of {args.batch}, embedder {params.embedding_model}")
    print(
        f"  decode+validate+verify   {validate_rate:>9,.0f} ops/s  (baseline, same kind of operations, one thread; "
        f"{validate_before:,.0f} before ingest, {validate_after:,.0f} after)"
    )
    ratio = ingest_rate / validate_rate
    verdict = "met" if ratio >= 0.25 else "NOT met"
    print(f"  ingest                   {ingest_rate:>9,.0f} ops/s  ratio {ratio:.2f} (target >= 0.25: {verdict})")
    print("  ingest per tenth         " + " ".join(f"{rate:,.0f}" for rate in tenths) + " ops/s")
    for label, column in (("writer", 0), ("other threads", 1)):
        figures = " ".join(f"{cpu[column] * 1e6:,.0f}" for cpu in tenths_cpu)
        print(f"  CPU per op, {label + ',':14} by tenth {figures} us")
    labels = sorted({label for spent in tenths_threads for label in spent}, key=lambda name: name == "ended threads")
    for label in labels:
        figures = " ".join(f"{spent.get(label, 0.0) * 1e6:,.0f}" for spent in tenths_threads)
        print(f"    {label + ':':26} {figures} us")
    if len(tenths) == 10:
        flat = tenths[-1] / tenths[0]
        print(f"  last tenth / first       {flat:>9.2f}        (target >= 0.8: {'met' if flat >= 0.8 else 'NOT met'})")
    for size, early, last, rss, live in marks:
        print(
            f"  at {size:>9,} ops: late add {early * 1000:6.1f} ms, last add {last * 1000:5.1f} ms, "
            f"ratio {early / last:5.1f} (target <= 20); RSS {rss:,.0f} MB; {live:,} live experiences"
        )
    for (size, *_), probe in zip(marks, components, strict=True):
        merged = f"merge of two roots {probe.merge * 1000:,.1f} ms" if probe.merge is not None else "fewer than 6 roots"
        print(
            f"  at {size:>9,} ops: largest component {probe.members:,} experiences: {merged}, "
            f"a copy that sorts first {probe.takeover * 1000:,.1f} ms (takes over {probe.taken:,} adds, "
            f"folds {probe.refolded:,} operations again), "
            f"one after it {probe.after_takeover * 1000:,.1f} ms"
        )
        in_place = ", ".join(f"{kind} {seconds * 1000:,.1f} ms" for kind, seconds in probe.in_place.items())
        pair = f"{probe.late_pair * 1000:,.1f} ms" if probe.late_pair is not None else "too few members"
        print(f"  {'':16} late on early members: {in_place}; a modify and a delete in one batch {pair}")
        if probe.late_merge is not None:
            late_merge = probe.late_merge * 1000
            print(
                f"  {'':16} a merge of two early roots sorting just after them {late_merge:,.1f} ms "
                f"(folds {probe.late_merge_refolded:,} operations again)"
            )
        if probe.reworded is not None:
            reworded = probe.reworded * 1000
            print(
                f"  {'':16} a delete that voids a merge void merges name {reworded:,.1f} ms "
                f"(folds {probe.reworded_refolded:,} operations again)"
            )
        if probe.merge_voided is not None and probe.voided_again is not None:
            voided, again = probe.merge_voided * 1000, probe.voided_again * 1000
            print(f"  {'':16} a delete that voids a merge {voided:,.1f} ms, another once it is void {again:,.1f} ms")
        if probe.voided_in_batch is not None:
            print(
                f"  {'':16} a modify that voids a merge and one of another member in one batch "
                f"{probe.voided_in_batch * 1000:,.1f} ms (folds {probe.voided_in_batch_refolded:,} operations again)"
            )
    for (size, *_), regroup in zip(marks, regroups, strict=True):
        if regroup is None:
            print(f"  at {size:>9,} ops: the repeated insight spans too few clocks to split and join it")
            continue
        split, join = regroup.split * 1000, regroup.join * 1000
        print(
            f"  at {size:>9,} ops: the repeated insight ({regroup.copies:,} copies): a split {split:,.1f} ms, "
            f"a join {join:,.1f} ms (folded {regroup.refolded:,} operations again)"
        )
    if deleted is not None:
        split, join = deleted.split * 1000, deleted.join * 1000
        print(
            f"  {'':16} with a delete of an add that leaves: a split {split:,.1f} ms (the insight live again), "
            f"a join of the deleted experience {join:,.1f} ms (folded {deleted.refolded:,} operations again)"
        )
    if merged_late is not None:
        print(
            f"  at {marks[-1][0]:>9,} ops: a merge of an early add a merge took and a new add, sorting "
            f"just after them, {merged_late[0] * 1000:,.1f} ms (folds {merged_late[1]:,} operations again, of the "
            f"{merged_late[2]:,} of its component sorting after it)"
        )
    if named_split is not None:
        print(
            f"  at {marks[-1][0]:>9,} ops: a late copy taking adds out of an experience an applied merge and a delete "
            f"name, {named_split[0] * 1000:,.1f} ms (folds {named_split[1]:,} operations again)"
        )
    median_batch = statistics.median(batch_times)
    longest = max(range(len(batch_times)), key=batch_times.__getitem__)
    print(
        f"  longest ingest batch     {batch_times[longest] * 1000:>9,.0f} ms   (median {median_batch * 1000:,.0f} ms; "
        f"the writer's CPU in it {batch_cpus[longest] * 1000:,.0f} ms, after {longest * args.batch:,} operations)"
    )
    if querier.latencies:
        lat = sorted(querier.latencies)
        print(
            f"  queries during ingest    {len(lat):>9,}      p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, longest {lat[-1] * 1000:.1f} ms"
        )
    share = ingest_rate / duplicate_rate
    print(f"  duplicates               {duplicate_rate:>9,.0f} ops/s  cost {share:.3f} of a new one's (target < 0.1)")
    print(f"  restart (median of 5)    {statistics.median(restarts) * 1000:>9,.1f} ms     (target < 1000 ms)")
    print(f"  disk                     {disk / args.ops:>9,.0f} bytes/op")
    for behind, seconds in late.items():
        print(f"  late op, {behind:>5} behind     {seconds * 1000:>9,.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
