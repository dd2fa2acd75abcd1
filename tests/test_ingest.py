"""The ingest pipeline's receipts, reads from other threads while one writer ingests, and heads."""

from __future__ import annotations

import dataclasses
import random
import threading

from ledger.cid import CID
from ledger.ingest import Source, Submission, Verdict
from ledger.merkle import root_of_leaf_hashes
from ledger.ops import Kind, decode_block
from ledger.proofs import verify_inclusion
from ledger.records import Outcome
from ledger.stateroot import StateRoot
from tests import factories as f
from tests.ledgers import open_ledger, random_history

TEXT_B = "When intersecting lines with segments, check each solution lies on the segment."


def test_receipts_say_accepted_ignored_or_rejected_with_the_source(tmp_path):
    ledger = open_ledger(tmp_path / "node")
    add = f.add()
    peer = Source("gossip", "12D3KooWPeer")
    broken = bytearray(add.data)
    broken[-1] ^= 1
    first = ledger.ingest([Submission(add.data, peer), Submission(add.data, Source("rpc", "cli")), bytes(broken)])
    assert [(r.verdict, r.outcome) for r in first] == [
        (Verdict.ACCEPTED, "applied"),
        (Verdict.IGNORED, "duplicate"),
        (Verdict.REJECTED, "invalid"),
    ]
    assert first[0].source == peer and first[1].source.kind == "rpc" and first[1].repeated
    assert first[2].code == "signature.invalid" and first[2].source.kind == "local"
    again = ledger.submit(add.data)
    assert (again.verdict, again.repeated, again.status.outcome) == (Verdict.IGNORED, False, Outcome.APPLIED)
    ledger.close()


def test_a_large_batch_rejects_exactly_the_items_whose_signature_is_broken(tmp_path):
    """Signatures of a large batch are checked on worker threads: each verdict still lands on its own item."""
    ledger = open_ledger(tmp_path / "node")
    blocks = [f.add(f"When checking signature {_letters(i)}, verify each one alone.") for i in range(600)]
    items = [block.data for block in blocks]
    broken = {7, 300, 599}
    for index in broken:
        flipped = bytearray(items[index])
        flipped[-1] ^= 1
        items[index] = bytes(flipped)
    # the embedding check runs while the signatures are checked: a forged item is reported as forged
    misplaced = {10: False, 11: True}  # index -> its signature is broken too
    for index, forged in misplaced.items():
        wrong = dataclasses.replace(blocks[index].op.content, embedding=f.embedding("an unrelated text"))
        items[index] = f.with_fields(blocks[index], content=wrong).data
        if forged:
            items[index] = items[index][:-1] + bytes([items[index][-1] ^ 1])
    receipts = ledger.ingest(items)
    rejected = {index for index, receipt in enumerate(receipts) if receipt.verdict is Verdict.REJECTED}
    assert rejected == broken | set(misplaced)
    assert {receipts[index].code for index in broken} == {"signature.invalid"}
    assert (receipts[10].code, receipts[11].code) == ("embedding.inconsistent", "signature.invalid")
    ledger.close()


def _letters(number: int) -> str:
    return "".join(chr(ord("a") + int(digit)) for digit in str(number))


def test_a_repeated_invalid_item_is_rejected_both_times(tmp_path):
    ledger = open_ledger(tmp_path / "node")
    receipts = ledger.ingest([b"\xa1", b"\xa1"])
    assert [r.verdict for r in receipts] == [Verdict.REJECTED, Verdict.REJECTED]
    assert receipts[1].errors == receipts[0].errors
    ledger.close()


def test_a_claimed_cid_is_checked_before_anything_is_decoded(tmp_path):
    ledger = open_ledger(tmp_path / "node")
    add, other = f.add(), f.add(f.SEED_TEXTS[1])
    (receipt,) = ledger.ingest([Submission(b"\xff not cbor at all", claimed=other.cid)])
    assert receipt.code == "cid.mismatch"
    assert ledger.ingest([add.data], [add.cid])[0].verdict is Verdict.ACCEPTED
    ledger.close()


