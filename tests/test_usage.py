"""Usage statistics (node/usage.py): counted per serve, kept apart from the consensus state, durable across kill -9."""

from __future__ import annotations

import signal
import threading
from collections import Counter, defaultdict

import plyvel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.cid import CID
from node.usage import MAX_DOMAINS, SERVED_BY, UsageError, UsageStats
from tests.daemons import expledger, init_home, running

IDS = [
    CID.parse(text)
    for text in (
        "bafyreifq7r2uherxem24ty3bsgpnav5eoxltdpwhpdksbvpsg77kdl3axu",
        "bafyreic2yx24j37t2rjrbfg7tnnqrf63vclwbcqlezqotxsapur5v2hmmm",
    )
]
GEOMETRY = "When intersecting lines with segments, check each solution lies on the segment, not its extension."
QUERY = "Where do two lines cross a segment?"

serves = st.lists(
    st.tuples(st.sampled_from(IDS), st.sampled_from(SERVED_BY), st.sampled_from(["a", "b", "c", None])), max_size=40
)


@settings(max_examples=30, deadline=None)
@given(serves)
def test_counts_are_every_serve_and_survive_a_reopen(tmp_path_factory, recorded):
    path = tmp_path_factory.mktemp("usage") / "usage"
    counts, by, domains = Counter(), defaultdict(Counter), defaultdict(Counter)
    stats = UsageStats(path)
    for exp_id, how, domain in recorded:
        stats.record([(exp_id, "own")], how, domain)
        counts[exp_id] += 1
        by[exp_id][how] += 1
        domains[exp_id][domain or "own"] += 1
    stats.close()
    reopened = UsageStats(path)
    try:
        for exp_id in IDS:
            usage = reopened.of(exp_id)
            assert usage.count == counts[exp_id]
            assert usage.to_json()["served_by"] == {how: by[exp_id][how] for how in SERVED_BY}
            expected = sorted(domains[exp_id].items(), key=lambda item: (-item[1], item[0]))
            assert usage.domains_applied == [name for name, _ in expected]
        assert [exp_id for exp_id, _ in reopened.top(5)] == sorted(
            (i for i in IDS if counts[i]), key=lambda i: (-counts[i], i.raw)
        )
    finally:
        reopened.close()


def test_concurrent_serves_are_all_on_disk(tmp_path):
    """Group commit: serves recorded while another thread writes are written by a later write, none lost."""
    stats = UsageStats(tmp_path / "usage")

    def serve(exp_id: CID) -> None:
        for _ in range(50):
            stats.record([(exp_id, "own")], "proxy", None)

    workers = [threading.Thread(target=serve, args=(exp_id,)) for exp_id in IDS * 4]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stats.close()
    reopened = UsageStats(tmp_path / "usage")
    try:
        assert [reopened.of(exp_id).count for exp_id in IDS] == [200, 200]
    finally:
        reopened.close()


def test_a_failed_write_is_kept_for_the_next(tmp_path):
    """A write LevelDB refuses (a full disk) raises, and loses nothing: the next write carries its counts."""

    class RefusesOnce:
        def __init__(self, db: plyvel.DB) -> None:
            self.db, self.refused = db, False

        def write_batch(self, **options: bool) -> plyvel.WriteBatch:
            if not self.refused:
                self.refused = True
                raise plyvel.IOError("IO error: No space left on device")
            return self.db.write_batch(**options)

        def close(self) -> None:
            self.db.close()

    stats = UsageStats(tmp_path / "usage")
    stats._db = RefusesOnce(stats._db)  # the disk, not our code, is what fails
    with pytest.raises(UsageError) as failed:
        stats.record([(IDS[0], "own")], "retrieve", None)
    assert failed.value.code == "usage.write"
    stats.record([(IDS[1], "own")], "retrieve", None)
    stats.close()
    reopened = UsageStats(tmp_path / "usage")
    try:
        assert [reopened.of(exp_id).count for exp_id in IDS] == [1, 1]
    finally:
        reopened.close()


def test_the_domains_kept_are_bounded(tmp_path):
    stats = UsageStats(tmp_path / "usage")
    try:
        for index in range(MAX_DOMAINS + 5):
            stats.record([(IDS[0], "own")], "retrieve", f"d{index:02}")
        stats.record([(IDS[0], "own")], "retrieve", "d00")
        usage = stats.of(IDS[0])
        assert usage.count == MAX_DOMAINS + 6 and len(usage.domains_applied) == MAX_DOMAINS
        assert usage.domains_applied[0] == "d00"  # the most used first
    finally:
        stats.close()


def test_serving_counts_survive_kill_9_and_never_touch_the_state_root(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    with running(home) as daemon:
        exp_id = daemon.call("add", {"text": GEOMETRY, "domain": "math.geometry", "confidence": 0.8})["cid"]
        root = daemon.call("state_root")
        assert daemon.call("get", {"id": exp_id})["metadata"]["usage_count"] == 0
        hits = daemon.call("retrieve", {"query": QUERY, "domain": "math"})["hits"]
        assert [hit["id"] for hit in hits] == [exp_id]
        assert GEOMETRY in daemon.call("context", {"query": QUERY})["prompt"]  # served for its own domain
        daemon.call("coverage", {"queries": [QUERY]})  # a measure, not a serve
        served = 2
        shown = daemon.call("get", {"id": exp_id})["metadata"]
        assert shown["usage_count"] == served and sorted(shown["domains_applied"]) == ["math", "math.geometry"]
        listed = daemon.call("list", {})["experiences"]
        assert [(e["id"], e["usage_count"]) for e in listed] == [(exp_id, served)]
        assert daemon.call("state_root") == root  # the counts are not consensus state
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
    with running(home) as daemon:
        usage = daemon.call("usage", {"id": exp_id})["experiences"][0]
        assert usage["usage_count"] == served and sorted(usage["domains_applied"]) == ["math", "math.geometry"]
        assert daemon.call("state_root") == root
        top = expledger("top", home=home)
        assert top.returncode == 0, top.stderr
        assert top.stdout.splitlines()[0].split() == ["SERVED", "ID", "DOMAIN", "SERVED", "FOR", "TEXT"]
        assert top.stdout.splitlines()[1].split()[:3] == [str(served), exp_id, "math.geometry"]
