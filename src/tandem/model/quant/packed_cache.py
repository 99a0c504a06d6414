"""An on-disk cache of a rank's quantized CPU kernels, so a second load of the same weights
with the same method skips the calibration forward, the requantization and the packing.

One safetensors file per (weights, method, tensor-parallel share) under
`<TANDEM_CACHE_DIR>/quantized/` (`TANDEM_QUANT_CACHE=0` turns it off). Its name hashes
the key, and the key is stored whole in the file and compared on reading:
  - the weights' source (loader.weights_source: the folder the loader read, each file's
    size and mtime; a GGUF's folder is named by the GGUF's sha256), and a sample of every
    parameter's values, so weights changed after loading miss too;
  - the method, the float dtype, the rank and world size (each rank caches its own share,
    as each rank quantizes its own share);
  - LAYOUT_VERSION, torch's version, the CPU capability torch dispatches to and the int8
    weight range found on this CPU (the packed layouts may differ by any of them).
Each tensor's CRC32 is checked on reading. A file that is unreadable, corrupt or of another
key is ignored with a warning and rewritten; a cache that cannot be written only warns.
Files are written aside and renamed into place, so a reader never sees half of one.
On a tensor-parallel model the ranks agree (all-reduce) to read their files only if every
rank has a good one: a miss calibrates with a collective forward, which all ranks must join.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
import zlib

import torch

log = logging.getLogger("tandem.model")

LAYOUT_VERSION = 1  # bump whenever a kernel's state() changes meaning
SAMPLES_PER_PARAMETER = 256
ENV_SWITCH = "TANDEM_QUANT_CACHE"

stats = {"hits": 0, "misses": 0, "writes": 0}  # this process's cache use (tests and logs read it)


def cache_dir() -> str:
    from tandem.model.loader import cache_root

    return os.path.join(cache_root(), "quantized")


def kernel_classes() -> dict[str, type]:
    from tandem.model.quant import cpu_int4, cpu_int8

    return {"int4": cpu_int4.Int4CpuKernel, "int8": cpu_int8.Int8CpuKernel}


class CacheMismatch(ValueError):
    pass


def weights_fingerprint(model) -> str:
    """sha256 over every parameter's name, shape, dtype and an evenly spaced sample of its values."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // SAMPLES_PER_PARAMETER)].float().contiguous()
        digest.update(f"{name}{tuple(param.shape)}{param.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


class PackedCache:
    """The cache file of one model's kernels for one method."""

    def __init__(self, path: str, key: dict, share):
        self.path, self.key, self.share = path, key, share
        self.key_text = json.dumps(key, sort_keys=True)

    def load(self, sites) -> dict | None:
        """{site key: kernel} read from the file, or None (missing, unusable, or another rank's
        file missing or unusable)."""
        kernels = None
        if os.path.isfile(self.path):
            try:
                kernels = self._read(sites)
            except Exception as e:  # anything wrong with the file means: build again
                log.warning("quantized weights cache %s not used (%s: %s); rebuilding it",
                            self.path, type(e).__name__, e)
        if self.share is not None and self.share.world_size > 1:
            import torch.distributed as dist

            every_rank_has_it = torch.tensor([0 if kernels is None else 1])
            dist.all_reduce(every_rank_has_it, op=dist.ReduceOp.MIN, group=self.share.group)
            if not every_rank_has_it.item():
                kernels = None
        stats["hits" if kernels is not None else "misses"] += 1
        return kernels

    def _read(self, sites) -> dict:
        from safetensors import safe_open

        classes = kernel_classes()
        with safe_open(self.path, framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("key") != self.key_text:
                raise CacheMismatch("written for other weights or another layout")
            kinds, crcs = json.loads(meta["kernels"]), json.loads(meta["crc32"])
            names: dict[str, list[str]] = {}
            for name in f.keys():
                site_key, _, field = name.partition("/")
                names.setdefault(site_key, []).append(field)
            kernels = {}
            for site in sites:
                state = {}
                for field in names.get(site.key, ()):
                    tensor = f.get_tensor(f"{site.key}/{field}")
                    if _crc32(tensor) != crcs.get(f"{site.key}/{field}"):
                        raise CacheMismatch(f"tensor {site.key}/{field} fails its CRC32 check")
                    state[field] = tensor
                kind = kinds.get(site.key)
                if kind not in classes:
                    raise CacheMismatch(f"no kernel for site {site.key}")
                kernel = classes[kind].from_state(state)
                if (kernel.out_features, kernel.in_features) != site.shape or (kernel.bias is not None) != site.has_bias:
                    raise CacheMismatch(f"site {site.key}: cached kernel does not fit the layer")
                kernels[site.key] = kernel
        return kernels

    def save(self, kernels: dict) -> None:
        tmp = f"{self.path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            from safetensors.torch import save_file

            tensors = {f"{key}/{field}": tensor.contiguous()
                       for key, kernel in kernels.items() for field, tensor in kernel.state().items()}
            meta = {"key": self.key_text,
                    "kernels": json.dumps({key: kernel.name for key, kernel in kernels.items()}),
                    "crc32": json.dumps({name: _crc32(t) for name, t in tensors.items()})}
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, self.path)
            stats["writes"] += 1
        except Exception as e:  # a read-only or full disk: the next load quantizes again
            log.warning("could not write the quantized weights cache %s (%s: %s)", self.path, type(e).__name__, e)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def for_model(model, method: str) -> PackedCache | None:
    """The cache of `model`'s kernels for `method`, or None where none applies: a model the
    loader did not read (no weights_source), a GPU model, or the cache switched off."""
    source = getattr(model, "weights_source", None)
    if os.environ.get(ENV_SWITCH, "1") == "0" or source is None or model.device.type != "cpu":
        return None
    from tandem.model.quant import cpu_int8

    share = getattr(model, "tensor_parallel_share", None)
    rank, world_size = (share.rank, share.world_size) if share is not None else (0, 1)
    key = {
        "layout": LAYOUT_VERSION, "torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(),
        "int8_weight_max": cpu_int8.weight_max() if cpu_int8.available() else None,
        "method": method, "dtype": str(model.lm_head.weight.dtype), "rank": rank, "world_size": world_size,
        "source": source, "weights": weights_fingerprint(model),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = os.path.basename(os.path.normpath(source["folder"]))
    path = os.path.join(cache_dir(), f"{name}-{method}-rank{rank}of{world_size}-{digest}.safetensors")
    return PackedCache(path, key, share)


def _crc32(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
