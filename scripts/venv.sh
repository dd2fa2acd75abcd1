# Sourced by scripts/test.sh and scripts/demo.sh: make .venv (Python 3.11 or newer) if it is missing, and install
# the project into it. Usage: project_venv SCRIPT_NAME PIP_TARGET MESSAGE
# (e.g. project_venv scripts/test.sh '.[dev]' "installing the project and its dev tools into .venv").
project_venv() {
  local script=$1 target=$2 message=$3
  local python=${PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "$script: Python 3.11 or newer is required ($("$python" --version 2>&1) found); set PYTHON=" >&2
    exit 2
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv"
    "$python" -m venv .venv
  fi
  echo "$message"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target"
}
