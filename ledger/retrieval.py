"""Retrieval (the retrieval seed): top-k experiences for a query, the context-injection prompt, coverage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ledger.cid import CID
from ledger.embedder import unit, unpack_float16
from ledger.ledger import Ledger
from ledger.validation import count_tokens

DEFAULT_K = 5
DEFAULT_BUDGET = 2048  # tokens, as the retrieval seed's "max context length"


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


class Retriever:
    """Answers queries from a ledger's index with its network's embedder and thresholds."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def _query_vector(self, query: str) -> np.ndarray:
        return unit(self._ledger.embedder.embed([query])[0].astype(np.float32))

    def retrieve(
        self, query: str, k: int = DEFAULT_K, threshold: float | None = None, domain_prefix: str | None = None
    ) -> list[Hit]:
        """The k live experiences most similar to `query` above `threshold`, best first.

        Scores are exact float32 cosines against each experience's stored embedding; the HNSW
        index proposes candidates. With a domain filter the live experiences of that domain are
        scored exhaustively, so the filter never starves the result.
        """
        if k <= 0:
            return []
        threshold = self._ledger.params.relevance_threshold if threshold is None else threshold
        vector = self._query_vector(query)
        view = self._ledger.view()
        if domain_prefix:
            candidates = view.live_ids(domain_prefix)
        else:
            candidates = [exp_id for exp_id, _ in self._ledger.nearest(vector, max(k * 2, k + 8))]
        hits = []
        for exp_id in candidates:
            record = view.experience(exp_id)
            if record is None or not record.live:
                continue  # never serve a deleted, merged-away or superseded version
            content = view.content(record.version)
            score = float(unit(unpack_float16(content.embedding.values)) @ vector)
            if score > threshold:
                hits.append(
                    Hit(
                        exp_id,
                        content.text,
                        record.domain,
                        score,
                        content.confidence,
                        record.up,
                        record.down,
                        record.conflicted,
                    )
                )
        hits.sort(key=lambda hit: (-hit.score, hit.id.raw))
        return hits[:k]

    def context(
        self,
        query: str,
        k: int = DEFAULT_K,
        threshold: float | None = None,
        budget: int = DEFAULT_BUDGET,
        domain_prefix: str | None = None,
    ) -> str:
        """The retrieval seed's prompt prefix, keeping the best experiences that fit in `budget` tokens."""
        problem = f"---\n\n# Problem\n\n{query}"
        hits = self.retrieve(query, k, threshold, domain_prefix)
        items: list[str] = []
        for hit in hits:
            candidate = [*items, f"{len(items) + 1}. {hit.text}"]
            if count_tokens(_render(candidate, problem)) > budget:
                break
            items = candidate
        return _render(items, problem) if items else f"# Problem\n\n{query}"

    def coverage(self, queries: Sequence[str], tau: float | None = None) -> float:
        """C(E, Q): the share of queries whose best experience scores above tau (retrieval seed §Coverage)."""
        if not queries:
            return 0.0
        tau = self._ledger.params.relevance_threshold if tau is None else tau
        return sum(1 for query in queries if self.retrieve(query, 1, tau)) / len(queries)


def _render(items: list[str], problem: str) -> str:
    return "# Learned Experiences\n\n" + "\n\n".join(items) + "\n\n" + problem
