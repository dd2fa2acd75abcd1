"""The hashing embedder is deterministic, unit-length and meaningful enough to test with."""

import json
import os
import struct
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.embedder import (
    EmbedderError,
    HashingEmbedder,
    WordLlamaEmbedder,
    embedder_for,
    exactly_within_distance,
    pack_float16,
    unit,
    unpack_float16,
    within_distance,
    within_distances,
)
from ledger.ledger import Ledger
from ledger.params import NetworkParams, ParamsError
from tests.factories import SEED_TEXTS


def test_vectors_are_unit_float32_and_deterministic():
    embedder = HashingEmbedder(256)
    first = embedder.embed(list(SEED_TEXTS))
    assert first.dtype == np.float32 and first.shape == (4, 256)
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(first, HashingEmbedder(256).embed(list(SEED_TEXTS)))
    assert np.array_equal(first[1], embedder.embed([SEED_TEXTS[1]])[0])


def test_related_texts_score_higher_than_unrelated():
    embedder = HashingEmbedder(256)
    geometry, paraphrase, other = embedder.embed(
        [
            SEED_TEXTS[0],
            "When solving geometry intersection problems, validate that solutions lie within bounded segments.",
            "For complex polynomials with real parameters, separate real and imaginary parts.",
        ]
    )
    assert float(geometry @ paraphrase) > float(geometry @ other) + 0.2


def test_text_without_words_embeds_to_zero():
    assert not HashingEmbedder(64).embed(["!!!"]).any()


def test_float16_packing_round_trips_within_half_precision():
    vector = HashingEmbedder(256).embed([SEED_TEXTS[2]])[0]
    packed = pack_float16(vector)
    assert len(packed) == 512
    assert np.allclose(unpack_float16(packed), vector, atol=1e-3)
    assert packed[:2] == struct.pack("<e", vector[0])  # IEEE half precision, little-endian


def test_pinned_model_must_be_loadable():
    assert embedder_for(NetworkParams(embedding_model="feature-hash-v1", embedding_dim=128)).dim == 128
    calibrated = {"relevance_threshold": 0.6, "near_duplicate_cosine": 0.9, "embedding_epsilon": 0.01}
    for params, needle in [
        (NetworkParams(embedding_model="zen-reranker-7680", embedding_dim=7680, **calibrated), "zen-reranker-7680"),
        (NetworkParams(embedding_dim=768), "768"),
    ]:
        with pytest.raises(EmbedderError) as caught:
            embedder_for(params)
        assert caught.value.code == "embedder.unavailable"
        assert needle in caught.value.message


def test_a_model_without_calibrated_thresholds_needs_them_set():
    with pytest.raises(ParamsError) as caught:
        NetworkParams(embedding_model="zen-reranker-7680")
    assert caught.value.code == "params.missing"


def test_the_default_model_is_real_deterministic_and_batch_independent():
    embedder = embedder_for(NetworkParams())
    assert isinstance(embedder, WordLlamaEmbedder)
    together = embedder.embed([*SEED_TEXTS, ""])
    alone = np.vstack([embedder.embed([text]) for text in SEED_TEXTS])
    assert np.array_equal(together[:4], alone)
    assert np.allclose(np.linalg.norm(together[:4], axis=1), 1.0, atol=1e-6) and not together[4].any()
    query = embedder.embed(["Which intersection points of a line and a circle lie on the segment AB?"])[0]
    scores = together[:4] @ query
    assert scores.argmax() == 0 and scores[0] > NetworkParams().relevance_threshold


def test_a_node_that_cannot_load_the_pinned_model_refuses_to_start(tmp_path):
    calibrated = {"relevance_threshold": 0.6, "near_duplicate_cosine": 0.9, "embedding_epsilon": 0.01}
    params = NetworkParams(embedding_model="zen-reranker-7680", embedding_dim=7680, **calibrated)
    with pytest.raises(EmbedderError, match="zen-reranker-7680"):
        Ledger.open(tmp_path / "node", params)
    assert not (tmp_path / "node").exists()


@pytest.mark.parametrize(
    "embedder", [HashingEmbedder(256), embedder_for(NetworkParams())], ids=["hashing", "wordllama"]
)
def test_directions_point_where_the_embeddings_point(embedder):
    texts = [*SEED_TEXTS, "When a loop is slow, profile first."]
    for vector, direction in zip(embedder.embed(texts), embedder.directions(texts), strict=True):
        assert np.allclose(unit(np.asarray(direction, dtype=np.float64)), vector, atol=1e-6)
        assert within_distance(pack_float16(vector), direction, Fraction(1, 500))


def _integer_sum(table: np.ndarray, rows: np.ndarray) -> list[int]:
    """The rows made integers (scaled by 2^24), then summed: int64 holds every sum below 2^63."""
    return (table[rows].astype(np.float64) * (1 << 24)).astype(np.int64).sum(axis=0).tolist()


