"""`expledger`: the command line. Offline tools first: keys, building and inspecting operations."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ledger.cid import CID
from ledger.embedder import embedder_for
from ledger.errors import LedgerError
from ledger.jsonview import experience_from_json, operation_json
from ledger.keys import AuthorKey
from ledger.ops import Kind, Operation, sign
from ledger.params import NetworkParams
from ledger.validation import examine

EXIT_INVALID = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A command-line argument or input file that cannot be used; exits with status 2."""


def _cid_list(text: str | None, flag: str) -> tuple[CID, ...]:
    """Comma-separated CIDs, returned sorted and unique as operations require."""
    if not text:
        return ()
    return tuple(sorted({CID.parse(part, field=flag) for part in text.split(",") if part.strip()}, key=lambda c: c.raw))


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"--json: cannot read {path} ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--json: {path} is not JSON ({type(exc).__name__}: {exc})") from None


def _experience_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The experience JSON view from --json, overridden by individual flags."""
    fields: dict[str, Any] = _read_json(args.json) if args.json else {}
    if not isinstance(fields, dict):
        raise UsageError("--json: the file must hold one JSON object (an experience)")
    if args.text is not None:
        fields["text"] = args.text
    if args.domain is not None:
        fields["domain"] = args.domain
    if args.confidence is not None:
        fields["confidence"] = args.confidence
    if args.example:
        try:
            fields["examples"] = [json.loads(item) for item in args.example]
        except ValueError as exc:
            raise UsageError(f"--example: not JSON ({exc})") from None
    if args.source is not None:
        fields.setdefault("metadata", {})["source"] = args.source
    return fields


def _require_flag(args: argparse.Namespace, name: str, kind: Kind) -> Any:
    value = getattr(args, name)
    if value is None:
        raise UsageError(f"op new {kind}: --{name} is required")
    return value


def cmd_keygen(args: argparse.Namespace) -> int:
    key = AuthorKey.generate()
    key.save(Path(args.out))
    print(key.did)
    return 0


def cmd_op_new(args: argparse.Namespace, params: NetworkParams) -> int:
    kind = Kind(args.kind)
    key = AuthorKey.load(Path(args.key))
    fields: dict[str, Any] = {}
    if kind in (Kind.ADD, Kind.MODIFY, Kind.MERGE):
        fields["content"] = experience_from_json(_experience_fields(args), embedder_for(params))
    if kind in (Kind.MODIFY, Kind.DELETE, Kind.VOTE):
        fields["target"] = CID.parse(_require_flag(args, "target", kind), field="--target")
    if kind is Kind.MERGE:
        fields["targets"] = _cid_list(_require_flag(args, "targets", kind), "--targets")
    if kind in (Kind.DELETE, Kind.MERGE):
        fields["reason"] = _require_flag(args, "reason", kind)
    if kind is Kind.VOTE:
        fields["vote"] = _require_flag(args, "value", kind)
    op = Operation(
        kind=kind,
        author=key.did,
        clock=args.clock,
        parents=_cid_list(args.parents, "--parents"),
        created=args.created if args.created is not None else int(time.time()),
        **fields,
    )
    block = sign(op, key)
    _, errors = examine(block.data, params)
    if errors:
        for error in errors:
            print(f"invalid: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_INVALID
    if args.out:
        Path(args.out).write_bytes(block.data)
    else:
        print(block.data.hex())
    print(block.cid, file=sys.stderr)
    return 0


def _read_operation_bytes(source: str) -> bytes:
    """A file holding raw DAG-CBOR or hex, or hex given directly."""
    try:
        data = Path(source).read_bytes()
    except OSError:
        data = None  # not a readable file (or a name too long to be one): try it as hex
    if data is not None:
        try:
            return bytes.fromhex(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            return data
    try:
        return bytes.fromhex(source.strip())
    except ValueError:
        raise UsageError(f"{source[:60]!r} is neither a readable file nor hex") from None


def cmd_op_inspect(args: argparse.Namespace, params: NetworkParams) -> int:
    data = _read_operation_bytes(args.source)
    expected = CID.parse(args.cid, field="--cid") if args.cid else None
    block, errors = examine(data, params, expected)
    report = {
        "cid": str(block.cid if block else CID.for_block(data)),
        "bytes": len(data),
        "valid": not errors,
        "errors": [{"code": error.code, "message": error.message} for error in errors],
        "operation": operation_json(block) if block else None,
    }
    embedding = (report["operation"] or {}).get("content", {}).get("embedding")
    if embedding and not args.embedding:
        embedding["values"] = f"{len(embedding['values'])} float16 values (--embedding shows them)"
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if not errors else EXIT_INVALID


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
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="expledger", description="Experience Ledger: a signed, shared library of reasoning experiences."
    )
    parser.add_argument(
        "--network", metavar="FILE", help="network parameters (JSON); default: the built-in devnet parameters"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    keygen = commands.add_parser("keygen", help="create an author key file (mode 0600) and print its did:key")
    keygen.add_argument("--out", required=True, metavar="FILE", help="where to write the key; must not exist")

    op = commands.add_parser("op", help="build, sign and inspect operations offline")
    op_commands = op.add_subparsers(dest="op_command", required=True)

    new = op_commands.add_parser("new", help="build and sign an operation; prints its DAG-CBOR as hex (CID on stderr)")
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
    new.add_argument("--target", metavar="CID", help="experience to modify, delete or vote on")
    new.add_argument("--targets", metavar="CID,CID,…", help="experiences a merge combines")
    new.add_argument("--reason", help="why (delete and merge)")
    new.add_argument("--value", type=_vote_value, help="vote: +1 or -1")
    new.add_argument("--parents", metavar="CID,CID,…", help="heads the author had seen (default: none)")
    new.add_argument("--clock", type=_int_at_least(1), default=1, help="Lamport clock (default: 1)")
    new.add_argument("--created", type=_int_at_least(0), help="creation time, Unix seconds (default: now)")
    new.add_argument("--out", metavar="FILE", help="write raw DAG-CBOR bytes here instead of hex to stdout")

    inspect_cmd = op_commands.add_parser("inspect", help="decode and validate an operation; exit 0 only if valid")
    inspect_cmd.add_argument("source", metavar="FILE|HEX", help="a file with raw or hex DAG-CBOR, or hex")
    inspect_cmd.add_argument("--cid", help="the CID the operation is claimed to have")
    inspect_cmd.add_argument("--embedding", action="store_true", help="print every embedding value")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        params = NetworkParams.from_file(Path(args.network)) if args.network else NetworkParams()
        if args.command == "keygen":
            return cmd_keygen(args)
        if args.op_command == "new":
            return cmd_op_new(args, params)
        return cmd_op_inspect(args, params)
    except UsageError as exc:
        print(f"expledger: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerError as exc:
        print(f"expledger: error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, RecursionError) as exc:  # unusable paths or input the checks above let through
        print(f"expledger: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
