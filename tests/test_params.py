"""Network parameter files: defaults, overrides, and precise errors."""

import json

import pytest

from ledger.params import NetworkParams, ParamsError


def test_defaults_follow_the_first_format_seed():
    params = NetworkParams()
    assert (params.text_unit, params.text_max) == ("words", 32)


def test_file_overrides_defaults(tmp_path):
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"text_unit": "tokens", "text_max": 256, "embedding_dim": 768}))
    params = NetworkParams.from_file(path)
    assert (params.text_unit, params.text_max, params.embedding_dim, params.max_examples) == ("tokens", 256, 768, 8)


@pytest.mark.parametrize(
    ("content", "code", "needle"),
    [
        ("{", "params.file", "net.json"),
        ("[]", "params.type", "JSON object"),
        ('{"text_max": "32"}', "params.type", "text_max"),
        ('{"text_max": 0}', "params.range", "text_max"),
        ('{"text_max": true}', "params.type", "text_max"),
        ('{"text_unit": "chars"}', "params.range", "text_unit"),
        ('{"quorum": 3}', "params.unknown", "quorum"),
        ('{"max_parents": 300}', "params.range", "max_parents"),
        ("[" * 100_000 + "]" * 100_000, "params.file", "net.json"),
    ],
)
def test_bad_files_give_a_code_and_name_the_field(tmp_path, content, code, needle):
    path = tmp_path / "net.json"
    path.write_text(content)
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == code
    assert needle in caught.value.message


def test_missing_file(tmp_path):
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(tmp_path / "absent.json")
    assert caught.value.code == "params.file"