@settings(deadline=None)  # the first example loads the model
@given(st.lists(st.integers(0, 31999), max_size=300), st.sampled_from([1, 50]))
def test_directions_are_the_exact_sums_of_the_scaled_rows(ids, repeat):
    """The pinned model's directions, summed in float64, equal the rows made integers first and summed as such
    (up to 15,000 tokens, the largest values of the table among them)."""
    model = embedder_for(NetworkParams())
    table = model._table16
    largest = [int(i) for i in np.argsort(np.abs(table.astype(np.float32)).max(axis=1))[-3:]]
    rows = np.asarray((ids + largest) * repeat, dtype=np.intp)
    assert (table[rows].sum(axis=0, dtype=np.float64) * (1 << 24)).astype(np.int64).tolist() == _integer_sum(
        table, rows
    )
    text = " ".join(model._tokenizer.id_to_token(i) or "" for i in ids[:20])
    assert model.directions([text]).tolist() == [_integer_sum(table, ids) for ids in model._token_ids([text])]


@given(
    st.lists(st.integers(-1000, 1000), min_size=8, max_size=8),
    st.lists(st.floats(-0.05, 0.05), min_size=8, max_size=8),
    st.sampled_from([Fraction(1, 500), Fraction(1, 50), Fraction(1, 5)]),
)
def test_the_exact_distance_test_agrees_with_floating_point_away_from_the_boundary(direction, noise, epsilon):
    target = unit(np.asarray(direction, dtype=np.float64))
    values = pack_float16((target + np.asarray(noise)).astype(np.float32))
    distance = float(np.linalg.norm(np.frombuffer(values, dtype="<f2").astype(np.float64) - target))
    if abs(distance - float(epsilon)) > 1e-9:
        assert within_distance(values, direction, epsilon) == (distance <= float(epsilon))


@given(
    st.lists(st.integers(-(2**40), 2**40), min_size=16, max_size=16),
    st.lists(st.floats(-1, 1), min_size=16, max_size=16),
    st.floats(0.999, 1.001),
)
def test_the_floating_point_shortcut_agrees_with_the_integers_at_the_boundary(direction, noise, scale):
    epsilon = Fraction(1, 500)
    target = unit(np.asarray(direction, dtype=np.float64))
    offset = unit(np.asarray(noise, dtype=np.float64)) * float(epsilon) * scale
    values = pack_float16((target + offset).astype(np.float32))
    assert within_distance(values, direction, epsilon) == exactly_within_distance(values, direction, epsilon)


@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(-(2**40), 2**40), min_size=16, max_size=16),
            st.lists(st.floats(-1, 1), min_size=16, max_size=16),
            st.floats(0.0, 2.0),
        ),
        max_size=20,
    )
)
def test_a_batch_of_verdicts_is_each_vector_judged_alone(cases):
    """`within_distances` judges rows in one pass: each verdict is the exact one for that row alone (near the bound,
    far inside, far outside, and with no direction at all)."""
    epsilon = Fraction(1, 500)
    values, directions = [], []
    for direction, noise, scale in cases:
        target = unit(np.asarray(direction, dtype=np.float64))
        offset = unit(np.asarray(noise, dtype=np.float64)) * float(epsilon) * scale
        values.append(pack_float16((target + offset).astype(np.float32)))
        directions.append(direction)
    rows = np.asarray(directions, dtype=np.int64).reshape(len(cases), 16)
    alone = [
        exactly_within_distance(vector, direction, epsilon)
        for vector, direction in zip(values, directions, strict=True)
    ]
    assert within_distances(values, rows, epsilon) == alone


def test_a_batch_of_verdicts_refuses_vectors_that_do_not_pair_up():
    with pytest.raises(ValueError, match="do not pair up"):
        within_distances([b"\x00" * 8, b"\x00" * 6], np.ones((2, 4), dtype=np.int64), Fraction(1, 500))


def test_no_direction_only_accepts_a_vector_near_zero():
    assert within_distance(pack_float16(np.zeros(4, dtype=np.float32)), [0, 0, 0, 0], Fraction(1, 500))
    assert not within_distance(pack_float16(np.ones(4, dtype=np.float32)), [0, 0, 0, 0], Fraction(1, 500))


@pytest.mark.parametrize(("preset", "expected"), [(None, "false"), ("true", "true")])
@pytest.mark.parametrize("numpy_first", [False, True])
def test_importing_the_ledger_keeps_native_thread_pools_to_one_thread(preset, expected, numpy_first):
    """OpenBLAS's and the tokenizer's worker threads spin between calls, on cores the node needs (ledger/__init__),
    whether numpy loads after the ledger (its BLAS reads the variable) or before (limited in place)."""
    env = {
        key: value for key, value in os.environ.items() if key not in ("TOKENIZERS_PARALLELISM", "OPENBLAS_NUM_THREADS")
    }
    if preset is not None:
        env["TOKENIZERS_PARALLELISM"] = preset
    imports = "numpy, ledger" if numpy_first else "ledger, numpy"
    script = (
        f"import json, os, {imports}, threadpoolctl; "
        "print(json.dumps([os.environ['TOKENIZERS_PARALLELISM'], "
        "[pool['num_threads'] for pool in threadpoolctl.threadpool_info() if pool['user_api'] == 'blas']]))"
    )
    output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    tokenizers, blas = json.loads(output.stdout)
    assert tokenizers == expected
    assert blas and set(blas) == {1}
