"""`expledger`: the command line. A node (`init`, `daemon`), its RPC client (`status`, `add`, `get`, ...),
and offline tools (`keygen`, `op new`, `op inspect`, `audit --ledger`).

Every failure is one line on stderr, `expledger: error: <code>: <message>` (at times followed by an
`expledger: hint: …` line), with a stable exit status:
0 success (or a valid operation), 1 an invalid operation or an error the node answered, 2 bad
arguments or unusable input, 3 no daemon answers on the home.

A client command is a process start per call, in scripts and loops: what only the `op` commands, `daemon` and
`audit` need (validation, the embedder and numpy, the server stack) is imported inside them, and other packages'
commands are looked up only for a name that is not the node's own, so `expledger status` starts in ~0.1 s of CPU
rather than ~0.5 s.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ledger.cid import CID, CIDError
from ledger.errors import LedgerError
from ledger.keys import AuthorKey
from ledger.ops import Block, Kind, Operation, sign
from ledger.params import NetworkParams
from node import client
from node.config import HOME_ENV, NETWORK_FILE, default_home
from node.dso import cli as dso_cli
from node.home import Home

if TYPE_CHECKING:
    from ledger.audit import AuditResult

EXIT_INVALID = 1
EXIT_USAGE = 2
#: seconds `audit` waits for a running node's answer: it folds the whole log again (~40 s per 100k operations)
AUDIT_TIMEOUT = 3600.0
#: seconds between the progress lines `audit --ledger` writes when stderr is not a terminal
AUDIT_PROGRESS_SECONDS = 5.0

#: flags that carry text into an operation: argv holds raw bytes, and Python hands bytes that are
#: not UTF-8 over as lone surrogates (U+DC80-U+DCFF), which no operation can carry
_TEXT_FLAGS = ("text", "domain", "reason", "source", "example")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTENT_FLAGS = ("json", "text", "domain", "confidence", "example", "source")
#: the flags each kind takes besides the common ones (--key, --parents, --clock, --created, --out)
_KIND_FLAGS: dict[Kind, tuple[str, ...]] = {
    Kind.ADD: _CONTENT_FLAGS,
    Kind.MODIFY: ("target", *_CONTENT_FLAGS),
    Kind.DELETE: ("target", "reason"),
    Kind.MERGE: ("targets", "reason", *_CONTENT_FLAGS),
    Kind.VOTE: ("target", "value"),
}
#: kinds whose CID names an experience, so modify, delete, vote and merge may target them (PROTOCOL §7.4)
_EXPERIENCE_KINDS = (Kind.ADD, Kind.MERGE)
#: printable ASCII and whitespace: an operation's first byte (a CBOR map header, 0xa0-0xbf) never is,
#: so a file of such text can only be hex
_TEXT_BYTES = re.compile(rb"[\t\n\r\x20-\x7e]*")


class UsageError(LedgerError):
    """A command-line argument or input file that cannot be used; exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse reporting its errors like every other error: one line with a code, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError("args.invalid", message)


