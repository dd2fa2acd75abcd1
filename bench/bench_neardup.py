"""Near-duplicate candidates (PROTOCOL §7.6): how often a pair above the threshold is missed, how many
candidates an add meets, and what a lookup costs against comparing with the whole library.

Usage: python -m bench.bench_neardup [--library 50000] [--pairs 3000]

Real WordLlama embeddings of experience-like sentences (bench_index's generator). Near-duplicate
pairs are trivial edits of library sentences (a dropped period, a semicolon, an article, a
trailing space, a lower-case first word, a changed preposition); every pair whose exact cosine
is above the network threshold must share a band, or the protocol misses it (on every node).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from fractions import Fraction

import numpy as np

from bench.bench_index import embed_all, texts
from ledger.embedder import embedder_for, pack_float16
from ledger.neardup import BANDS, BITS, band_keys, exact_cosine_exceeds
from ledger.params import NetworkParams


def _edits(text: str) -> list[str]:
    edits = [
        text.rstrip("."),
        text.replace(", ", "; ", 1),
        text.replace(" and ", " and the ", 1),
        text + " ",
        text.replace("When", "when", 1),
        text.replace("working on", "working with", 1),
    ]
    return [edit for edit in edits if edit != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", type=int, default=50_000)
    parser.add_argument("--pairs", type=int, default=3000, help="library sentences to edit")
    args = parser.parse_args(argv)
    params = NetworkParams()
    model, dim, threshold = params.embedding_model, params.embedding_dim, Fraction(params.near_duplicate_cosine)
    embedder = embedder_for(params)
    rng = random.Random(7)

    library = texts(args.library, rng)
    print(f"embedding {len(library):,} sentences ...", file=sys.stderr, flush=True)
    vectors = [pack_float16(row) for row in embed_all(embedder, library)]
    start = time.perf_counter()
    bands = [band_keys(values, model, dim) for values in vectors]
    signing = (time.perf_counter() - start) / len(vectors)
    buckets: dict[bytes, list[int]] = defaultdict(list)
    for row, keys in enumerate(bands):
        for key in keys:
            buckets[key].append(row)

    originals = rng.sample(range(len(library)), args.pairs)
    above = missed = 0
    cosines = []
    for row in originals:
        edits = _edits(library[row])
        for values in (pack_float16(v) for v in embedder.embed(edits)):
            if not exact_cosine_exceeds(vectors[row], values, threshold):
                continue
            above += 1
            cosines.append(float(np.dot(*(np.frombuffer(v, "<f2").astype(np.float64) for v in (vectors[row], values)))))
            if not set(bands[row]) & set(band_keys(values, model, dim)):
                missed += 1

    sample = rng.sample(range(len(library)), 1000)
    counts = sorted(len({other for key in bands[row] for other in buckets[key]}) - 1 for row in sample)
    matrix = np.stack([np.frombuffer(v, "<f2").astype(np.float32) for v in vectors])
    start = time.perf_counter()
    for row in sample[:200]:
        matrix @ matrix[row]
    scan = (time.perf_counter() - start) / 200

    print(f"library of {len(library):,} experience-like sentences, {BANDS} bands of {BITS} bits")
    print(
        f"  pairs above the threshold ({float(threshold)})  {above:,} (cosine {min(cosines):.4f} to {max(cosines):.4f})"
    )
    print(f"  missed (no band in common)       {missed:,}")
    print(f"  candidates per add               mean {np.mean(counts):.1f}, p99 {counts[int(len(counts) * 0.99)]}")
    print(f"  band signature of one add        {signing * 1e6:.0f} µs")
    print(f"  scanning the library instead     {scan * 1e3:.2f} ms per add (float32 matrix product)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
