"""`expledger` as a user runs it: keygen, op new for every kind, op inspect, and bad input."""

import contextlib
import io
import json
import os
import re
import resource
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.cid import CID
from ledger.embedder import embedder_for, pack_float16
from ledger.keys import AuthorKey
from ledger.ops import Embedding, Kind, decode_block, sign
from ledger.params import NetworkParams
from node.cli import main
from node.client import render
from tests import factories as f

EXPLEDGER = Path(sys.executable).parent / "expledger"
GEOMETRY = f.SEED_TEXTS[0]
#: one error, one line: `expledger: error: <dotted code>: <message>`
ONE_ERROR_LINE = re.compile(r"expledger: error: [a-z0-9_]+(\.[a-z0-9_]+)+: \S.*\n")


def run(*args: str | bytes, cwd: Path | None = None, **options) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXPLEDGER), *args], capture_output=True, text=True, cwd=cwd, timeout=60, **options)


def _at_most_4_gib() -> None:
    """A child that regresses into reading without bound fails with MemoryError instead of exhausting the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "author.key"
    result = run("keygen", "--out", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("did:key:z6Mk")
    return path


@pytest.fixture(scope="module")
def hashing_network(tmp_path_factory) -> Path:
    """Network parameters pinning the test embedder, so factory-built operations are valid there."""
    path = tmp_path_factory.mktemp("net") / "hashing.json"
    path.write_text(json.dumps({"embedding_model": f.PARAMS.embedding_model}))
    return path


def new(key: Path, *args: str) -> tuple[str, str]:
    """Run `op new` and return (hex, cid)."""
    result = run("op", "new", *args, "--key", str(key))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr.strip()


def new_file(key: Path, out: Path, *args: str) -> Path:
    """Run `op new … --out FILE` and return the file."""
    result = run("op", "new", *args, "--key", str(key), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def inspect(source: str, *args: str) -> tuple[int, dict]:
    result = run("op", "inspect", source, *args)
    return result.returncode, json.loads(result.stdout) if result.stdout else {}


def op_of(path: Path):
    return decode_block(path.read_bytes()).op


def test_keygen_writes_a_private_key_and_refuses_to_overwrite(key):
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    again = run("keygen", "--out", str(key))
    assert again.returncode == 2
    assert "keyfile.exists" in again.stderr


def test_every_kind_can_be_built_signed_and_inspected(key, tmp_path):
    add_hex, add_cid = new(
        key,
        "add",
        "--text",
        GEOMETRY,
        "--domain",
        "math.geometry",
        "--confidence",
        "0.87",
        "--example",
        '{"input": "line AB", "output": "outside", "correct": false}',
    )
    other = new_file(
        key,
        tmp_path / "other.cbor",
        "add",
        "--text",
        f.SEED_TEXTS[1],
        "--domain",
        "math.combinatorics",
        "--confidence",
        "1",
    )
    other_cid = str(decode_block(other.read_bytes()).cid)
    view = tmp_path / "exp.json"
    view.write_text(
        json.dumps(
            {"text": f.SEED_TEXTS[2], "domain": "math.proof", "confidence": 0.5, "metadata": {"source": "run-7"}}
        )
    )
    built = {
        "add": add_cid,
        "modify": new(key, "modify", "--target", add_cid, "--json", str(view), "--parents", add_cid, "--clock", "2")[1],
        "delete": new(key, "delete", "--target", str(other), "--reason", "Proven incorrect")[1],
        "merge": new(
            key, "merge", "--targets", f"{other_cid},{add_cid}", "--json", str(view), "--reason", "same", "--clock", "2"
        )[1],
        "vote": new(key, "vote", "--target", add_cid, "--value", "-1", "--clock", "5")[1],
    }
    code, report = inspect(add_hex)
    assert code == 0 and report["valid"] and report["cid"] == add_cid
    assert report["embedding_check"] == "passed"
    assert report["operation"]["content"]["text"] == GEOMETRY
    assert report["operation"]["content"]["examples"][0]["correct"] is False
    assert report["operation"]["content"]["embedding"]["values"].startswith("256 float16 values")
    code, full = inspect(add_hex, "--embedding")
    assert code == 0 and len(full["operation"]["content"]["embedding"]["values"]) == 256
    for kind, cid in built.items():
        assert cid.startswith("bafyrei"), kind
    out = tmp_path / "merge.cbor"
    result = run(
        "op",
        "new",
        "merge",
        "--key",
        str(key),
        "--targets",
        f"{add_cid},{other}",
        "--json",
        str(view),
        "--reason",
        "same",
        "--clock",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0 and result.stdout == ""
    code, report = inspect(str(out))
    assert code == 0
    assert report["operation"]["targets"] == [str(c) for c in sorted(CID.parse(c) for c in (add_cid, other_cid))]
    assert report["operation"]["parents"] == [other_cid]  # the target read from its file has been seen
    assert report["operation"]["content"]["source"] == "run-7"


# --- clocks: op new never signs an operation that is void by construction ---------------------


def test_the_clock_defaults_to_one_above_every_operation_given_as_a_file(key, tmp_path):
    first = new_file(key, tmp_path / "a.cbor", "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    second = new_file(
        key, tmp_path / "b.cbor", "add", "--text", f.SEED_TEXTS[1], "--domain", "math", "--confidence", "0.5"
    )
    vote = new_file(key, tmp_path / "v.cbor", "vote", "--target", str(first), "--value", "+1")
    merge = new_file(
        key,
        tmp_path / "m.cbor",
        "merge",
        "--targets",
        f"{first},{second}",
        "--parents",
        str(vote),
        "--text",
        f.SEED_TEXTS[2],
        "--domain",
        "math",
        "--confidence",
        "0.5",
        "--reason",
        "same",
    )
    cid = {path: decode_block(path.read_bytes()).cid for path in (first, second, vote)}
    assert op_of(first).clock == 1 and op_of(first).parents == ()
    assert op_of(vote).clock == 2 and op_of(vote).parents == (cid[first],)
    assert op_of(merge).clock == 3
    assert op_of(merge).parents == tuple(sorted(cid.values()))
    hex_file = tmp_path / "v.hex"
    hex_file.write_text(vote.read_bytes().hex() + "\n")  # an operation file may hold hex, too
    delete = new_file(
        key, tmp_path / "d.cbor", "delete", "--target", str(first), "--parents", str(hex_file), "--reason", "x"
    )
    assert op_of(delete).clock == 3


def test_a_target_named_by_cid_needs_a_clock_and_the_rule_is_explained(key, tmp_path):
    add = new_file(key, tmp_path / "a.cbor", "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    cid = str(decode_block(add.read_bytes()).cid)
    for args in (["vote", "--target", cid, "--value", "+1"], ["add", "--parents", cid, "--text", GEOMETRY]):
        result = run("op", "new", *args, "--key", str(key))
        assert result.returncode == 2 and result.stdout == ""
        assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
        assert "clock.unknown" in result.stderr
        assert "its clock exceeds the clock of every parent and target" in result.stderr
        assert cid in result.stderr
    assert (
        op_of(new_file(key, tmp_path / "v.cbor", "vote", "--target", cid, "--value", "+1", "--clock", "4")).clock == 4
    )


@pytest.mark.parametrize(
    ("args", "code", "suggested"),
    [
        (["vote", "--target", "{add}", "--value", "+1", "--clock", "1"], "clock.target", "--clock 2"),
        (
            ["vote", "--target", "{add}", "--value", "+1", "--parents", "{vote}", "--clock", "2"],
            "clock.parent",
            "--clock 3",
        ),
        (["vote", "--target", "{cid}", "--value", "+1", "--clock", "1"], "clock.target", "--clock 2"),
    ],
)
def test_a_clock_that_is_provably_void_is_refused(key, tmp_path, args, code, suggested):
    add = new_file(key, tmp_path / "a.cbor", "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    vote = new_file(key, tmp_path / "v.cbor", "vote", "--target", str(add), "--value", "+1")
    names = {"add": str(add), "vote": str(vote), "cid": str(decode_block(add.read_bytes()).cid)}
    result = run("op", "new", *(arg.format(**names) for arg in args), "--key", str(key))
    assert result.returncode == 2 and result.stdout == ""
    assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert f"error: {code}: " in result.stderr and "would be void" in result.stderr and suggested in result.stderr


def test_a_target_that_is_not_an_experience_is_refused(key, tmp_path):
    add = new_file(key, tmp_path / "a.cbor", "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    vote = new_file(key, tmp_path / "v.cbor", "vote", "--target", str(add), "--value", "+1")
    result = run("op", "new", "delete", "--key", str(key), "--target", str(vote), "--reason", "x")
    assert result.returncode == 2 and "target.not_experience" in result.stderr and "is a vote" in result.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target_clock=st.integers(1, 2**62),
    parent_clocks=st.lists(st.integers(1, 2**62), max_size=4),
    explicit=st.one_of(st.none(), st.integers(-3, 2)),
)
def test_a_clock_exceeds_every_known_parent_and_target_or_is_refused(
    key, hashing_network, tmp_path, target_clock, parent_clocks, explicit
):
    """In-process (hypothesis runs many examples): operations from the factories at random clocks, given as
    files; the clock is derived, or given as the highest known clock plus `explicit` (refused unless above it)."""
    target = f.signed(f.operation(Kind.ADD, clock=target_clock, content=f.content()))
    parents = [
        f.signed(f.operation(Kind.DELETE, clock=clock, target=target.cid, reason=f"r{i}"))
        for i, clock in enumerate(parent_clocks)
    ]
    highest = max([target_clock, *parent_clocks])
    files = []
    for index, block in enumerate([target, *parents]):
        path = tmp_path / f"{target_clock}-{index}.cbor"
        path.write_bytes(block.data)
        files.append(str(path))
    out = tmp_path / f"{target_clock}-vote.cbor"
    out.unlink(missing_ok=True)
    argv = ["--network", str(hashing_network), "op", "new", "vote", "--key", str(key), "--target", files[0]]
    argv += ["--value", "up", "--out", str(out), *(["--parents", ",".join(files[1:])] if parents else [])]
    requested = None if explicit is None else max(1, highest + explicit)
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        status = main([*argv, *([] if requested is None else ["--clock", str(requested)])])
    if requested is not None and requested <= highest:
        assert status == 2 and not out.exists()
        assert f"use --clock {highest + 1} or more" in errors.getvalue()
        return
    assert status == 0, errors.getvalue()
    vote = op_of(out)
    assert vote.clock == (highest + 1 if requested is None else requested)
    assert set(vote.parents) == {target.cid, *(block.cid for block in parents)}


# --- op inspect -------------------------------------------------------------------------------


def test_inspect_reports_every_failed_rule_and_exits_nonzero(key):
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    data = bytearray.fromhex(add_hex)
    data[-1] ^= 0x01  # inside the content, after signing
    code, report = inspect(data.hex())
    assert code == 1 and not report["valid"]
    assert [e["code"] for e in report["errors"]] == ["signature.invalid"]
    code, report = inspect("a0")
    assert code == 1 and report["errors"][0]["code"] == "schema.missing"
    assert report["embedding_check"].startswith("not run")
    code, report = inspect("ff")
    assert code == 1 and report["errors"][0]["code"] == "codec.malformed"
    code, report = inspect(add_hex, "--cid", "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
    assert code == 1 and report["errors"][0]["code"] == "cid.mismatch"


def test_inspect_runs_the_embedding_consistency_check_that_ingest_runs(key, tmp_path):
    """An operation that passes every stateless rule but carries another text's embedding is not valid."""
    honest = decode_block(
        bytes.fromhex(new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")[0])
    )
    params = NetworkParams()
    wrong = pack_float16(embedder_for(params).embed([f.SEED_TEXTS[1]])[0])
    content = replace(honest.op.content, embedding=Embedding(params.embedding_model, params.embedding_dim, wrong))
    forged = sign(replace(honest.op, content=content), AuthorKey.load(key))
    path = tmp_path / "forged.cbor"
    path.write_bytes(forged.data)
    code, report = inspect(str(path))
    assert code == 1 and not report["valid"]
    assert [e["code"] for e in report["errors"]] == ["embedding.inconsistent"]
    assert report["embedding_check"] == "failed"
    vote_hex, _ = new(key, "vote", "--target", str(honest.cid), "--value", "+1", "--clock", "2")
    code, report = inspect(vote_hex)
    assert code == 0 and report["embedding_check"].startswith("not applicable")


def test_inspect_says_so_when_it_cannot_run_the_embedding_check(tmp_path):
    """A network pinning a model this machine lacks: the rules pass, and the report says what was not checked."""
    model, dim = "zen-reranker-7680", 7680
    network = tmp_path / "zen.json"
    calibrated = {"relevance_threshold": 0.6, "near_duplicate_cosine": 0.9, "embedding_epsilon": 0.002}
    network.write_text(json.dumps({"embedding_model": model, "embedding_dim": dim, **calibrated}))
    values = pack_float16(np.full(dim, 1 / np.sqrt(dim), dtype=np.float32))
    content = replace(f.content(), embedding=Embedding(model, dim, values))
    path = tmp_path / "zen.cbor"
    path.write_bytes(f.signed(f.operation(Kind.ADD, content=content)).data)
    result = run("--network", str(network), "op", "inspect", str(path))
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["valid"] and report["errors"] == []
    assert report["embedding_check"].startswith("not run: embedder.unavailable")
    assert "warning: embedder.unavailable" in result.stderr and "did not run" in result.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("a0b", "odd number of digits (3)"),
        ("0xa0", "0x prefix"),
        ("  a0 b\n", "odd number of digits (3)"),
        ("hello", "not hex ('h' is not a hex digit)"),
        ("", "is empty"),
        ("\n \n", "is empty"),
    ],
)
def test_text_that_looks_like_hex_is_refused_with_the_reason(tmp_path, content, needle):
    path = tmp_path / "op.hex"
    path.write_text(content)
    result = run("op", "inspect", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert needle in result.stderr and str(path) in result.stderr


@pytest.mark.parametrize(("arg", "needle"), [("0xa0", "0x prefix"), ("a0b", "odd number of digits")])
def test_hex_arguments_that_cannot_be_decoded_say_why(arg, needle):
    result = run("op", "inspect", arg)
    assert result.returncode == 2 and needle in result.stderr and "looks like hex" in result.stderr


def test_inspect_reads_at_most_a_bounded_prefix(tmp_path):
    result = run("op", "inspect", "/dev/zero", preexec_fn=_at_most_4_gib)
    assert result.returncode == 2 and result.stdout == ""
    assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert "input.size" in result.stderr and "larger than 196608 bytes" in result.stderr


def test_a_closed_pipe_ends_the_output_quietly_with_the_verdict(key):
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first write (`| head` that already exited): every write fails
    try:
        result = subprocess.run(
            [str(EXPLEDGER), "op", "inspect", add_hex], stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(writer)
    assert (result.returncode, result.stderr) == (0, "")


def test_inspect_piped_into_head_exits_quietly(key):
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {EXPLEDGER} op inspect --embedding {add_hex} | head -1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "{\n", "")


def _valid_operations() -> list[bytes]:
    add = f.add()
    return [
        add.data,
        f.signed(f.operation(Kind.VOTE, clock=2, parents=(add.cid,), target=add.cid, vote=1)).data,
        f.signed(
            f.operation(
                Kind.MERGE,
                clock=2,
                targets=tuple(sorted((add.cid, f.add(f.SEED_TEXTS[1]).cid))),
                content=f.content(f.SEED_TEXTS[2]),
                reason="same",
            )
        ).data,
    ]


def _mutated(data: bytes) -> st.SearchStrategy[bytes]:
    edits = st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), min_size=1, max_size=4)
    return edits.map(lambda changes: _apply(data, changes))


