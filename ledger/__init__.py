"""The data layer: encoding, identity, keys, operations and their validation. Synchronous, no networking."""

import contextlib
import ctypes

# usearch's extension links libstdc++ statically and exports its symbols; a library loaded after it that needs the
# system libstdc++ (onnxruntime, for the node-local retrieval model) then crashes the process at import. Loading
# the system libstdc++ first, globally, before any module of this package can import usearch, prevents that
# (seen with usearch 2.26 and onnxruntime 1.23 to 1.32). Without a system libstdc++ there is nothing to clash with.
with contextlib.suppress(OSError):
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
