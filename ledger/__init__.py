"""The data layer: encoding, identity, keys, operations and their validation. Synchronous, no networking."""

import contextlib
import ctypes
import os
import sys

# usearch's extension links libstdc++ statically and exports its symbols; a library loaded after it that needs the
# system libstdc++ (onnxruntime, for the node-local retrieval model) then crashes the process at import. Loading
# the system libstdc++ first, globally, before any module of this package can import usearch, prevents that
# (seen with usearch 2.26 and onnxruntime 1.23 to 1.32). Without a system libstdc++ there is nothing to clash with.
with contextlib.suppress(OSError):
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)

# Native libraries' worker threads spin while they wait for work, and on 2 cores the second one is busy already
# (LevelDB's compaction, the index thread, signature checks). OpenBLAS's thread spun after each batch's matrix
# product of the hash bands (ledger/neardup.py): 5.7 s of CPU over 60,000 operations, a tenth of the process,
# for products that take ~10 us per operation on one thread; the tokenizer's rayon pool (WordLlama) 1.6 s.
# A user's own setting of either variable wins. OpenBLAS reads its thread count when numpy loads it, so setting
# the variable here limits it without loading numpy now (a command that touches no vector, `expledger status`, does
# not pay numpy's import); a numpy loaded before this package is limited in place.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if "numpy" in sys.modules:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
