"""Issue 54's disk-full sequence on a real full disk: a daemon on a 40 MB tmpfs the test mounts (root only; skipped
with the reason elsewhere). Fill the disk while adding, free it, keep adding, kill -9 or stop gracefully, start:
every acknowledged add is there (bench/bench_diskfull.py runs the same sequence 5 times for bench/RESULTS.md)."""

from __future__ import annotations

import signal

import pytest

from bench.bench_diskfull import can_mount, one_run
from tests import factories as f
from tests.daemons import init_home, running

AFTER = 50  # adds once space is freed


@pytest.fixture(scope="module")
def mountable() -> None:
    why = can_mount()
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize(
    ("stop", "min_free_mb", "headroom_mb", "state"),
    [
        ("kill -9", 0, 3, "stopped"),  # no reserve: a write meets the full disk, the store recovers once it is freed
        ("graceful", 8, 12, "reserve"),  # the reserve refuses writes before the disk is full
    ],
)
def test_a_full_disk_loses_no_acknowledged_add_and_the_node_starts_again(
    tmp_path, mountable, stop, min_free_mb, headroom_mb, state
):
    run = one_run(tmp_path, stop, 40, min_free_mb, headroom_mb, AFTER)
    assert run.before > 0 and run.after == AFTER and run.refused > 1
    assert run.state_when_full == state
    assert "store takes no writes" in run.message or "the write failed (no space left on device)" in run.message
    assert "/" not in run.message and "b'" not in run.message  # the condition, not a path or a repr
    assert run.exit_status == (0 if stop == "graceful" else -signal.SIGKILL)
    assert run.restart == "ok"
    assert run.present == run.acknowledged


def test_under_the_reserve_a_daemon_refuses_adds_with_the_condition_and_reads_go_on(tmp_path):
    """Runs everywhere: a reserve of 1 PiB is more than any test machine has free."""
    home = tmp_path / "home"
    init_home(home, retrieval_model="network")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("min_free_mb = 512", f"min_free_mb = {1 << 30}"))
    with running(home) as daemon:
        store = daemon.call("status")["store"]
        assert (store["state"], store["writable"], store["min_free_bytes"]) == ("reserve", False, 1 << 50)
        refused = daemon.request("add", {"text": f.SEED_TEXTS[0], "domain": "math", "confidence": 0.9})["error"]
        assert refused["code"] == -32006 and refused["data"]["code"] == "store.unwritable"
        assert refused["data"]["min_free_bytes"] == 1 << 50 and refused["data"]["free_bytes"] < 1 << 50
        assert "under the reserve" in refused["message"] and "/" not in refused["message"]
        assert daemon.call("status")["log_size"] == 0  # reads answer; nothing was written