def _apply(data: bytes, changes: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for index, value in changes:
        out[index] = value
    return bytes(out)


_INSPECTED = st.one_of(
    st.binary(max_size=2048),
    st.sampled_from(_valid_operations()).flatmap(_mutated),
    st.sampled_from(_valid_operations()).flatmap(lambda data: st.integers(0, len(data)).map(lambda cut: data[:cut])),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_INSPECTED, as_hex=st.booleans())
def test_inspect_survives_any_bytes(hashing_network, tmp_path, data, as_hex):
    """Arbitrary, mutated and truncated operations, raw or as hex: a report or a one-line error, never an exception."""
    path = tmp_path / "fuzzed"
    path.write_bytes(data.hex().encode() if as_hex else data)
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        status = main(["--network", str(hashing_network), "op", "inspect", str(path)])
    if status == 2:
        assert out.getvalue() == "" and ONE_ERROR_LINE.fullmatch(err.getvalue()), err.getvalue()
    else:
        report = json.loads(out.getvalue())
        assert status == (0 if report["valid"] else 1)
        assert report["bytes"] == len(data) or not as_hex  # raw bytes that happen to be ASCII are read as hex


# --- op new: refusals -------------------------------------------------------------------------


def test_op_new_refuses_to_sign_an_invalid_operation(key):
    result = run(
        "op", "new", "add", "--key", str(key), "--text", "Solve x^2 = 4.", "--domain", "Math", "--confidence", "2"
    )
    assert result.returncode == 1
    assert result.stdout == ""
    for code in ("text.structure", "text.generality.equation", "domain.syntax", "confidence.range"):
        assert code in result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["op", "new", "add", "--text", GEOMETRY, "--domain", "math"], "confidence: required"),
        (["op", "new", "delete", "--reason", "x"], "--target is required"),
        (["op", "new", "delete", "--target", "nope", "--reason", "x"], "--target"),
        (["op", "new", "vote", "--target", "x", "--value", "3"], "must be +1, -1"),
        (["op", "new", "add", "--json", "/nonexistent.json"], "input.read: --json /nonexistent.json: cannot read"),
        (["op", "new", "add", "--clock", "0", "--text", "t"], "must be at least 1"),
        (["op", "new", "add", "--example", "{bad", "--text", GEOMETRY], "json.syntax: --example '{bad': not JSON"),
        (["op", "inspect", "not-hex-or-file"], "neither a readable file nor hex"),
        (["--network", "/nonexistent.json", "op", "inspect", "a0"], "params.file"),
        (
            [
                "op",
                "new",
                "vote",
                "--target",
                str(f.add().cid),
                "--value",
                "+1",
                "--clock",
                "2",
                "--out",
                "/nonexistent/dir/op",
            ],
            "output.write",
        ),
        (
            ["op", "new", "add", "--target", str(f.add().cid), "--text", GEOMETRY],
            "args.not_applicable: op new add: --target",
        ),
        (["op", "new", "vote", "--target", str(f.add().cid), "--value", "+1", "--text", "t"], "--text does not apply"),
        (["op", "new", "delete", "--target", str(f.add().cid), "--reason", "x", "--value", "up"], "--value does not"),
        (["op", "new", "merge", "--target", str(f.add().cid), "--reason", "x"], "--target does not apply to a merge"),
        (["op", "new", "bless"], "args.invalid"),
        (["op"], "args.invalid"),
    ],
)
def test_bad_arguments_exit_2_with_one_precise_line(key, args, needle):
    if args[:2] == ["op", "new"]:
        args = [*args, "--key", str(key)]
    result = run(*args)
    assert result.returncode == 2, result.stdout
    assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert needle in result.stderr