def _emit(text: str, stream: TextIO | None = None) -> None:
    """Write one line. A reader that stops early (`| head`) ends the output quietly, not the command:
    the exit status stays the verdict, whether or not the reader had gone before the write."""
    stream = stream or sys.stdout
    try:
        stream.write(text + "\n")
        stream.flush()
    except BrokenPipeError:
        # Python's documented recipe: point the stream at /dev/null so the flush at exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def _read_bounded(path: str, limit: int, where: str) -> bytes:
    """At most `limit` bytes of a file: one byte more is read to tell a file that is too large, never the rest."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UsageError("input.read", f"{where}: cannot read ({exc.strerror})") from None
    if len(data) > limit:
        raise UsageError("input.size", f"{where}: larger than {limit} bytes; refusing to read it")
    return data


def _hex_digits(text: str, where: str) -> bytes:
    """Hex → bytes, saying why text that looks like hex is refused instead of passing it on as raw bytes."""
    digits = "".join(text.split())
    if not digits:
        raise UsageError("input.empty", f"{where}: is empty")
    if digits[:2] in ("0x", "0X"):
        raise UsageError("input.hex", f"{where}: looks like hex with a 0x prefix; give the digits alone, without 0x")
    not_hex = re.search("[^0-9a-fA-F]", digits)
    if not_hex:
        raise UsageError(
            "input.hex",
            f"{where}: holds text that is not hex ({not_hex.group()!r} is not a hex digit); "
            "an operation is raw DAG-CBOR or its hex",
        )
    if len(digits) % 2:
        raise UsageError(
            "input.hex",
            f"{where}: looks like hex but has an odd number of digits ({len(digits)}); "
            "each byte is two digits: is it cut short?",
        )
    return bytes.fromhex(digits)


def _operation_file(path: str, params: NetworkParams, where: str) -> bytes:
    """A file holding an operation as raw DAG-CBOR or as hex (whitespace allowed), read with a bound."""
    limit = 3 * params.max_op_bytes  # hex takes two digits a byte; room for spaces or line breaks
    data = _read_bounded(path, limit, where)
    if not data:
        raise UsageError("input.empty", f"{where}: is empty")
    if _TEXT_BYTES.fullmatch(data):
        return _hex_digits(data.decode("ascii"), where)
    return data


def _inspected_bytes(source: str, params: NetworkParams) -> bytes:
    """`op inspect`'s argument: a file (raw or hex DAG-CBOR), or hex given directly."""
    if os.path.exists(source):
        return _operation_file(source, params, source)
    shown = repr(source[:60])
    if re.search("[^0-9a-fA-FxX\\s]", source):
        raise UsageError("input.source", f"{shown} is neither a readable file nor hex")
    return _hex_digits(source, f"{shown} (no such file, so read as hex)")


@dataclass(frozen=True, slots=True)
class _Link:
    """An operation named on the command line, by CID or by its file; from a file its clock and kind are known."""

    cid: CID
    flag: str
    name: str
    clock: int | None = None
    kind: Kind | None = None


def _links(text: str | None, flag: str, params: NetworkParams) -> list[_Link]:
    """Comma-separated operation files or CIDs. An existing path is read as an operation file."""
    return [_link(part.strip(), flag, params) for part in (text or "").split(",") if part.strip()]


def _link(item: str, flag: str, params: NetworkParams) -> _Link:
    from ledger.validation import examine

    if os.path.exists(item):
        where = f"{flag} {item}"
        block, errors = examine(_operation_file(item, params, where), params)
        if errors or block is None:
            raise UsageError("input.operation", f"{where}: not a valid operation ({errors[0]})")
        return _Link(block.cid, flag, item, block.op.clock, block.op.kind)
    try:
        return _Link(CID.parse(item, field=flag), flag, item)
    except CIDError:
        raise UsageError("args.link", f"{flag}: {item[:80]!r} is neither an operation file nor a CID") from None


def _check_target(link: _Link) -> _Link:
    if link.kind is not None and link.kind not in _EXPERIENCE_KINDS:
        raise UsageError(
            "target.not_experience",
            f"{link.flag} {link.name}: is a {link.kind}; a target must be an experience, that is an add or a merge "
            "(anything else makes the operation void)",
        )
    return link


def _clock(requested: int | None, dependencies: Sequence[_Link]) -> int:
    """The operation's Lamport clock: an operation counts only if its clock exceeds every parent's and
    target's (PROTOCOL §7.4), so the default is one more than the highest known, and a clock that is
    provably too low, or a default that cannot be known, is refused rather than signed void."""
    rule = "an operation takes effect only if its clock exceeds the clock of every parent and target"
    if requested is None:
        unknown = next((link for link in dependencies if link.clock is None), None)
        if unknown is not None:
            raise UsageError(
                "clock.unknown",
                f"{unknown.flag}: the clock of {unknown.name} is unknown and {rule}; give its operation file "
                "instead of its CID, or set --clock above its clock",
            )
        return 1 + max((link.clock or 0 for link in dependencies), default=0)
    if not dependencies:
        return requested
    highest = max(dependencies, key=lambda link: link.clock or 1)  # every operation's clock is at least 1
    at_least = highest.clock or 1
    if requested <= at_least:
        known = f"has clock {at_least}" if highest.clock is not None else "has a clock of at least 1"
        raise UsageError(
            "clock.parent" if highest.flag == "--parents" else "clock.target",
            f"--clock {requested}: the operation would be void: {rule}, and {highest.name} ({highest.flag}) {known}; "
            f"use --clock {at_least + 1} or more, or leave --clock out",
        )
    return requested


