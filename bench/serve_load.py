"""Load on the served app vs the embedded engine at the same batch.

    python bench/serve_load.py [--concurrency 1 16 64] [--max-tokens 32] [--shards 1] [--grpc]
                               [--ingress-replicas N]
                               [--model smollm2 | tiny-random | a model folder or GGUF]

For each concurrency C, C streaming clients start at once on loopback (OpenAI
/v1/completions, stream: true, greedy, ignore_eos so every request makes exactly
max_tokens tokens; HTTP from the ingress replica, as `tandem serve` runs it, or with
--through-proxy through Serve's proxy), and the same C requests go into an embedded
Engine (one process, same config, all added at once, stepped in a loop) and through the
Python handle of the served engine (Ray streaming generators without HTTP or Serve, to
show where the time goes); with --grpc also into the embedded engine over one local
shard process (no Ray: the control path alone; its Session over the rank's session
socket unless --no-session-socket). The sides alternate, so a change in the machine's
load hits all alike. Per request:

    ttft  time to first token: that request sent -> its first text chunk (each request
          from its own send, as vLLM's serving benchmark counts it; the n keep-alive
          connections are opened before the timed run)
    itl   inter-token latency: (last chunk - first chunk) / (tokens - 1)
    tokens/s  all completion tokens / (first request sent -> last request done)
    tick  the engine's mean Engine.step() over the runs (served and handle: the
          scheduler actor's own count): what the engine itself costs, against the
          time between its ticks

Prints a short table, then one JSON line whose keys per concurrency include
added_latency_ms_p50 (served p50 TTFT - embedded p50 TTFT, the per-request overhead of
HTTP + Serve + Ray + the shard process) and tokens_per_s_ratio (served / embedded).
Targets: at most 10 ms added p50 latency and a ratio of at least 0.9.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

TINY = "tiny-random"

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):",
    "Here is a recipe for a simple tomato soup:",
    "The three laws of thermodynamics are",
    "Once upon a time, in a small village by the sea,",
    "A list of the planets in our solar system:",
    "To configure a Linux firewall, first",
    "The main differences between Python and Rust are",
]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[i]


def summary(ttft: list[float], itl: list[float], tokens: int, wall: float, tick_s: float = 0.0, ticks: int = 0) -> dict:
    return {"ttft": ttft, "itl": itl, "tokens_per_s": tokens / wall if wall > 0 else 0.0, "tick_s": tick_s, "ticks": ticks}


def combine(runs: list[dict]) -> dict:
    """Several runs of one side at one concurrency: latency percentiles over every request
    of every run, and the best run's tokens/s (interference only ever slows a run down)."""
    ttft = [x for r in runs for x in r["ttft"]]
    itl = [x for r in runs for x in r["itl"]]
    return {
        "ttft_ms_p50": 1000 * pct(ttft, 50),
        "ttft_ms_p99": 1000 * pct(ttft, 99),
        "itl_ms_p50": 1000 * pct(itl, 50),
        "itl_ms_p99": 1000 * pct(itl, 99),
        "tokens_per_s": max(r["tokens_per_s"] for r in runs),
        "tick_ms": 1000 * sum(r["tick_s"] for r in runs) / max(1, sum(r["ticks"] for r in runs)),
        "requests": len(ttft),
    }


# ---- embedded ----------------------------------------------------------------------------


class RunSink:
    """The engines' sink (as the scheduler actor runs them): each run's outputs to its taker."""

    def __init__(self):
        self.take = lambda outs: None

    def __call__(self, outs) -> None:
        self.take(outs)


SINK = RunSink()


def run_embedded(engine, n: int, max_tokens: int) -> dict:
    from tandem.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    first, last, ntok = {}, {}, {}

    def take(outs) -> None:
        now = time.perf_counter()
        for out in outs:
            if out.delta_token_ids and out.request_id not in first:
                first[out.request_id] = now
            if out.finished:
                last[out.request_id] = now
                ntok[out.request_id] = len(out.token_ids)

    SINK.take = take  # an in-process rank emits nothing early
    t0 = time.perf_counter()
    sent = {}
    for i in range(n):
        t = time.perf_counter()
        sent[engine.add_request(PROMPTS[i % len(PROMPTS)], params)] = t
    tick_s, ticks = 0.0, 0
    while len(last) < n:
        t = time.perf_counter()
        outs = engine.step()
        tick_s, ticks = tick_s + time.perf_counter() - t, ticks + 1
        take(outs)
    wall = max(last.values()) - t0
    ids = list(sent)
    ttft = [first[i] - sent[i] for i in ids]
    itl = [(last[i] - first[i]) / max(1, ntok[i] - 1) for i in ids]
    return summary(ttft, itl, sum(ntok.values()), wall, tick_s, ticks)


