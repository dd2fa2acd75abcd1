"""Suite-wide set-up: where the tests' ledgers live.

The suite opens thousands of LevelDB ledgers (every hypothesis example of a convergence test opens several) and each
batch they ingest is synced to disk. On a tmpfs, the same real LevelDB, block files and syncs cost a fraction of
the system time a disk's journal costs (test_convergence's voided-merge and copies properties: 15.8 -> 11.0 s of
CPU, 27 -> 19 s of wall time, on a 2-core machine with an ext4 /tmp). So unless the user chose a place
(--basetemp, PYTEST_DEBUG_TEMPROOT or TMPDIR), the temporary directories go to /dev/shm where it exists; those of
passing tests are removed as they pass (`tmp_path_retention_policy = "failed"` in pyproject.toml), so they do not
hold memory.
"""

from __future__ import annotations

import os

import pytest

TMPFS = "/dev/shm"


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or os.environ.get("TMPDIR")
    if not chosen and os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK | os.X_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = TMPFS  # xdist's workers inherit it
