"""The import graph of the product's packages: imports point one way (devnet -> node -> p2p -> ledger), with no
circle, read from the source (every import statement counts, those for type checking and inside functions too)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ledger", "p2p", "node", "devnet")
#: what each package may import of the others and of the tools beside them
ALLOWED = {"ledger": set(), "p2p": {"ledger"}, "node": {"p2p", "ledger"}, "devnet": {"node", "p2p", "ledger"}}
OUTSIDE = {"bench", "tests", "scripts"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of this repository `path` (module `name`) imports: `from a.b import c` imports a.b.c if that is
    a module, else a.b."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {module for module in found if module.split(".")[0] in {*PACKAGES, *OUTSIDE}}


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, set(modules)) & set(modules) - {name} for name, path in modules.items()}


def test_packages_import_one_way():
    """No package imports one above it (node never imports devnet: `expledger devnet` is an entry point of devnet)
    and none imports the benchmarks or the tests."""
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        package = name.split(".")[0]
        for module in _imports(path, name, set(modules)):
            top = module.split(".")[0]
            if top != package and (top in OUTSIDE or top not in ALLOWED[package]):
                wrong.append(f"{name} imports {module}")
    assert wrong == []


def test_no_import_circle():
    """No module reaches itself through imports (ledger.keyfilter reads ledger.store's tables; the store names the
    filter through a protocol of its own)."""
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for child in sorted(graph[module]):
            if state.get(child) == 1:
                circles.append(" -> ".join([*path[path.index(child) :], child]))
            elif child not in state:
                visit(child, [*path, child])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_graph_sees_imports():
    """The checks above read real edges, absolute and within a package."""
    graph = _graph()
    assert "ledger.store" in graph["ledger.keyfilter"]
    assert {"ledger.library.schema", "ledger.library.batch"} <= graph["ledger.library.fold"]
    assert "p2p" in {module.split(".")[0] for module in graph["node.daemon"]}


#: what a command that only talks to a daemon, or only starts one, must not load
HEAVY = {"numpy", "plyvel", "multiformats", "ledger.ledger", "node.daemon", "trio", "libp2p"}


def _command_in_a_new_process(argv: list[str]) -> tuple[int, list[str], str]:
    """`expledger ARGV` run by node.cli.main in a fresh interpreter: its exit status, the HEAVY modules it loaded,
    its stderr."""
    script = (
        "import json, sys, node.cli\n"
        f"status = node.cli.main({argv!r})\n"
        f"print(json.dumps([status, sorted({HEAVY!r} & set(sys.modules))]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    status, loaded = json.loads(done.stdout.splitlines()[-1])
    return status, loaded, done.stderr


def test_a_client_command_loads_neither_numpy_nor_the_storage_stack(tmp_path):
    """`expledger status` and its like start a process per call, in scripts and loops: what only operations, the
    daemon and the ledger's storage need (numpy, LevelDB, multiformats, the server) is imported where they are
    used, so a client command costs ~0.1 s of CPU (node/cli.py). Any import that pulls them in again fails here."""
    from tests.daemons import init_home

    init_home(tmp_path / "home")
    _, loaded, stderr = _command_in_a_new_process(["status", "--home", str(tmp_path / "home")])
    assert "no daemon" in stderr, stderr  # the command read the home and called its RPC address
    assert loaded == []


def test_a_detaching_start_loads_nothing_of_the_daemon_it_starts(tmp_path):
    """`expledger daemon --detach` (and `devnet up`, once per node) only starts the daemon and waits for its
    readiness line: it costs ~0.1 s of CPU, not the ~0.6 s of importing the daemon's stack a second time."""
    from tests.daemons import init_home

    home = tmp_path / "home"
    init_home(home)
    (home / "config.toml").write_text("[rpc]\nlisten = 8645\n")  # the daemon refuses it: nothing to stop
    status, loaded, stderr = _command_in_a_new_process(["daemon", "--detach", "--home", str(home)])
    assert "config.type" in stderr and "[rpc] listen" in stderr, stderr  # the daemon's refusal
    assert (status, loaded) == (2, [])


def test_a_devnet_command_loads_neither_numpy_nor_the_storage_stack(tmp_path):
    """`expledger devnet status` and its like are client commands too: only `devnet demo` builds operations."""
    _, loaded, stderr = _command_in_a_new_process(["devnet", "status", "--dir", str(tmp_path / "none")])
    assert "no devnet here" in stderr, stderr
    assert loaded == []
