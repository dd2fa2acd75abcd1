"""`expledger audit` on a stopped node's data directory and the RPC `audit` of a running daemon: the library checked
against the reference fold (ledger/audit.py), and a record, a vote count or an absorbed list altered in LevelDB
named by the experience it belongs to."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from ledger.ledger import DB_DIR, Ledger
from ledger.records import ExperienceRecord, Life
from ledger.store import Store
from ledger.tables import experience_key
from tests import factories as f
from tests.daemons import expledger, init_home, running
from tests.differential import acting_on
from tests.ledgers import random_history

MATCH = re.compile(r"library matches the reference fold \((\d+) operations, (\d+) experiences\)\n")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home on the test embedder's network whose data directory holds a history with copies, merges and votes."""
    root = tmp_path_factory.mktemp("audit")
    network = root / "network.json"
    network.write_text(f.PARAMS.to_json())
    init_home(root / "home", network=network)
    rng = random.Random(7)
    history = random_history(rng, 120)
    blocks = history + acting_on(rng, history, 30, 20)
    ledger = Ledger.open(root / "home" / "data", f.PARAMS)
    try:
        for start in range(0, len(blocks), 25):
            ledger.ingest([block.data for block in blocks[start : start + 25]])
    finally:
        ledger.close()
    return root / "home"


def test_a_stopped_nodes_data_directory_matches_the_reference_fold(home: Path) -> None:
    result = expledger("audit", "--ledger", str(home / "data"))
    assert result.returncode == 0, result.stderr
    found = MATCH.fullmatch(result.stdout)
    assert found is not None, result.stdout
    assert int(found[1]) == 150 and int(found[2]) > 0
    assert "audit: comparing" in result.stderr  # progress, one line at a time when stderr is not a terminal


def test_a_running_node_audits_itself_and_refuses_an_offline_audit_of_its_directory(home: Path) -> None:
    with running(home) as daemon:
        answer = daemon.call("audit")
        assert answer["matches"] is True and answer["difference"] is None
        assert answer["operations"] == 150 and MATCH.fullmatch(answer["message"] + "\n")
        daemon.call("add", {"text": "When a proof by induction stalls, strengthen the hypothesis.",
                            "domain": "math.proofs", "confidence": 0.8})  # fmt: skip
        by_cli = expledger("audit", home=home)
        assert by_cli.returncode == 0, by_cli.stderr
        assert MATCH.fullmatch(by_cli.stdout) and "(151 operations" in by_cli.stdout
        held = expledger("audit", "--ledger", str(home / "data"))
        assert held.returncode == 2 and "ledger.in_use" in held.stderr and "--home" in held.stderr


def _support(record: ExperienceRecord) -> bytes:
    record.support += 1
    return record.pack()


def _vote_count(record: ExperienceRecord) -> bytes:
    record.up += 1
    return record.pack()


def _absorbed_list(record: ExperienceRecord) -> bytes:
    record.absorbed.pop()
    return record.pack()


def _damaged(record: ExperienceRecord) -> bytes:
    return record.pack()[:-3]


#: ways to alter one stored record (each gives the bytes stored in its place): its support, its vote count, its list
#: of absorbed adds, its bytes cut short
ALTERATIONS = [_support, _vote_count, _absorbed_list, _damaged]


@pytest.mark.parametrize("alter", ALTERATIONS, ids=["record", "vote_count", "absorbed", "damaged"])
def test_a_record_altered_in_leveldb_is_named_with_how_it_differs(home: Path, tmp_path: Path, alter) -> None:
    """On a copy of the data directory, one record altered: the audit exits 1 naming that experience."""
    copy = tmp_path / "data"
    shutil.copytree(home / "data", copy)
    store = Store(copy / DB_DIR, create=False)
    try:
        chosen = next(
            ExperienceRecord.unpack(raw)
            for _, raw in store.scan(experience_key(b""))
            if (record := ExperienceRecord.unpack(raw)).status is not Life.ALIAS and record.absorbed
        )
        store.write({experience_key(chosen.id.raw): alter(chosen)})
    finally:
        store.close()
    result = expledger("--network", str(home / "network.json"), "audit", "--ledger", str(copy))
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"library differs from the reference fold at experience {chosen.id}: ")
