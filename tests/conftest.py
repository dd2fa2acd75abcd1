"""Suite-wide set-up: where the tests' ledgers live.

The suite opens thousands of LevelDB ledgers (every hypothesis example of a convergence test opens several) and each
batch they ingest is synced to disk. On a tmpfs, the same real LevelDB, block files and syncs cost a fraction of
the system time a disk's journal costs (test_convergence's voided-merge and copies properties: 15.8 -> 11.0 s of
CPU, 27 -> 19 s of wall time, on a 2-core machine with an ext4 /tmp). So unless the user chose a place
(--basetemp, PYTEST_DEBUG_TEMPROOT or TMPDIR), the temporary directories go to /dev/shm where it exists with room
to spare; those of passing tests are removed as they pass (`tmp_path_retention_policy = "failed"` in
pyproject.toml), so they do not hold memory.
"""

from __future__ import annotations

import os

import pytest

TMPFS = "/dev/shm"
#: the suite's ledgers hold up to ~1 GB at once (4 workers); a container's /dev/shm is 64 MB, so a tmpfs with less
#: free space than this is not used
TMPFS_MIN_FREE = 4 << 30


def _roomy_tmpfs() -> bool:
    if not (os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK | os.X_OK)):
        return False
    stats = os.statvfs(TMPFS)
    return stats.f_bavail * stats.f_frsize >= TMPFS_MIN_FREE


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or os.environ.get("TMPDIR")
    if not chosen and _roomy_tmpfs():
        os.environ["PYTEST_DEBUG_TEMPROOT"] = TMPFS  # xdist's workers inherit it


#: the files that take longest, longest first (their tests' durations in a whole-suite run, `--durations=150`). With
#: one file a worker (--dist=loadfile) a long file started last is the suite's tail: xdist's own order (files with
#: more tests first) started the convergence properties last. pyproject.toml's `--no-loadscope-reorder` keeps
#: this order: these first, then the others as collected.
LONG_FILES = (
    "test_convergence.py",
    "test_convergence_late.py",
    "test_dso_smollm.py",
    "test_crash.py",
    "test_network.py",
    "test_p2p_hosts.py",
    "test_devnet.py",
    "test_bench_smoke.py",
    "test_interop_js.py",
    "test_p2p_hostile.py",
    "test_daemon.py",
    "test_dso.py",
    "test_local_retrieval.py",
    "test_readme.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: number for number, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: the rest keep their order
