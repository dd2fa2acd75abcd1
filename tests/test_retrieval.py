"""Retrieval over the index: ranking, the filters, never a dead version, the prompt and coverage."""

import numpy as np
import pytest

from ledger.embedder import pack_float16
from ledger.ops import Embedding, Kind
from ledger.params import NetworkParams
from ledger.retrieval import Retriever
from ledger.validation import count_tokens
from tests import factories as f
from tests.ledgers import open_ledger

GEOMETRY_QUERY = "Find the intersection of line AB with segment CD inside the triangle; is the point on the segment?"
PARAMS = NetworkParams(relevance_threshold=0.05)


@pytest.fixture
def seeded(tmp_path):
    ledger = open_ledger(tmp_path / "n")
    blocks = [
        f.add(text, f.author(i + 1), domain=domain)
        for i, (text, domain) in enumerate(
            zip(
                f.SEED_TEXTS,
                [("math", "geometry"), ("math", "combinatorics"), ("math", "proof"), ("math", "algebra")],
                strict=True,
            )
        )
    ]
    ledger.ingest([b.data for b in blocks])
    ledger.params = PARAMS
    yield ledger, blocks
    ledger.close()


def test_a_geometry_query_retrieves_the_geometry_experience_first(seeded):
    ledger, blocks = seeded
    hits = Retriever(ledger).retrieve(GEOMETRY_QUERY)
    assert hits[0].id == blocks[0].cid
    assert hits[0].domain == "math.geometry" and hits[0].text == f.SEED_TEXTS[0]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_threshold_and_k_limit_results(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    assert len(retriever.retrieve(GEOMETRY_QUERY, k=2)) <= 2
    assert retriever.retrieve(GEOMETRY_QUERY, threshold=0.99) == []


def test_domain_filter(seeded):
    ledger, blocks = seeded
    hits = Retriever(ledger).retrieve("separate real and imaginary parts of a polynomial", domain_prefix="math.algebra")
    assert [h.id for h in hits] == [blocks[3].cid]
    assert Retriever(ledger).retrieve(GEOMETRY_QUERY, domain_prefix="biology") == []


def test_deleted_merged_and_superseded_versions_are_never_returned(seeded):
    ledger, blocks = seeded
    geometry, combinatorics, proof, _ = blocks
    new_text = "When intersecting lines with segments, check each solution lies on the segment, not its extension."
    modify = f.signed(
        f.operation(Kind.MODIFY, clock=2, parents=[geometry.cid], target=geometry.cid, content=f.content(new_text)),
        f.author(5),
    )
    delete = f.signed(f.operation(Kind.DELETE, clock=2, parents=[proof.cid], target=proof.cid, reason="wrong"))
    merge = f.signed(
        f.operation(
            Kind.MERGE,
            clock=3,
            parents=[combinatorics.cid, modify.cid],
            targets=tuple(sorted((combinatorics.cid, geometry.cid))),
            content=f.content(f.SEED_TEXTS[1], domain=("math",)),
            reason="same",
        )
    )
    retriever = Retriever(ledger)
    ledger.ingest([modify.data, delete.data])
    texts = [h.text for h in retriever.retrieve(GEOMETRY_QUERY, k=10, threshold=0.0)]
    assert new_text in texts and f.SEED_TEXTS[0] not in texts and f.SEED_TEXTS[2] not in texts
    ledger.ingest([merge.data])
    ids = {h.id for h in retriever.retrieve(GEOMETRY_QUERY, k=10, threshold=0.0)}
    assert merge.cid in ids and not ids & {geometry.cid, combinatorics.cid, proof.cid}


def test_forged_embeddings_are_void_on_every_node(tmp_path):
    honest = f.add()
    other = f.content(f.SEED_TEXTS[3])
    stolen = f.signed(
        f.operation(
            Kind.ADD, content=f.content(f.SEED_TEXTS[0]).__class__(f.SEED_TEXTS[0], ("math",), 0.5, other.embedding)
        ),
        f.author(7),
    )
    rng = np.random.default_rng(1)
    random_vector = pack_float16(rng.standard_normal(f.PARAMS.embedding_dim).astype(np.float32))
    random_embedding = f.signed(
        f.operation(
            Kind.ADD,
            content=f.content(f.SEED_TEXTS[1]).__class__(
                f.SEED_TEXTS[1], ("math",), 0.5, Embedding(f.EMBEDDER.model_id, f.EMBEDDER.dim, random_vector)
            ),
        ),
        f.author(8),
    )
    for name in ("a", "b"):
        node = open_ledger(tmp_path / name)
        outcomes = node.ingest([honest.data, stolen.data, random_embedding.data])
        assert [o.status for o in outcomes] == ["applied", "invalid", "invalid"]
        assert {o.errors[0].code for o in outcomes[1:]} == {"embedding.inconsistent"}
        assert node.live_ids() == [honest.cid] and node.index.ids() == {honest.cid.raw}
        node.close()


def test_context_follows_the_seed_template(seeded):
    ledger, _ = seeded
    prompt = Retriever(ledger).context(GEOMETRY_QUERY, k=2)
    head, problem = prompt.split("\n\n---\n\n")
    assert head.startswith("# Learned Experiences\n\n1. ")
    assert "\n\n2. " in head
    assert problem == f"# Problem\n\n{GEOMETRY_QUERY}"


def test_context_fits_the_token_budget(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    full = retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0)
    assert full.count("\n\n4. ") == 1
    best_only = retriever.context(GEOMETRY_QUERY, k=1, threshold=0.0)
    budget = count_tokens(best_only)
    assert retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0, budget=budget) == best_only
    assert retriever.context(GEOMETRY_QUERY, k=4, threshold=0.0, budget=budget - 1) == f"# Problem\n\n{GEOMETRY_QUERY}"
    assert retriever.context(GEOMETRY_QUERY, threshold=0.99) == f"# Problem\n\n{GEOMETRY_QUERY}"


def test_coverage_counts_queries_with_a_relevant_experience(seeded):
    ledger, _ = seeded
    retriever = Retriever(ledger)
    queries = [GEOMETRY_QUERY, "?!"]  # the second embeds to nothing: no experience covers it
    assert retriever.coverage(queries, tau=0.05) == 0.5
    assert retriever.coverage(queries, tau=0.999) == 0.0
    assert retriever.coverage([]) == 0.0