def _from_ledger(path: Path, params: NetworkParams, targets: list[_Link]) -> tuple[list[_Link], list[_Link]]:
    """Targets with the clocks a node's data directory knows, and its heads as parents: an operation
    built on everything that node holds takes effect there (and resolves a conflict it sees)."""
    from ledger.ledger import DB_DIR, Ledger  # opening a ledger loads the model and the index: only when asked

    if not (path / DB_DIR).is_dir():
        raise UsageError("args.ledger", f"--ledger {path}: not a node's data directory (no {DB_DIR} in it)")
    ledger = Ledger.open(path, params)
    try:
        view = ledger.view()
        known = []
        for link in targets:
            block = view.block(link.cid)
            known.append(_Link(link.cid, link.flag, link.name, block.op.clock, block.op.kind) if block else link)
        parents, _ = view.parents_and_clock([link.cid for link in known])
        heads = [_Link(cid, "--ledger", f"head {cid}", view.clock(cid)) for cid in parents]
        return [_check_target(link) for link in known], heads
    finally:
        ledger.close()


def _experience_fields(args: argparse.Namespace, params: NetworkParams) -> dict[str, Any]:
    """The experience JSON view from --json, overridden by individual flags."""
    from ledger.jsonview import loads

    fields: Any = {}
    if args.json:
        where = f"--json {args.json}"
        fields = loads(_read_bounded(args.json, 8 * params.max_op_bytes, where), where)
        if not isinstance(fields, dict):
            raise UsageError("json.type", f"{where}: the file must hold one JSON object (an experience)")
    if args.text is not None:
        fields["text"] = args.text
    if args.domain is not None:
        fields["domain"] = args.domain
    if args.confidence is not None:
        fields["confidence"] = args.confidence
    if args.example:
        fields["examples"] = [loads(item, f"--example {item[:40]!r}") for item in args.example]
    if args.source is not None:
        fields.setdefault("metadata", {})["source"] = args.source
    return fields


def _require_flag(args: argparse.Namespace, name: str, kind: Kind) -> Any:
    value = getattr(args, name)
    if value is None:
        raise UsageError("args.missing", f"op new {kind}: --{name} is required")
    return value


def _refuse_foreign_flags(args: argparse.Namespace, kind: Kind) -> None:
    """A flag that does not apply to the kind would be silently dropped: refuse it instead."""
    allowed = _KIND_FLAGS[kind]
    for name in dict.fromkeys(flag for flags in _KIND_FLAGS.values() for flag in flags):
        if name not in allowed and getattr(args, name) is not None:
            takes = ", ".join(f"--{flag}" for flag in allowed)
            raise UsageError(
                "args.not_applicable", f"op new {kind}: --{name} does not apply to a {kind} (it takes {takes})"
            )


def _refuse_non_utf8(args: argparse.Namespace) -> None:
    for name in _TEXT_FLAGS:
        value = getattr(args, name, None)
        for text in value if isinstance(value, list) else [value]:
            found = _SURROGATE.search(text) if isinstance(text, str) else None
            if found:
                point = ord(found.group())
                what = (
                    f"the byte 0x{point - 0xDC00:02x}, which is not UTF-8"
                    if 0xDC80 <= point <= 0xDCFF
                    else f"a lone surrogate U+{point:04X}"
                )
                raise UsageError(
                    "args.encoding", f"--{name}: holds {what} (character {found.start()}); give UTF-8 text"
                )