def test_text_that_is_not_utf8_is_refused_in_one_line(key):
    for flag in (b"--text", b"--domain", b"--source"):
        args = {
            b"--text": b"When solving geometry problems, check the bounds.",
            b"--domain": b"math",
            b"--source": b"run",
        }
        args[flag] = args[flag][:4] + b"\xff\xfe" + args[flag][4:]
        argv = [b"op", b"new", b"add", b"--key", str(key).encode(), b"--confidence", b"0.5"]
        result = run(*argv, *(item for pair in args.items() for item in pair))
        assert result.returncode == 2 and result.stdout == ""
        assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
        assert f"args.encoding: {flag.decode()}: holds the byte 0xff, which is not UTF-8" in result.stderr


def test_duplicate_keys_in_a_json_view_are_refused(key, tmp_path):
    view = tmp_path / "dup.json"
    view.write_text('{"text": "When a, b.", "domain": "math", "confidence": 0.5, "text": "When c, d."}')
    result = run("op", "new", "add", "--key", str(key), "--json", str(view))
    assert result.returncode == 2 and result.stdout == ""
    assert ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert "json.duplicate_key" in result.stderr and "'text'" in result.stderr and str(view) in result.stderr
    example = '{"input": "a", "output": "b", "correct": true, "correct": false}'
    result = run(
        "op",
        "new",
        "add",
        "--key",
        str(key),
        "--text",
        GEOMETRY,
        "--domain",
        "m",
        "--confidence",
        "1",
        "--example",
        example,
    )
    assert result.returncode == 2 and "json.duplicate_key" in result.stderr and "'correct'" in result.stderr


