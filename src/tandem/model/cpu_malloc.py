"""Keep the memory a CPU forward frees, for the next forward to reuse (glibc only).

A forward allocates large temporaries (each layer's gathered K/V, the logits) and frees
them. glibc serves blocks over its mmap threshold with fresh mmaps and gives the top
of its heap back to the kernel, so every forward pays page faults on first touch
again. Measured on the 2-core dev machine (SmolLM2-135M, 32 sequences, 600 tokens of
context, gathered K/V): 350 ms a forward as glibc comes, 120 ms with the settings
below. The cost: the process keeps its peak heap instead of shrinking after a burst,
as a serving process sized for its peak should. Elsewhere (macOS, musl) nothing happens,
and TANDEM_KEEP_FREED_MEMORY=0 leaves glibc as it is (a process that embeds tandem and
must give memory back).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("tandem.model")

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_SETTINGS = (
    (_M_MMAP_THRESHOLD, 32 << 20),  # blocks up to 32 MiB (glibc's ceiling) come from the heap ...
    (_M_TRIM_THRESHOLD, (1 << 31) - 1),  # ... and the heap is not trimmed back to the kernel
    (_M_TOP_PAD, 256 << 20),  # grow it in large steps
)
_done = False


def keep_freed_memory() -> bool:
    """Apply the settings once per process; whether this is a glibc that took them."""
    global _done
    if _done:
        return True
    if os.environ.get("TANDEM_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = all(mallopt(param, value) == 1 for param, value in _SETTINGS)
    if not ok:
        log.debug("mallopt refused tandem's settings; CPU forwards keep glibc's defaults")
    _done = ok
    return ok