def cmd_id(args: argparse.Namespace) -> int:
    """The peer id (from p2p.key) and full multiaddrs: the running daemon's, else those config.toml asks for."""
    from p2p.host import key_pair, peer_id  # libp2p (0.4 s to import) loads only for this command

    home = Home(args.home)
    config = home.config()
    identity = str(peer_id(key_pair(home.peer_key().seed)))
    running = home.p2p_addrs_file.exists()
    if running:
        addrs = home.p2p_addrs_file.read_text().split()
    else:
        addrs = [f"{addr}/p2p/{identity}" for addr in config.p2p.listen]
    if args.json:
        print(json.dumps({"peer_id": identity, "addrs": addrs, "running": running}, indent=2))
        return 0
    _emit(f"peer id: {identity}")
    for addr in addrs:
        _emit(f"  {addr}")
    if not addrs:
        _emit("  (no [p2p] listen address in config.toml: this node does not join a network)")
    elif not running and any("/tcp/0/" in addr for addr in addrs):
        _emit("  (port 0 is chosen when the daemon starts; run `expledger id` again while it runs)")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    key = AuthorKey.generate()
    key.save(Path(args.out))
    _emit(key.did)
    return 0


def cmd_op_new(args: argparse.Namespace, params: NetworkParams) -> int:
    from ledger.embedder import embedder_for
    from ledger.jsonview import experience_from_json
    from ledger.validation import examine

    kind = Kind(args.kind)
    _refuse_foreign_flags(args, kind)
    key = AuthorKey.load(Path(args.key))
    fields: dict[str, Any] = {}
    targets: list[_Link] = []
    if kind in (Kind.MODIFY, Kind.DELETE, Kind.VOTE):
        targets = [_check_target(_link(_require_flag(args, "target", kind), "--target", params))]
        fields["target"] = targets[0].cid
    if kind is Kind.MERGE:
        targets = [_check_target(link) for link in _links(_require_flag(args, "targets", kind), "--targets", params)]
        fields["targets"] = tuple(sorted({link.cid for link in targets}))
    if kind in (Kind.DELETE, Kind.MERGE):
        fields["reason"] = _require_flag(args, "reason", kind)
    if kind is Kind.VOTE:
        fields["vote"] = _require_flag(args, "value", kind)
    parents = _links(args.parents, "--parents", params)
    if args.ledger:
        targets, heads = _from_ledger(Path(args.ledger), params, targets)
        parents = [*parents, *heads]
    clock = _clock(args.clock, [*targets, *parents])
    if kind in (Kind.ADD, Kind.MODIFY, Kind.MERGE):
        fields["content"] = experience_from_json(_experience_fields(args, params), embedder_for(params))
    seen = [link.cid for link in parents] + [link.cid for link in targets if link.kind is not None]
    op = Operation(
        kind=kind,
        author=key.did,
        clock=clock,
        parents=tuple(sorted(set(seen))),  # a target read from its file has been seen: it is a parent too
        created=args.created if args.created is not None else int(time.time()),
        **fields,
    )
    block = sign(op, key)
    _, errors = examine(block.data, params)
    if errors:
        for error in errors:
            _emit(f"invalid: {error.code}: {error.message}", sys.stderr)
        return EXIT_INVALID
    if args.out:
        try:
            Path(args.out).write_bytes(block.data)
        except OSError as exc:
            raise UsageError("output.write", f"--out {args.out}: cannot write ({exc.strerror})") from None
    else:
        _emit(block.data.hex())
    _emit(str(block.cid), sys.stderr)
    return 0


def _embedding_check(
    block: Block | None, errors: list[LedgerError], params: NetworkParams
) -> tuple[str, LedgerError | None]:
    """The embedding-consistency check a node runs at ingest (PROTOCOL §6.1): what it found, and its error.

    It needs the network's model, so it may also have to say that it did not run, and why.
    """
    if block is None:
        return "not run: the bytes are not an operation", None
    if block.op.content is None:
        return f"not applicable: a {block.op.kind} carries no experience", None
    if any(error.code.startswith("embedding.") for error in errors):
        return "not run: the embedding itself is malformed", None
    from ledger.embedder import embedder_for
    from ledger.validation import check_embeddings

    try:
        embedder = embedder_for(params)
    except LedgerError as exc:
        _emit(f"expledger: warning: {exc.code}: {exc.message}; the embedding-consistency check did not run", sys.stderr)
        return f"not run: {exc.code}: {exc.message}", None
    inconsistent = check_embeddings([block], embedder, params).get(block.cid.raw)
    return ("passed", None) if inconsistent is None else ("failed", inconsistent)