def test_a_duplicate_is_ignored_without_checking_its_signature(tmp_path, monkeypatch):
    import ledger.ingest as ingest

    ledger = open_ledger(tmp_path / "node")
    add = f.add()
    ledger.submit(add.data)
    calls = []
    monkeypatch.setattr(ingest, "examine", lambda *args: calls.append(args) or (None, []))
    assert ledger.submit(add.data).verdict is Verdict.IGNORED
    assert calls == []
    ledger.close()


def test_heads_are_the_applied_operations_no_applied_operation_names_as_parent(tmp_path):
    blocks = random_history(random.Random(4), 60)
    ledger = open_ledger(tmp_path / "node")
    rng = random.Random(5)
    rng.shuffle(blocks)
    for start in range(0, len(blocks), 7):
        ledger.ingest([b.data for b in blocks[start : start + 7]])
        view = ledger.view()
        applied = {b.cid for b in blocks if view.status(b.cid) and view.status(b.cid).outcome is not Outcome.PENDING}
        named = {parent for b in blocks if b.cid in applied for parent in b.op.parents}
        clock = {b.cid: b.op.clock for b in blocks}
        newest_first = sorted(applied - named, key=lambda cid: (-clock[cid], cid.raw))
        assert view.heads() == newest_first
        assert view.heads(3) == newest_first[:3]
        assert ledger.pending_count() == len(view.pending())
    ledger.close()


def test_an_operation_built_on_the_heads_takes_effect_and_resolves_a_conflict(tmp_path):
    ledger = open_ledger(tmp_path / "node")
    add = f.add()
    ledger.submit(add.data)
    concurrent = [
        f.signed(f.operation(Kind.MODIFY, clock=2, parents=(add.cid,), target=add.cid, content=f.content(text)), key)
        for text, key in ((TEXT_B, f.author(2)), (f.SEED_TEXTS[2], f.author(3)))
    ]
    ledger.ingest([b.data for b in concurrent])
    assert ledger.view().experience(add.cid).conflicted
    parents, clock = ledger.view().parents_and_clock([add.cid])
    resolving = f.signed(
        f.operation(Kind.MODIFY, clock=clock, parents=parents, target=add.cid, content=f.content(f.SEED_TEXTS[3]))
    )
    assert ledger.submit(resolving.data).outcome == "applied"
    record = ledger.view().experience(add.cid)
    assert not record.conflicted and record.version == resolving.cid
    parents, clock = ledger.view().parents_and_clock([add.cid])
    vote = f.signed(f.operation(Kind.VOTE, clock=clock, parents=parents, target=add.cid, vote=1), f.author(4))
    assert ledger.submit(vote.data).outcome == "applied" and ledger.view().experience(add.cid).up == 1
    ledger.close()


def test_views_read_from_another_thread_are_never_torn(tmp_path):
    """While one writer ingests, every view's tree head, log, state root and records describe one moment."""
    blocks = random_history(random.Random(8), 400)
    ledger = open_ledger(tmp_path / "node")
    done = threading.Event()
    checked: list[int] = []
    failures: list[str] = []

    def read() -> None:
        rng = random.Random(9)
        while not done.is_set() or not checked:
            view = ledger.view()
            head = view.tree_head()
            logged = [view.logged(position) for position in range(view.log_size)]
            leaves = [view.merkle.leaf_hash(position) for position in range(view.log_size)]
            root = StateRoot()
            for cid in logged:
                root.add(cid.raw)
            if head.size != len(logged) or head.root != root_of_leaf_hashes(leaves) or not head.verify():
                failures.append(f"tree head {head.size} does not describe its log")
            if root.digest() != view.state_root():
                failures.append(f"state root does not match the {len(logged)} logged operations")
            if logged:
                position = rng.randrange(len(logged))
                path = view.merkle.inclusion_path(position, head.size)
                if not verify_inclusion(leaves[position], position, head.size, path, head.root):
                    failures.append(f"inclusion proof of {position} fails at size {head.size}")
            for exp_id in view.live_ids():
                record = view.experience(exp_id)
                if record is None or not record.live or view.content(record.version).text is None:
                    failures.append(f"live id {exp_id} has no live record")
            checked.append(head.size)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for start in range(0, len(blocks), 10):
            ledger.ingest([b.data for b in blocks[start : start + 10]])
    finally:
        done.set()
        reader.join()
    assert failures == []
    assert len(set(checked)) > 3, "the reader saw the log at several sizes"
    assert ledger.view().log_size == len({b.cid for b in blocks})
    ledger.close()


