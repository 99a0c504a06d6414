"""Load time of a quantized CPU engine with its packed-kernel cache cold and warm.

    python bench/quant_cache_load.py [--methods int4,int8] [--repeats 3] [--threads 2]

For each repeat and method, in turns: `Engine.from_config(quantization=method)` on the
default model with the kernel cache switched off (TANDEM_QUANT_CACHE=0: calibrate,
quantize, pack), with an empty one (cold: the same, and write the file), then with the
file there (warm: read it). The float model's own cache is warm in all three.
The kernel cache lives in a temporary folder, so the user's cache is not touched. Reports
the best repeat of the whole build and of its quantize step. Prints a table, then one JSON
line.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from common import json_line, machine, print_table, setup_torch, warn_if_busy


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="int4,int8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    setup_torch(args.threads)
    warn_if_busy()
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model import quant
    from tandem.model.loader import load_model
    from tandem.model.quant import packed_cache

    load_model(progress=False)  # the float cache is built (once ever) before any timing
    folder = tempfile.mkdtemp(prefix="tandem-quant-cache-")
    packed_cache.cache_dir = lambda: folder
    quantize, quantize_seconds = quant.quantize, []

    def timed_quantize(*a, **kw):
        t = time.perf_counter()
        try:
            return quantize(*a, **kw)
        finally:
            quantize_seconds.append(time.perf_counter() - t)
    quant.quantize = timed_quantize

    best: dict[tuple[str, str], tuple[float, float]] = {}
    try:
        for _ in range(args.repeats):
            for method in args.methods.split(","):
                for state in ("off", "cold", "warm"):
                    os.environ[packed_cache.ENV_SWITCH] = "0" if state == "off" else "1"
                    if state == "cold":
                        shutil.rmtree(folder, ignore_errors=True)
                    hits = packed_cache.stats["hits"]
                    t = time.perf_counter()
                    engine = Engine.from_config(EngineConfig(quantization=method), progress=False)
                    total = time.perf_counter() - t
                    assert (packed_cache.stats["hits"] > hits) == (state == "warm"), "the cache was not used as expected"
                    engine.close()
                    old = best.get((method, state), (float("inf"), float("inf")))
                    best[(method, state)] = (min(old[0], total), min(old[1], quantize_seconds[-1]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows, result = [], {}
    for method in args.methods.split(","):
        (off, off_q), (cold, cold_q), (warm, warm_q) = (best[(method, s)] for s in ("off", "cold", "warm"))
        rows.append([method, off, cold, warm, cold / warm, off_q, cold_q, warm_q])
        result[method] = {"from_config_s": {"off": off, "cold": cold, "warm": warm},
                          "quantize_s": {"off": off_q, "cold": cold_q, "warm": warm_q}}
    print_table(["method", "from_config off s", "cold s", "warm s", "cold / warm", "quantize off s", "cold s", "warm s"],
                rows,
                title=f"default model, CPU, best of {args.repeats}")
    json_line({"bench": "quant_cache_load", "machine": machine(), "results": result})


if __name__ == "__main__":
    main()