def cmd_op_inspect(args: argparse.Namespace, params: NetworkParams) -> int:
    from ledger.jsonview import operation_json
    from ledger.validation import examine

    data = _inspected_bytes(args.source, params)
    expected = CID.parse(args.cid, field="--cid") if args.cid else None
    block, errors = examine(data, params, expected)
    embedding_check, inconsistent = _embedding_check(block, errors, params)
    if inconsistent is not None:
        errors.append(inconsistent)
    report = {
        "cid": str(block.cid if block else CID.for_block(data)),
        "bytes": len(data),
        "valid": not errors,
        "errors": [{"code": error.code, "message": error.message} for error in errors],
        "embedding_check": embedding_check,
        "operation": operation_json(block) if block else None,
    }
    embedding = (report["operation"] or {}).get("content", {}).get("embedding")
    if embedding and not args.embedding:
        embedding["values"] = f"{len(embedding['values'])} float16 values (--embedding shows them)"
    _emit(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if not errors else EXIT_INVALID


def cmd_audit(args: argparse.Namespace, network: NetworkParams | None) -> int:
    """Compare a node's library with the reference fold of PROTOCOL §7: one line, exit 0 when they match, 1 at the
    first difference (naming the experience and how). `--ledger`: a stopped node's data directory; else the
    running daemon of `--home` audits itself."""
    if args.ledger is None:
        try:
            answer = client.Client(Home(args.home), timeout=AUDIT_TIMEOUT).call("audit")
        except client.DaemonUnavailable as exc:
            _emit(f"expledger: error: {exc.code}: {exc.message} (a stopped node: audit --ledger DIR)", sys.stderr)
            return client.EXIT_UNAVAILABLE
        except client.RpcFailed as exc:
            _emit(f"expledger: error: {exc.code}: {exc.message}", sys.stderr)
            return EXIT_INVALID
        _emit(json.dumps(answer, indent=2) if args.json else answer["message"])
        return 0 if answer["matches"] else EXIT_INVALID
    result = _audit_data_dir(Path(args.ledger), network)
    _emit(json.dumps(result.to_json(), indent=2) if args.json else result.line())
    return 0 if result.matches else EXIT_INVALID


def _audit_data_dir(path: Path, network: NetworkParams | None) -> AuditResult:
    """Audit a data directory no daemon holds, under the network's parameters: `--network`, else those of the home
    it lies in, else the defaults (a directory of another network is refused)."""
    from ledger.audit import audit as audit_view
    from ledger.ledger import DB_DIR, Ledger
    from ledger.store import StoreError

    if not (path / DB_DIR).is_dir():
        raise UsageError("args.ledger", f"--ledger {path}: not a node's data directory (no {DB_DIR} in it)")
    if network is None:
        home_network = path.parent / NETWORK_FILE
        network = NetworkParams.from_file(home_network) if home_network.is_file() else NetworkParams()
    try:
        ledger = Ledger.open(path, network)
    except StoreError as exc:
        if exc.code == "store.open" and "lock" in exc.message:
            raise UsageError(
                "ledger.in_use",
                f"--ledger {path}: a running node holds this data directory; ask it to audit itself: "
                f"expledger audit --home HOME (without --ledger)",
            ) from None
        raise
    try:
        return audit_view(ledger.view(), network, _audit_progress())
    finally:
        ledger.close()


def _audit_progress() -> Callable[[str, int, int], None]:
    """Progress on stderr: one line rewritten in place on a terminal, a line every few seconds otherwise."""
    from ledger.audit import every

    if not sys.stderr.isatty():
        return every(AUDIT_PROGRESS_SECONDS, lambda line: _emit(line, sys.stderr))

    def show(stage: str, done: int, of: int) -> None:
        sys.stderr.write(f"\r\033[Kaudit: {stage} {done} of {of}" + ("\n" if done == of else ""))
        sys.stderr.flush()

    return show


def _vote_value(text: str) -> int:
    values = {"+1": 1, "1": 1, "up": 1, "-1": -1, "down": -1}
    if text not in values:
        raise argparse.ArgumentTypeError("must be +1, -1, up or down")
    return values[text]


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer not below `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


#: the entry points of the commands that packages on top of the node add to `expledger` (`devnet`: pyproject.toml);
#: the node finds them by name and imports none of them
COMMANDS = "expledger.commands"
#: entry points that may say where a command with no node in its home should look (the devnet's running nodes)
HINTS = "expledger.hints"


@functools.cache
def registered_commands() -> dict[str, Callable[[Sequence[str]], int]]:
    """The commands other installed packages register (name -> what runs it with the arguments after the name); the
    first line of its docstring is its --help line. Read once a process: `main` and `build_parser` both ask, and each
    scan of the installed packages' metadata costs ~10 ms of every command's start."""
    from importlib.metadata import entry_points

    return {entry.name: entry.load() for entry in sorted(entry_points(group=COMMANDS), key=lambda entry: entry.name)}


def build_parser(registered: bool = True) -> argparse.ArgumentParser:
    """Every command's parser; `registered`: with the commands other installed packages add (`devnet`)."""
    parser = _Parser(
        prog="expledger", description="Experience Ledger: a signed, shared library of reasoning experiences."
    )
    parser.add_argument(
        "--network", metavar="FILE", help="network parameters (JSON); default: the built-in devnet parameters"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--home", type=Path, default=default_home(), help=f"the node's home (default: ${HOME_ENV} or ~/.expledger)"
    )
    common.add_argument("--json", action="store_true", help="print the answer as JSON (for scripts)")

    init = commands.add_parser(
        "init", parents=[common], help="create a node's home (config, keys, genesis, data); safe to run again"
    )
    init.add_argument("--network", metavar="FILE", default=argparse.SUPPRESS, help="join this network's parameters")
    init.add_argument("--rpc", metavar="HOST:PORT", help="where the RPC server listens (port 0: any free port)")
    init.add_argument(
        "--p2p",
        metavar="MULTIADDR",
        help='where libp2p listens, e.g. /ip4/127.0.0.1/tcp/0 (any free port); "" for none',
    )
    daemon = commands.add_parser("daemon", parents=[common], help="run the node (in the foreground unless --detach)")
    daemon.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="overrides config.toml")
    daemon.add_argument(
        "--detach", action="store_true", help="run in the background (logs to HOME/daemon.log); return once it is ready"
    )
    client.add_commands(commands, common)
    dso_cli.add_commands(commands, common)
    for name, command in (registered_commands() if registered else {}).items():  # listed for --help
        commands.add_parser(name, help=(command.__doc__ or name).strip().splitlines()[0])

    commands.add_parser("id", parents=[common], help="this node's peer id and the multiaddrs to give to other nodes")
    audit = commands.add_parser(
        "audit",
        parents=[common],
        help="check the library against the reference fold of PROTOCOL §7: exit 0 if it matches, 1 at a difference",
    )
    audit.add_argument(
        "--ledger",
        metavar="DIR",
        help="a stopped node's data directory (HOME/data); without it the running daemon of --home audits itself",
    )
    keygen = commands.add_parser("keygen", help="create an author key file (mode 0600) and print its did:key")
    keygen.add_argument("--out", required=True, metavar="FILE", help="where to write the key; must not exist")

    op = commands.add_parser("op", help="build, sign and inspect operations offline")
    op_commands = op.add_subparsers(dest="op_command", required=True)

    new = op_commands.add_parser(
        "new",
        help="build and sign an operation; prints its DAG-CBOR as hex (CID on stderr)",
        description="Operations are named by their file (raw or hex DAG-CBOR, as --out writes it) or by CID. "
        "The clock defaults to one more than the highest clock among the parents and targets given as files; "
        "a target read from its file is also a parent.",
    )
    new.add_argument("kind", choices=[kind.value for kind in Kind])
    new.add_argument("--key", required=True, metavar="FILE", help="author key file from `expledger keygen`")
    new.add_argument(
        "--json",
        metavar="FILE",
        help="the experience as a JSON view (text, domain, confidence, examples, metadata.source)",
    )
    new.add_argument("--text", help="experience text, e.g. 'When …, …'")
    new.add_argument("--domain", help="taxonomy path, e.g. math.geometry.intersection")
    new.add_argument("--confidence", type=float, help="confidence in [0, 1]")
    new.add_argument(
        "--example", action="append", metavar="JSON", help='{"input": …, "output": …, "correct": true}; repeatable'
    )
    new.add_argument("--source", help="provenance, e.g. a training run name")
    new.add_argument("--target", metavar="FILE|CID", help="experience (add or merge) to modify, delete or vote on")
    new.add_argument("--targets", metavar="FILE|CID,…", help="experiences a merge combines")
    new.add_argument("--reason", help="why (delete and merge)")
    new.add_argument("--value", type=_vote_value, help="vote: +1 or -1")
    new.add_argument("--parents", metavar="FILE|CID,…", help="operations the author had seen (default: none)")
    new.add_argument(
        "--ledger",
        metavar="DIR",
        help="a node's data directory (not in use by a running node): its heads become parents, and targets "
        "named by CID get their clocks from it",
    )
    new.add_argument(
        "--clock",
        type=_int_at_least(1),
        help="Lamport clock (default: 1 + the highest clock of the parents and targets given as files)",
    )
    new.add_argument("--created", type=_int_at_least(0), help="creation time, Unix seconds (default: now)")
    new.add_argument("--out", metavar="FILE", help="write raw DAG-CBOR bytes here instead of hex to stdout")

    inspect_cmd = op_commands.add_parser(
        "inspect", help="decode and validate an operation, its embedding included; exit 0 only if valid"
    )
    inspect_cmd.add_argument("source", metavar="FILE|HEX", help="a file with raw or hex DAG-CBOR, or hex")
    inspect_cmd.add_argument("--cid", help="the CID the operation is claimed to have")
    inspect_cmd.add_argument("--embedding", action="store_true", help="print every embedding value")
    return parser


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return {name for action in subcommands for name in action.choices}


def _command_word(argv: list[str]) -> str | None:
    """The word naming the command: the first past the top-level `--network FILE` (a flag such as --help, or None)."""
    words = iter(argv)
    for word in words:
        if word == "--network":
            next(words, None)
        elif not word.startswith("--network="):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, registered = build_parser(registered=False), {}
    # the parser is built again, with other packages' commands, only for --help or a command not the node's own
    # (building one costs ~15 ms, most of it argparse's gettext lookups)
    if _command_word(argv) not in _command_names(parser):
        registered = registered_commands()
        if argv[:1] and argv[0] in registered:
            return registered[argv[0]](argv[1:])
        parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        _refuse_non_utf8(args)
        params = NetworkParams.from_file(Path(args.network)) if args.network else NetworkParams()
        if args.command == "init":
            for line in Home(args.home).init(params if args.network else None, args.rpc, args.p2p):
                _emit(line)
            return 0
        if args.command in registered:
            raise UsageError(
                f"args.{args.command}",
                f"`{args.command}` comes first (expledger {args.command} …); it takes its own options",
            )
        if args.command == "daemon" and args.detach:
            from node.detach import detach

            return detach(Home(args.home), args.log_level)
        if args.command == "daemon":
            from node import daemon  # the server stack loads only for the daemon

            return daemon.run(Home(args.home), args.log_level)
        if args.command == "id":
            return cmd_id(args)
        if args.command == "audit":
            return cmd_audit(args, params if args.network else None)
        if args.command == "dso":
            return dso_cli.run(args)
        if getattr(args, "client_command", None) == "submit":
            return client.run_command(args, _inspected_bytes(args.source, params))
        if getattr(args, "client_command", None):
            return client.run_command(args)
        if args.command == "keygen":
            return cmd_keygen(args)
        if args.op_command == "new":
            return cmd_op_new(args, params)
        return cmd_op_inspect(args, params)
    except LedgerError as exc:
        _emit(f"expledger: error: {exc.code}: {exc.message}", sys.stderr)
        querying = args is not None and args.command not in ("init", "daemon")  # `daemon` wants a home of its own
        if exc.code == "home.uninitialised" and querying and (hint := _devnet_hint()):
            _emit(f"expledger: hint: {hint}", sys.stderr)
        return EXIT_USAGE


def _devnet_hint() -> str | None:
    """Where to point a command whose home holds no node, when a devnet runs (as scripts/demo.sh leaves one):
    `expledger init` would make a new, empty node, which is rarely what was meant. The devnet package answers
    through its `expledger.hints` entry point, so the node imports nothing of it."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=HINTS):
        hint = entry.load()()
        if hint:
            return hint
    return None


if __name__ == "__main__":
    sys.exit(main())
