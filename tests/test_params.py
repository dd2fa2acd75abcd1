"""Network parameter files: defaults, overrides, and precise errors."""

import json
from pathlib import Path

import pytest

from ledger.params import INT_RANGES, MAX_FILE_BYTES, NetworkParams, ParamsError


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


def test_todays_defaults_are_within_the_bounds():
    for model in ("wordllama-l2supercat-256-numpy", "feature-hash-v1"):
        params = NetworkParams(embedding_model=model)
        for name, (low, high) in INT_RANGES.items():
            assert low <= getattr(params, name) <= high, name


@pytest.mark.parametrize("name", sorted(INT_RANGES))
def test_every_integer_parameter_is_bounded_on_both_sides(tmp_path, name):
    low, high = INT_RANGES[name]
    path = tmp_path / "net.json"
    for inside in (low, high):
        path.write_text(json.dumps({"embedding_model": "feature-hash-v1", name: inside}))
        assert getattr(NetworkParams.from_file(path), name) == inside
    for outside in (low - 1, high + 1, 10**30):
        path.write_text(json.dumps({"embedding_model": "feature-hash-v1", name: outside}))
        with pytest.raises(ParamsError) as caught:
            NetworkParams.from_file(path)
        assert caught.value.code == "params.range"
        assert f"{name}: {outside} is outside the allowed range {low}..{high}" in caught.value.message
        assert str(path) in caught.value.message


def test_the_bounds_hold_for_parameters_built_in_code_too():
    with pytest.raises(ParamsError) as caught:
        NetworkParams(embedding_model="feature-hash-v1", embedding_dim=1_000_000_000)
    assert caught.value.code == "params.range" and caught.value.message.startswith("embedding_dim:")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"near_duplicate_cosine": 1.0}, "near_duplicate_cosine"),
        ({"embedding_epsilon": 0.0}, "embedding_epsilon"),
        ({"embedding_model": "x" * 129}, "embedding_model"),
        ({"embedding_model": "two words", "embedding_epsilon": 0.1}, "embedding_model"),
        ({"embedding_model": ""}, "embedding_model"),
    ],
)
def test_floats_and_the_model_name_are_bounded(tmp_path, content, needle):
    path = tmp_path / "net.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == "params.range" and needle in caught.value.message


def test_nan_is_out_of_every_range(tmp_path):
    path = tmp_path / "net.json"
    path.write_text('{"relevance_threshold": NaN}')
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == "params.range" and "relevance_threshold" in caught.value.message


def test_a_repeated_parameter_is_refused(tmp_path):
    path = tmp_path / "net.json"
    path.write_text('{"text_max": 32, "text_max": 4096}')
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == "params.duplicate" and "'text_max'" in caught.value.message


@pytest.mark.parametrize("source", ["/dev/zero", "huge"])
def test_a_huge_file_is_refused_after_a_bounded_read(tmp_path, source):
    path = Path(source) if source.startswith("/") else tmp_path / source
    if not source.startswith("/"):
        path.write_text(" " * MAX_FILE_BYTES + "{}")  # valid JSON, but no parameter file is this large
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == "params.file" and f"larger than {MAX_FILE_BYTES} bytes" in caught.value.message


def test_a_binary_file_is_refused_by_name(tmp_path):
    path = tmp_path / "net.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ParamsError) as caught:
        NetworkParams.from_file(path)
    assert caught.value.code == "params.file" and str(path) in caught.value.message