def with_actor_ticks(handle, run):
    """run() on the served engine, with the scheduler actor's ticks over it."""
    before = handle.health()
    result = run()
    after = handle.health()
    result.update(tick_s=after["step_seconds"] - before["step_seconds"], ticks=after["ticks"] - before["ticks"])
    return result


def grpc_engine(engine_cfg: dict, threads: int, session_socket: bool, spin_us: int | None):
    """The same engine over one local shard process: the served path's control path,
    without Ray."""
    from tandem.config import EngineConfig
    from tandem.engine import Engine
    from tandem.model.loader import load_tokenizer
    from tandem.rpc.grpc_group import GrpcShardGroup
    from tandem.rpc.launcher import ProcessLauncher

    config = EngineConfig(**engine_cfg)
    tok = load_tokenizer(config.model, progress=False)
    group = GrpcShardGroup(config.shard_spec(), ProcessLauncher(1, threads_per_rank=threads), session_socket=session_socket,
                           session_spin_us=spin_us)
    return Engine(group, tok.tokenizer, tok.eos_token_ids, config, model_name=tok.name, sink=SINK)


# ---- served ------------------------------------------------------------------------------


async def one_stream(conn, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    sent = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    tokens = 0
    async for data in conn.events("/v1/completions", body):
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(chunk["error"])
        now = time.perf_counter()
        if chunk["choices"] and chunk["choices"][0]["text"]:
            first = first or now
            last = now
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    return first - sent, (last - first) / max(1, tokens - 1), tokens


async def run_served_async(port: int, model: str, n: int, max_tokens: int) -> dict:
    from sse_client import SSEConnection

    # One keep-alive connection per client, opened (and used once) before the timed run:
    # a load generator's connection set-up is not the server's latency.
    conns = [await SSEConnection("127.0.0.1", port).open() for _ in range(n)]
    try:
        await asyncio.gather(*(one_stream(c, model, PROMPTS[0], 1) for c in conns))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_stream(c, model, PROMPTS[i % len(PROMPTS)], max_tokens)
                                         for i, c in enumerate(conns)))
        wall = time.perf_counter() - t0
    finally:
        for c in conns:
            c.close()
    return summary([r[0] for r in results], [r[1] for r in results], sum(r[2] for r in results), wall)