def test_views_are_cheap_and_stay_at_their_moment(tmp_path):
    ledger = open_ledger(tmp_path / "node")
    add = f.add()
    before = ledger.view()
    ledger.submit(add.data)
    assert before.log_size == 0 and not before.has(add.cid) and before.experience(add.cid) is None
    assert ledger.view().has(add.cid) and ledger.view().log_size == 1
    assert isinstance(ledger.view().heads()[0], CID)
    ledger.close()


def test_the_pending_count_follows_dependencies_across_restarts(tmp_path):
    add = f.add()
    vote = f.signed(f.operation(Kind.VOTE, clock=2, parents=(add.cid,), target=add.cid, vote=1), f.author(2))
    ledger = open_ledger(tmp_path / "node")
    ledger.submit(vote.data)
    assert ledger.pending_count() == 1 == len(ledger.view().pending())
    ledger.close()
    ledger = open_ledger(tmp_path / "node")
    assert ledger.pending_count() == 1
    ledger.submit(add.data)
    assert ledger.pending_count() == 0 == len(ledger.view().pending())
    ledger.close()


def test_a_batch_stores_parents_first_and_a_child_without_its_parent_waits_as_pending(tmp_path):
    """Within a batch each operation is stored after its dependencies, whatever the order they came in (one stored
    ahead of a parent waited as pending, and so did all that descends from it); across batches a child without its
    parent waits, counted in `waited`, does not keep later operations from applying, and applies when it comes."""
    blocks = random_history(random.Random(8), 120)  # some clocks are too low: clock order is not causal order
    shuffled = [block.data for block in blocks]
    random.Random(9).shuffle(shuffled)
    ordered, mixed = open_ledger(tmp_path / "ordered"), open_ledger(tmp_path / "mixed")
    ordered.ingest([block.data for block in blocks])
    mixed.ingest(shuffled)
    assert (ordered.waited, mixed.waited) == (0, 0)
    assert mixed.view().state_root() == ordered.view().state_root()
    positions = {cid: index for index, cid in enumerate(mixed.view().logged_cids(0, len(blocks)))}
    assert all(positions[dep.raw] < positions[block.cid.raw] for block in blocks for dep in block.op.dependencies)

    late = f.add(TEXT_B)
    child = f.signed(f.operation(Kind.VOTE, clock=2, parents=(late.cid,), target=late.cid, vote=1), f.author(3))
    ordered.ingest([child.data])
    other = f.signed(f.operation(Kind.VOTE, clock=99, parents=(blocks[-1].cid,), target=late.cid, vote=-1))
    assert ordered.submit(other.data).outcome == "pending" and ordered.waited == 2
    independent = f.add("When the parent is late, apply what does not wait for it.")
    assert ordered.submit(independent.data).outcome == "applied"
    released: list[CID] = []
    ordered.ingest([late.data], released=released)
    assert set(released) == {child.cid, other.cid} and ordered.pending_count() == 0
    ordered.close()
    mixed.close()


def test_a_submission_decoded_by_the_network_gets_every_check_but_the_decode(tmp_path):
    """p2p decodes what it receives (to see dependencies) and hands the Blocks over: each is checked as its bytes
    would be, a broken signature and a broken rule included, and the verdicts are the same."""
    good = f.add()
    forged = bytearray(f.add(TEXT_B).data)
    forged[-1] ^= 1
    rule = f.add("Always check your work carefully before answering.")  # no context clause
    items = [good.data, bytes(forged), rule.data]
    peer = Source("sync", "12D3KooWPeer")
    first, second = open_ledger(tmp_path / "bytes"), open_ledger(tmp_path / "blocks")
    as_bytes = first.ingest([Submission(data, peer) for data in items])
    as_blocks = second.ingest([Submission.of(decode_block(data), peer) for data in items])
    first.close()
    second.close()
    verdicts = [(r.verdict, r.code) for r in as_bytes]
    assert verdicts == [(r.verdict, r.code) for r in as_blocks]
    assert {r.source for r in as_bytes + as_blocks} == {peer}
    rejected = Verdict.REJECTED
    assert verdicts == [(Verdict.ACCEPTED, None), (rejected, "signature.invalid"), (rejected, "text.structure")]
