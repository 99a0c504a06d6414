"""The CPU kernel of paged attention (csrc/paged_attention_cpu.cpp): built with
torch.utils.cpp_extension at its first use, then loaded from torch's extension cache
(TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions). The first build takes
about 20 s on 2 cores; a process that finds the build cached loads it in well under 1 s.

The build compiles for the host (-march=native), so the extension's name carries a hash
of the host CPU's feature flags (and of the sources, the compiler flags and torch's
version): a cache directory shared by machines of different CPUs holds one build per CPU
kind and never hands one an instruction it lacks. Processes that build at once wait on
torch's file lock in the build directory; threads of one process on `_lock`.

`load_kernel()` returns None, after one warning naming the reason, where the extension
cannot be built (no compiler, no ninja); callers then use the reference.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time

import torch

log = logging.getLogger(__name__)

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
SOURCE = os.path.join(CSRC, "paged_attention_cpu.cpp")
HEADERS = [os.path.join(CSRC, "paged_attention_cpu_tile.h")]
CFLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-Wno-psabi"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "op": the loaded op, or "error": why it could not be built


def cpu_flags() -> str:
    """The host CPU's feature flags (what -march=native compiles for)."""
    flags = platform.machine() + " " + platform.processor() + " "
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):  # x86, arm
                    flags += " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return flags


def extension_name() -> str:
    """tandem_paged_attention_cpu_<hash of the CPU flags, the sources, the flags and torch's
    version>: torch's own rebuild check sees neither headers nor CPUs."""
    h = hashlib.sha256()
    for part in (cpu_flags(), " ".join(CFLAGS), torch.__version__):
        h.update(part.encode() + b"\0")
    for path in [SOURCE, *HEADERS]:
        with open(path, "rb") as fh:
            h.update(fh.read())
    return f"tandem_paged_attention_cpu_{h.hexdigest()[:12]}"


STALE_LOCK_S = 600  # a build takes ~20 s; a lock this old was left by a process killed mid-build


def _drop_stale_lock(build_dir: str) -> None:
    """torch's build lock left by a killed process makes every later build wait forever."""
    lock = os.path.join(build_dir, "lock")
    try:
        if time.time() - os.path.getmtime(lock) > STALE_LOCK_S:
            os.remove(lock)
            log.warning("removed a stale build lock of the paged attention CPU kernel (%s)", lock)
    except OSError:
        pass  # no lock: nobody is building


def load_kernel():
    """The op `(q, k_cache, v_cache, block_tables, start_pos) -> out`, built on first use;
    None where it cannot be built (warned once)."""
    if "op" in _state or "error" in _state:
        return _state.get("op")
    with _lock:
        if "op" not in _state and "error" not in _state:
            try:
                from torch.utils import cpp_extension

                _drop_stale_lock(cpp_extension._get_build_directory(extension_name(), verbose=False))

                cpp_extension.load(name=extension_name(), sources=[SOURCE], extra_cflags=CFLAGS,
                                   extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
                _state["op"] = torch.ops.tandem_paged_attention.paged_attention
            except Exception as exc:  # no compiler, no ninja, a failed build: the reference serves
                _state["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log.debug("paged attention CPU kernel build failure", exc_info=True)
                log.warning("paged attention: the CPU kernel could not be built (%s); using the gather + SDPA "
                            "reference", _state["error"])
    return _state.get("op")


def paged_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
    """The kernel on CPU tensors (raises where it cannot be built). q, the table and the
    start positions are made contiguous here (small); the caches must be."""
    op = load_kernel()
    if op is None:
        raise RuntimeError(f"the paged attention CPU kernel is unavailable: {_state['error']}")
    return op(q.contiguous(), k_cache, v_cache, block_tables.contiguous(), start_pos.contiguous())
