"""`expledger` as a user runs it: keygen, op new for every kind, op inspect, and bad input."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.cid import CID
from tests import factories as f

EXPLEDGER = Path(sys.executable).parent / "expledger"
GEOMETRY = f.SEED_TEXTS[0]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXPLEDGER), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "author.key"
    result = run("keygen", "--out", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("did:key:z6Mk")
    return path


def new(key: Path, *args: str) -> tuple[str, str]:
    """Run `op new` and return (hex, cid)."""
    result = run("op", "new", *args, "--key", str(key))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), result.stderr.strip()


def inspect(source: str, *args: str) -> tuple[int, dict]:
    result = run("op", "inspect", source, *args)
    return result.returncode, json.loads(result.stdout) if result.stdout else {}


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
    _, other_cid = new(key, "add", "--text", f.SEED_TEXTS[1], "--domain", "math.combinatorics", "--confidence", "1")
    view = tmp_path / "exp.json"
    view.write_text(
        json.dumps(
            {"text": f.SEED_TEXTS[2], "domain": "math.proof", "confidence": 0.5, "metadata": {"source": "run-7"}}
        )
    )
    built = {
        "add": add_cid,
        "modify": new(key, "modify", "--target", add_cid, "--json", str(view), "--parents", add_cid, "--clock", "2")[1],
        "delete": new(key, "delete", "--target", other_cid, "--reason", "Proven incorrect")[1],
        "merge": new(
            key,
            "merge",
            "--targets",
            f"{other_cid},{add_cid}",
            "--json",
            str(view),
            "--reason",
            "same",
            "--parents",
            f"{add_cid},{other_cid}",
        )[1],
        "vote": new(key, "vote", "--target", add_cid, "--value", "-1")[1],
    }
    code, report = inspect(add_hex)
    assert code == 0 and report["valid"] and report["cid"] == add_cid
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
        f"{add_cid},{other_cid}",
        "--json",
        str(view),
        "--reason",
        "same",
        "--out",
        str(out),
    )
    assert result.returncode == 0 and result.stdout == ""
    code, report = inspect(str(out))
    assert code == 0
    assert report["operation"]["targets"] == [str(c) for c in sorted(CID.parse(c) for c in (add_cid, other_cid))]
    assert report["operation"]["content"]["source"] == "run-7"


def test_inspect_reports_every_failed_rule_and_exits_nonzero(key):
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    data = bytearray.fromhex(add_hex)
    data[-1] ^= 0x01  # inside the content, after signing
    code, report = inspect(data.hex())
    assert code == 1 and not report["valid"]
    assert [e["code"] for e in report["errors"]] == ["signature.invalid"]
    code, report = inspect("a0")
    assert code == 1 and report["errors"][0]["code"] == "schema.missing"
    code, report = inspect("ff")
    assert code == 1 and report["errors"][0]["code"] == "codec.malformed"
    code, report = inspect(add_hex, "--cid", "bafyreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
    assert code == 1 and report["errors"][0]["code"] == "cid.mismatch"


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
        (["op", "new", "add", "--json", "/nonexistent.json"], "--json: cannot read"),
        (["op", "new", "add", "--clock", "0", "--text", "t"], "must be at least 1"),
        (["op", "new", "add", "--example", "{bad", "--text", GEOMETRY], "--example: not JSON"),
        (["op", "inspect", "not-hex-or-file"], "neither a readable file nor hex"),
        (["--network", "/nonexistent.json", "op", "inspect", "a0"], "params.file"),
        (["op", "new", "vote", "--target", str(f.add().cid), "--value", "+1", "--out", "/nonexistent/dir/op"], "Error"),
    ],
)
def test_bad_arguments_exit_2_with_a_precise_message(key, args, needle):
    if args[:2] == ["op", "new"]:
        args = [*args, "--key", str(key)]
    result = run(*args)
    assert result.returncode == 2, result.stdout
    assert needle in result.stderr


def test_a_readable_key_file_is_refused(key, tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_text(key.read_text())
    loose.chmod(0o644)
    result = run("op", "new", "vote", "--key", str(loose), "--target", str(f.add().cid), "--value", "+1")
    assert result.returncode == 2
    assert "keyfile.permissions" in result.stderr


def test_network_parameters_change_the_rules(key, tmp_path):
    params = tmp_path / "net.json"
    params.write_text(json.dumps({"text_unit": "tokens", "text_max": 5}))
    add_hex, _ = new(key, "add", "--text", GEOMETRY, "--domain", "math", "--confidence", "0.5")
    result = run("--network", str(params), "op", "inspect", add_hex)
    assert result.returncode == 1
    assert [e["code"] for e in json.loads(result.stdout)["errors"]] == ["text.length"]
