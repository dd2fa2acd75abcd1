"""The vector index holds exactly the live experiences: after random histories, restarts and lost files."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.index import INDEX_FILE, META_FILE
from tests.ledgers import open_ledger, random_history


def _live(ledger) -> set[bytes]:
    return {cid.raw for cid in ledger.view().live_ids()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 30))
def test_index_equals_live_experiences_through_restarts_and_lost_files(tmp_path_factory, seed, size):
    rng = random.Random(seed)
    blocks = random_history(rng, size)
    rng.shuffle(blocks)
    path = tmp_path_factory.mktemp("node")
    ledger = open_ledger(path)
    for start in range(0, len(blocks), 4):
        ledger.ingest([b.data for b in blocks[start : start + 4]])
        assert ledger.indexed() == _live(ledger)
    live = _live(ledger)
    ledger.close()

    ledger = open_ledger(path)  # saved index, reloaded
    assert ledger.index_status == "loaded" and ledger.indexed() == live
    ledger.close()

    (path / INDEX_FILE).unlink()  # lost index: rebuilt
    ledger = open_ledger(path)
    assert ledger.index_status == "missing" and ledger.indexed() == live
    ledger.close()


def test_a_stale_index_is_rebuilt(tmp_path):
    blocks = random_history(random.Random(5), 20)
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([b.data for b in blocks[:10]])
    ledger.close()
    saved = ((tmp_path / "n" / INDEX_FILE).read_bytes(), (tmp_path / "n" / META_FILE).read_bytes())
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([b.data for b in blocks[10:]])
    live = _live(ledger)
    ledger.close()
    (tmp_path / "n" / INDEX_FILE).write_bytes(saved[0])  # as if the node died before saving the newer index
    (tmp_path / "n" / META_FILE).write_bytes(saved[1])
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status.startswith("stale") and ledger.indexed() == live
    ledger.close()


def test_a_damaged_index_is_rebuilt(tmp_path):
    ledger = open_ledger(tmp_path / "n")
    ledger.ingest([b.data for b in random_history(random.Random(6), 15)])
    live = _live(ledger)
    ledger.close()
    (tmp_path / "n" / INDEX_FILE).write_bytes(b"\x00garbage" * 10)
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status.startswith(("unreadable", "corrupt")) and ledger.indexed() == live
    ledger.close()
    (tmp_path / "n" / META_FILE).write_bytes(b"\xff\xfe")
    ledger = open_ledger(tmp_path / "n")
    assert ledger.index_status.startswith("unreadable") and ledger.indexed() == live
    ledger.close()
