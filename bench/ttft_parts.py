"""Where the served time to first token goes, one request at a time: Ray's own floor
against each hop tandem adds.

    python bench/ttft_parts.py [--requests 12] [--max-tokens 32]

Rows, each the median time to the first token of `--requests` requests run one after
another (each read to its end before the next starts):
  ray call          a no-op async actor method, called and awaited (no model)
  ray stream        the first item of a no-op streaming actor method (no model)
  embedded          the engine in this process (LocalShardGroup)
  embedded+grpc     the same engine on one `tandem shard` process (no Ray; its Session
                    over the rank's session socket, GrpcShardGroup's default)
  handle in-proc    the Python handle, the rank inside the scheduler actor (Ray, no gRPC)
  handle            the Python handle, the rank in a shard actor (Ray and a shard process: served minus HTTP)
The engines run on the CPU with one torch thread each, with the ngram drafter. What is
added over `embedded` is the served path's cost before HTTP; serve_load.py adds HTTP.
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from common import json_line, machine, print_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Explain in one paragraph why the sky is blue."


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000.0, 2)


def engine_ttft(engine, params) -> float:
    t0, first = time.perf_counter(), None
    for out in engine.stream(PROMPT, params):
        if out.delta_token_ids and first is None:
            first = time.perf_counter() - t0
    return first


async def handle_ttft(handle, params) -> float:
    t0, first = time.perf_counter(), None
    async for out in handle.astream(PROMPT, params):
        if out.delta_token_ids and first is None:
            first = time.perf_counter() - t0
    return first


def ray_floor(n: int) -> tuple[float, float]:
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        async def ping(self):
            return 1

        async def items(self):
            for i in range(3):
                yield i

    echo = Echo.remote()
    ray.get(echo.ping.remote())
    calls = []
    for _ in range(max(n, 30)):
        t0 = time.perf_counter()
        ray.get(echo.ping.remote())
        calls.append(time.perf_counter() - t0)

    async def first_item() -> float:
        t0 = time.perf_counter()
        async for _ in echo.items.options(num_returns="streaming").remote():
            return time.perf_counter() - t0

    streams = [asyncio.run(first_item()) for _ in range(max(n, 30))]
    ray.kill(echo)
    return median_ms(calls), median_ms(streams)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from tandem.actors import init_local_ray, start
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_tokenizer
    from tandem.rpc.grpc_group import GrpcShardGroup
    from tandem.rpc.launcher import ProcessLauncher
    from tandem.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    cfg = EngineConfig(drafter="ngram", max_num_seqs=4, max_model_len=512, device="cpu")
    local = Engine.from_config(cfg, progress=False)
    tok = load_tokenizer(cfg.model, progress=False)
    remote = Engine(GrpcShardGroup(cfg.shard_spec(), ProcessLauncher(1, threads_per_rank=1)), tok.tokenizer,
                    tok.eos_token_ids, cfg, model_name=tok.name)
    rows: dict[str, float] = {}
    for name, engine in (("embedded", local), ("embedded+grpc", remote)):
        for _ in range(3):
            engine_ttft(engine, params)  # warm up
        rows[name] = median_ms([engine_ttft(engine, params) for _ in range(args.requests)])
    remote.close()

    init_local_ray(log_to_driver=False)
    rows["ray call"], rows["ray stream"] = ray_floor(args.requests)
    for name, in_process in (("handle in-proc", True), ("handle", False)):
        handle = start(drafter="ngram", max_num_seqs=4, max_model_len=512, device="cpu", shard_torch_threads=1,
                       in_process_target=in_process, name=f"ttft-parts-{in_process}")
        for _ in range(3):
            asyncio.run(handle_ttft(handle, params))
        rows[name] = median_ms([asyncio.run(handle_ttft(handle, params)) for _ in range(args.requests)])
        handle.shutdown()
    # the embedded engine again, now that Ray's processes share the machine
    rows["embedded (again)"] = median_ms([engine_ttft(local, params) for _ in range(args.requests)])

    base = rows["embedded (again)"]
    order = ["ray call", "ray stream", "embedded", "embedded+grpc", "handle in-proc", "handle", "embedded (again)"]
    print_table(["path", "ttft ms p50", "over embedded"],
                [[k, rows[k], "" if k.startswith("ray") else round(rows[k] - base, 2)] for k in order],
                title=f"time to first token, one request at a time, {args.max_tokens}-token requests, CPU")
    json_line({"bench": "ttft_parts", "machine": machine(), "ttft_ms_p50": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