def test_a_json_view_with_a_lone_surrogate_is_refused(key, tmp_path):
    view = tmp_path / "surrogate.json"
    view.write_text('{"text": "When a\\ud800, b.", "domain": "math", "confidence": 0.5}')
    result = run("op", "new", "add", "--key", str(key), "--json", str(view))
    assert result.returncode == 2 and ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert "json.utf8: text: holds a lone surrogate U+D800" in result.stderr


# --- key and network files ----------------------------------------------------------------------


def test_a_readable_key_file_is_refused(key, tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_text(key.read_text())
    loose.chmod(0o644)
    result = run(
        "op", "new", "vote", "--key", str(loose), "--target", str(f.add().cid), "--value", "+1", "--clock", "2"
    )
    assert result.returncode == 2
    assert "keyfile.permissions" in result.stderr


@pytest.mark.parametrize("content", [bytes(range(256)), b"\x00" * 5000])
def test_a_binary_or_oversized_key_file_is_refused_by_name(tmp_path, content):
    path = tmp_path / "binary.key"
    path.write_bytes(content)
    path.chmod(0o600)
    result = run("op", "new", "vote", "--key", str(path), "--target", str(f.add().cid), "--value", "+1", "--clock", "2")
    assert result.returncode == 2 and ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert "keyfile.format" in result.stderr and str(path) in result.stderr


def test_a_device_as_key_file_is_refused_unread():
    result = run(
        "op",
        "new",
        "vote",
        "--key",
        "/dev/zero",
        "--target",
        str(f.add().cid),
        "--value",
        "+1",
        "--clock",
        "2",
        preexec_fn=_at_most_4_gib,
    )
    assert result.returncode == 2 and ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    assert "keyfile.permissions" in result.stderr


def test_network_parameters_change_the_rules(key, tmp_path):
    params = tmp_path / "net.json"
    params.write_text(json.dumps({"text_unit": "tokens", "text_max": 5}))
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    result = run("--network", str(params), "op", "inspect", add_hex)
    assert result.returncode == 1
    assert [e["code"] for e in json.loads(result.stdout)["errors"]] == ["text.length"]


@pytest.mark.parametrize(
    "content",
    [
        {"embedding_model": "feature-hash-v1", "embedding_dim": 1_000_000_000},
        {"max_op_bytes": 1 << 40},
        {"text_max": 10**12},
    ],
)
def test_a_network_file_cannot_ask_for_unbounded_resources(key, tmp_path, content):
    params = tmp_path / "net.json"
    params.write_text(json.dumps(content))
    result = run(
        "--network",
        str(params),
        "op",
        "new",
        "add",
        "--key",
        str(key),
        "--text",
        GEOMETRY,
        "--domain",
        "m",
        "--confidence",
        "1",
        preexec_fn=_at_most_4_gib,
    )
    assert result.returncode == 2 and ONE_ERROR_LINE.fullmatch(result.stderr), result.stderr
    name = next(iter(content.keys() - {"embedding_model"}))
    assert f"params.range: {params}: {name}: " in result.stderr and "outside the allowed range" in result.stderr


def test_op_new_builds_on_a_data_directorys_heads_and_resolves_its_conflict(key, tmp_path, hashing_network):
    from ledger.ledger import Ledger

    add = f.add()
    concurrent = [
        f.signed(f.operation(Kind.MODIFY, clock=2, parents=(add.cid,), target=add.cid, content=f.content(text)), k)
        for text, k in ((f.SEED_TEXTS[1], f.author(2)), (f.SEED_TEXTS[2], f.author(3)))
    ]
    node = Ledger.open(tmp_path / "node", f.PARAMS)
    node.ingest([add.data, *(block.data for block in concurrent)])
    assert node.view().experience(add.cid).conflicted
    node.close()
    text = "When two versions of an insight disagree, keep the one that names its bounds."
    args = ["--network", str(hashing_network), "op", "new", "modify", "--key", str(key), "--target", str(add.cid)]
    result = run(*args, "--ledger", str(tmp_path / "node"), "--text", text, "--domain", "math", "--confidence", "0.7")
    assert result.returncode == 0, result.stderr
    resolving = decode_block(bytes.fromhex(result.stdout.strip()))
    assert set(resolving.op.parents) >= {block.cid for block in concurrent} and resolving.op.clock == 3
    node = Ledger.open(tmp_path / "node", f.PARAMS)
    assert node.submit(resolving.data).outcome == "applied"
    record = node.view().experience(add.cid)
    assert not record.conflicted and record.version == resolving.cid
    node.close()
    missing = run(*args, "--ledger", str(tmp_path / "nowhere"), "--text", text, "--domain", "math", "--confidence", "1")
    assert missing.returncode == 2 and "args.ledger" in missing.stderr


# --- what people read: whole texts, wrapped to the terminal ------------------------------------------------

_WORDS = st.text(st.characters(categories=("L", "N", "P", "S"), exclude_characters="…"), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.lists(_WORDS, min_size=1, max_size=60), min_size=1, max_size=5), width=st.integers(1, 200))
def test_retrieve_and_list_show_each_whole_text_wrapped_to_the_width(texts, width) -> None:
    """Every word of every text, in order, under its own row; no line wider than the width (or than the narrowest
    the text column gets, 30 columns, on a narrower terminal) unless a single word is."""
    cid = "bafyreic2yx24j37t2rjrbfg7tnnqrf63vclwbcqlezqotxsapur5v2hmmm"
    hits = {"hits": [{"score": 0.5, "id": cid, "domain": "math", "text": " ".join(words)} for words in texts]}
    records = [{"id": cid, "status": "live", "domain": "m", "support": 1, "votes": {"upvotes": 0, "downvotes": 0}}]
    listed = {"experiences": records * len(texts), "next_cursor": None, "texts": [" ".join(w) for w in texts]}
    for method, result, indent in (("retrieve", hits, 7), ("list", listed, 4)):
        lines = render(method, result, width).splitlines()
        rows = [number for number, line in enumerate(lines) if line.startswith(("0.500", cid))]
        assert len(rows) == len(texts)
        for row, end, words in zip(rows, [*rows[1:], len(lines)], texts, strict=True):
            below = lines[row + 1 : end]
            assert all(line.startswith(" " * indent) for line in below)
            assert " ".join(below).split() == words
            limit = max(width, indent + 30)
            assert all(len(line) <= limit or len(line.split()) == 1 for line in below)


def test_retrieve_uses_the_terminals_width_and_cuts_nothing(monkeypatch) -> None:
    text = "When a long insight arrives, " + "check every case it names and every bound it relies on, " * 4
    hits = {"hits": [{"score": 0.5, "id": "bafyabc", "domain": "math", "text": text.strip()}]}
    monkeypatch.setenv("COLUMNS", "72")
    shown = render("retrieve", hits).splitlines()
    assert shown[0].split() == ["SCORE", "ID", "DOMAIN"] and shown[1].split() == ["0.500", "bafyabc", "math"]
    assert len(shown) > 4 and max(len(line) for line in shown) <= 72 and "…" not in "".join(shown)
    assert " ".join(line.strip() for line in shown[2:]) == text.strip()
    assert render("retrieve", {"hits": []}) == "no experience above the threshold"


def test_a_home_with_no_node_and_no_devnet_running_only_says_to_init(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPLEDGER_")}
    env.update(HOME=str(tmp_path), EXPLEDGER_DEVNET=str(tmp_path / "devnet"))
    bare = run("retrieve", "bounds", env=env)
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1
    assert bare.stderr.startswith(f"expledger: error: home.uninitialised: {tmp_path / '.expledger'}: no config.toml")
