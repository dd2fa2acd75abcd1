"""Retrieval (the retrieval seed): top-k experiences for a query, the context-injection prompt, coverage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ledger.cid import CID
from ledger.embedder import unit, unpack_float16
from ledger.ledger import Ledger
from ledger.local_index import LocalRetrieval
from ledger.local_model import NETWORK
from ledger.ops import Experience
from ledger.records import ExperienceRecord
from ledger.validation import count_tokens
from ledger.view import LedgerView

DEFAULT_K = 5
DEFAULT_BUDGET = 2048  # tokens, as the retrieval seed's "max context length"


#: a query embeds at most this many experiences that lack a local vector itself (~12 ms each with MiniLM), so a
#: library that just grew by a few is ranked by the local model at once, the same on every node
INLINE_EMBED = 4


@dataclass(frozen=True, slots=True)
class Hit:
    id: CID
    text: str
    domain: str
    score: float
    confidence: float
    upvotes: int
    downvotes: int
    conflicted: bool  # concurrent modifies disagree: `text` is one of several versions
    ranked_by: str = NETWORK  # the model whose cosine `score` is: a local model, or the network's embedding


class Retriever:
    """Answers queries from a ledger: with a node-local model where it has vectors, else the network embedding.

    A local model's hits and the network's (for experiences not embedded locally yet) are ranked together by how
    far each score lies above its model's threshold, then by id: the same library gives the same answer.
    """

    def __init__(self, ledger: Ledger, local: LocalRetrieval | None = None) -> None:
        self._ledger = ledger
        self.local = local

    @property
    def threshold(self) -> float:
        """The default threshold of the model that ranks (the local one's, if any)."""
        return self.local.model.threshold if self.local else self._ledger.params.relevance_threshold

    def _query_vector(self, query: str) -> np.ndarray:
        return unit(self._ledger.embedder.embed([query])[0].astype(np.float32))

    def retrieve(
        self, query: str, k: int = DEFAULT_K, threshold: float | None = None, domain_prefix: str | None = None
    ) -> list[Hit]:
        """The k live experiences most similar to `query` above `threshold`, best first.

        Network scores are exact float32 cosines against each experience's stored embedding; the HNSW index
        proposes candidates. With a domain filter the live experiences of that domain are scored exhaustively,
        so the filter never starves the result. `threshold` is the local model's when one ranks; the network
        embedding's hits then need the same margin above the network's threshold.
        """
        if k <= 0:
            return []
        with self._ledger.reads.reading():  # the writer and the index thread give way meanwhile
            return self._retrieve(query, k, self.threshold if threshold is None else threshold, domain_prefix)

    def _retrieve(self, query: str, k: int, threshold: float, domain_prefix: str | None) -> list[Hit]:
        view = self._ledger.view()
        count = max(k * 2, k + 8)
        vector = self._query_vector(query)
        candidates = view.live_ids(domain_prefix) if domain_prefix else None
        if candidates is None:
            candidates = [exp_id for exp_id, _ in self._ledger.nearest(vector, count)]
        ranked: dict[bytes, tuple[float, Hit]] = {}
        unembedded = []
        held = {}  # candidates the local index held when checked: the embedding task may drop one meanwhile
        for exp_id in candidates:
            record = view.experience(exp_id)
            if record is None or not record.live:
                continue  # never serve a deleted, merged-away or superseded version
            if self.local and self.local.index.holds(exp_id.raw, record.version.raw):
                held[exp_id.raw] = record
                continue  # ranked by the local model below
            content = view.content(record.version)
            unembedded.append((record, content))
        network_floor = threshold
        if self.local:
            network_floor = self._ledger.params.relevance_threshold + (threshold - self.local.model.threshold)
            local_vector = self.local.model.embed_query(query)
            inline: dict[bytes, float] = {}
            if len(unembedded) <= INLINE_EMBED:
                # scored from the vectors just made, which the embedding task may drop from the index meanwhile:
                # it keeps what the vector index has been told of, and a commit is visible before it is told
                made = self.local.embed([(r.id.raw, r.version.raw, c.text) for r, c in unembedded])
                inline = {exp_id: _score(vector, local_vector) for exp_id, vector in made.items()}
                unembedded = []
            if domain_prefix:
                local_scores = self._local_scores(view.live_ids(domain_prefix), view, local_vector)
            else:
                local_scores = self.local.index.search(local_vector, count)
            found = {exp_id for exp_id, _ in local_scores}
            local_scores = [*local_scores, *(item for item in inline.items() if item[0] not in found)]
            for exp_id, score in local_scores:
                record = view.experience(CID(exp_id))
                if record is None or not record.live:
                    continue
                if exp_id not in inline and not self.local.index.holds(exp_id, record.version.raw):
                    continue  # the index may be ahead of or behind this view
                if score > threshold:
                    hit = _hit(record, view.content(record.version), score, self.local.model.name)
                    ranked[exp_id] = (score - threshold, hit)
            # the embedding task keeps only what the vector index has been told of, and a commit is visible before
            # it is told: a candidate embedded inline by an earlier query may have left the local index since it
            # was checked above (a documented example lost its only hit so); it is embedded inline again
            lost = [r for exp_id, r in held.items() if not self.local.index.holds(exp_id, r.version.raw)]
            made = self.local.embed([(r.id.raw, r.version.raw, view.content(r.version).text) for r in lost])
            for record in lost:
                score = _score(made[record.id.raw], local_vector)
                if score > threshold:
                    hit = _hit(record, view.content(record.version), score, self.local.model.name)
                    ranked[record.id.raw] = (score - threshold, hit)
        for record, content in unembedded:
            score = float(unit(unpack_float16(content.embedding.values)) @ vector)
            if score > network_floor:
                ranked[record.id.raw] = (score - network_floor, _hit(record, content, score, NETWORK))
        best = sorted(ranked.items(), key=lambda item: (-item[1][0], item[0]))
        return [hit for _, (_, hit) in best[:k]]

    def _local_scores(self, ids: list[CID], view: LedgerView, query: np.ndarray) -> list[tuple[bytes, float]]:
        """Exact local scores of the given experiences that have a vector (as the index scores them)."""
        assert self.local is not None
        found = []
        for exp_id in ids:
            record = view.experience(exp_id)
            if record is None:
                continue
            row = self.local.index.vector(exp_id.raw, record.version.raw)
            if row is not None:
                found.append((exp_id.raw, _score(row, query)))
        return found

    def context(
        self,
        query: str,
        k: int = DEFAULT_K,
        threshold: float | None = None,
        budget: int = DEFAULT_BUDGET,
        domain_prefix: str | None = None,
    ) -> str:
        """The retrieval seed's prompt prefix, keeping the best experiences that fit in `budget` tokens."""
        return self.injection(query, k, threshold, budget, domain_prefix)[0]

    def injection(
        self,
        query: str,
        k: int = DEFAULT_K,
        threshold: float | None = None,
        budget: int = DEFAULT_BUDGET,
        domain_prefix: str | None = None,
    ) -> tuple[str, list[Hit]]:
        """`context`'s prompt and the hits it holds (those that fit in the budget): what a serve counts."""
        problem = f"---\n\n# Problem\n\n{query}"
        hits = self.retrieve(query, k, threshold, domain_prefix)
        items: list[str] = []
        for hit in hits:
            candidate = [*items, f"{len(items) + 1}. {hit.text}"]
            if count_tokens(_render(candidate, problem)) > budget:
                break
            items = candidate
        if not items:
            return f"# Problem\n\n{query}", []
        return _render(items, problem), hits[: len(items)]

    def coverage(self, queries: Sequence[str], tau: float | None = None) -> float:
        """C(E, Q): the share of queries whose best experience scores above tau (retrieval seed §Coverage)."""
        if not queries:
            return 0.0
        tau = self.threshold if tau is None else tau
        return sum(1 for query in queries if self.retrieve(query, 1, tau)) / len(queries)


def _score(vector: np.ndarray, query: np.ndarray) -> float:
    """A local vector's exact score for a query, from the float16 values the index keeps."""
    row = np.asarray(vector, dtype="<f2").astype(np.float64)
    return float((row * np.asarray(query).astype(np.float64)).sum())


def _hit(record: ExperienceRecord, content: Experience, score: float, ranked_by: str) -> Hit:
    return Hit(
        record.id,
        content.text,
        record.domain,
        score,
        content.confidence,
        record.up,
        record.down,
        record.conflicted,
        ranked_by,
    )


def _render(items: list[str], problem: str) -> str:
    return "# Learned Experiences\n\n" + "\n\n".join(items) + "\n\n" + problem