async def run_handle_async(handle, n: int, max_tokens: int) -> dict:
    """The same load through the Python handle (Ray streaming generators, no HTTP/Serve)."""
    from tandem.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(prompt: str):
        sent = time.perf_counter()
        first = last = None
        tokens = 0
        async for out in handle.astream(prompt, params):
            now = time.perf_counter()
            if out.delta_token_ids:
                first = first or now
                last = now
            tokens = len(out.token_ids)
        return first - sent, (last - first) / max(1, tokens - 1), tokens

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(n)))
    wall = time.perf_counter() - t0
    return summary([r[0] for r in results], [r[1] for r in results], sum(r[2] for r in results), wall)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="smollm2",
                    help=f"the model, or {TINY!r}: a 1-layer random model with the default model's tokenizer, whose "
                         "forward costs little, so the serving path's own cost shows (on a CPU)")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--shards", type=int, default=1, help="tensor parallel ranks of the served engine (shard actors)")
    ap.add_argument("--in-process-target", action="store_true", help="serve with the rank inside the scheduler actor (no gRPC)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the embedded engine and of each shard actor (the same on both sides: on a "
                         "shared CPU, 2-thread OpenMP can run many times slower than 1)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where both sides' target runs: auto = a GPU if there is one (the shard actors then take one each)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--grpc", action="store_true",
                    help="also the engine over one shard process, without Ray (where the served path's time goes)")
    ap.add_argument("--no-session-socket", dest="session_socket", action="store_false",
                    help="the tick's commands to the shard process(es) over gRPC, not their session sockets")
    ap.add_argument("--session-spin-us", type=int, default=None,
                    help="busy-poll of the session sockets (default: the product's, 20000 where there are 8 cores or more)")
    ap.add_argument("--through-proxy", action="store_true",
                    help="HTTP through Serve's proxy (Serve's default) instead of from the replica itself (`tandem serve`)")
    ap.add_argument("--ingress-replicas", type=int, default=1,
                    help="HTTP ingress replicas; more than 1 puts HAProxy in front of them (Serve's HAProxy mode)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per concurrency and side (at least 6 at one client, so its latency has a median): "
                         "latencies pool every run's requests, tokens/s keeps the best run")
    args = ap.parse_args(argv)
    max_seqs = max(args.concurrency)
    import torch

    if args.model == TINY:
        import tempfile

        from common import tiny_model_folder

        args.model = tiny_model_folder(tempfile.mkdtemp(prefix="tandem-tiny-"))

    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = "cuda" if gpu else "cpu"
    engine_cfg = dict(model=args.model, drafter=args.drafter, max_num_seqs=max_seqs, max_model_len=512, device=device)

    import ray
    from ray import serve

    from tandem.actors import init_local_ray
    from tandem.engine import Engine
    from tandem.serve import build_app
    from tandem.serve.direct_http import start_serve, stop_haproxy, use_direct_http

    if not args.through_proxy:
        # as `tandem serve` runs it: HTTP from the replica itself, or HAProxy in front of several
        use_direct_http(args.port, args.ingress_replicas)
    init_local_ray(log_to_driver=False, num_gpus=torch.cuda.device_count() if gpu else None)
    start_serve("127.0.0.1", args.port)
    serve.run(build_app({
        **engine_cfg, "tensor_parallel_size": args.shards, "max_tokens_limit": max(1024, args.max_tokens),
        "in_process_target": args.in_process_target, "shard_torch_threads": args.threads,
        "engine_actor_name": "tandem-bench", "shard_num_gpus": 1.0 if gpu else 0.0, "served_model_name": args.model,
        "session_socket": args.session_socket, "session_spin_us": args.session_spin_us,
        "ingress_replicas": args.ingress_replicas,
    }), name="tandem", route_prefix="/", blocking=False)
    from tandem.actors import connect

    handle = connect("tandem-bench")
    torch.set_num_threads(args.threads)
    engine = Engine.from_config(progress=False, sink=SINK, **engine_cfg)
    over_grpc = grpc_engine(engine_cfg, args.threads, args.session_socket, args.session_spin_us) if args.grpc else None
    # All stay up; the runs alternate (embedded, handle, served, embedded, ...) so that a
    # change in the machine's load hits all alike.
    sides = {
        "embedded": lambda c: run_embedded(engine, c, args.max_tokens),
        "grpc": lambda c: run_embedded(over_grpc, c, args.max_tokens),
        "handle": lambda c: with_actor_ticks(handle, lambda: asyncio.run(run_handle_async(handle, c, args.max_tokens))),
        "served": lambda c: with_actor_ticks(handle, lambda: asyncio.run(run_served_async(args.port, args.model, c, args.max_tokens))),
    }
    if over_grpc is None:
        del sides["grpc"]
    runs: dict[str, dict[int, list]] = {side: {c: [] for c in args.concurrency} for side in sides}
    try:
        run_embedded(engine, 1, 4)  # warm up
        asyncio.run(run_served_async(args.port, args.model, 1, 4))
        for c in args.concurrency:
            if gpu:  # each batch shape's CUDA graphs are captured once, untimed
                for run in sides.values():
                    run(c)
            for _ in range(max(args.repeats, 6) if c == 1 else args.repeats):
                for side, run in sides.items():
                    runs[side][c].append(run(c))
    finally:
        engine.close()
        if over_grpc is not None:
            over_grpc.close()
        node_id = ray.get_runtime_context().get_node_id()
        serve.shutdown()
        ray.shutdown()
        stop_haproxy(node_id)

    print(f"{'C':>3} {'where':>8} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>8} {'itl p99':>8} {'tok/s':>8} {'tick':>6}")
    best = {side: {c: combine(rs) for c, rs in by_c.items()} for side, by_c in runs.items()}
    embedded, served = best["embedded"], best["served"]
    result = {}
    for c in args.concurrency:
        for where in sides:
            s = best[where][c]
            print(f"{c:>3} {where:>8} {s['ttft_ms_p50']:>9.1f} {s['ttft_ms_p99']:>9.1f} {s['itl_ms_p50']:>8.1f} "
                  f"{s['itl_ms_p99']:>8.1f} {s['tokens_per_s']:>8.1f} {s['tick_ms']:>6.2f}")
        e, s = embedded[c], served[c]
        result[str(c)] = {
            "added_latency_ms_p50": round(s["ttft_ms_p50"] - e["ttft_ms_p50"], 2),
            "added_itl_ms_p50": round(s["itl_ms_p50"] - e["itl_ms_p50"], 2),
            "tokens_per_s_ratio": round(s["tokens_per_s"] / e["tokens_per_s"], 3) if e["tokens_per_s"] else None,
            "served": {k: round(v, 2) for k, v in s.items()},
            **{side: {k: round(v, 2) for k, v in best[side][c].items()} for side in ("handle", "grpc") if side in best},
            "embedded": {k: round(v, 2) for k, v in e.items()},
        }
    print(json.dumps({"max_tokens": args.max_tokens, "shards": args.shards, "threads": args.threads, "device": device,
                      "in_process_target": args.in_process_target, "through_proxy": args.through_proxy,
                      "session_socket": args.session_socket, "session_spin_us": args.session_spin_us,
                      "ingress_replicas": args.ingress_replicas, "concurrency": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
