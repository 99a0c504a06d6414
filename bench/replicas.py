"""Engine replicas behind one endpoint: what routing costs, how evenly load spreads, and
what prefix-affinity routing buys.

    python bench/replicas.py                       # CPU box: SmolLM2, three apps on one local Ray cluster
    python bench/replicas.py --clients 64 --split-requests 3 --prefixes 4 --questions 8

Three apps on one Serve proxy, each at its own route prefix: /one (one engine replica),
/two (two, prefix routing on) and /off (two, prefix routing off). Their requests take
turns, so the machine's noise hits them alike.

1. router: the ingress's own work a request (prefix keys, the pick, the bookkeeping), in
   process, with 1, 2 and 8 replicas, for a short and a 2,000-character prompt;
2. overhead: one client, a 1-token completion at a time, /one and /two in turns: the
   p50 latency added by choosing among two replicas (target <= 1 ms);
3. split: `--clients` clients at once on /two; each replica's share of the requests and
   generated tokens, by the engines' own counters (target: none above 1.3x the mean);
4. prefix: requests sharing one of `--prefixes` long system prompts, `--concurrency` at
   a time, on /two and /off: the prefix cache's hit rate (tokens found cached / prompt
   tokens looked up), by the engines' own counters.
Prints the tables, then one JSON line. Real throughput scaling needs a device per
replica; on the CPU box both replicas share the same two cores.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import json_line, machine, print_table, warn_if_busy  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SYSTEM = ("You are the help desk of the {name} library. It opens at nine and closes at five, six days a week. "
          "Members borrow up to six books for three weeks; a late book costs ten cents a day. ")
PINNED = "Answer in one word. " * 15 + "The capital of France is"  # over 256 characters: one prefix key
QUESTIONS = ["When does it open?", "How many books may I borrow?", "What does a late book cost?",
             "Is it open on Sunday?", "How long is a loan?", "Can I renew a book?", "Who may join?",
             "Where is the reading room?"]


def router_cost(reps: int) -> list[dict]:
    """Microseconds of the router's own work a request, in process."""
    from tandem.actors.prefix_keys import prefix_keys
    from tandem.serve.replica_router import Replica, ReplicaRouter, request_cost

    rows = []
    for n in (1, 2, 8):
        for label, prompt in (("short", "The capital of France is"), ("2,000 chars", "x" * 2000)):
            router = ReplicaRouter()
            for i in range(n):
                router.replicas[f"e/{i}"] = Replica(f"e/{i}", None, load=100 * i)
            t0 = time.perf_counter()
            for i in range(reps):
                keys = prefix_keys(prompt)
                replica, why = router.pick(keys)
                replica.sent(str(i), request_cost(prompt, None), keys, why)
                replica.settled(str(i))
            rows.append({"replicas": n, "prompt": label, "us": (time.perf_counter() - t0) / reps * 1e6})
    return rows


async def post(client, url: str, body: dict) -> dict:
    r = await client.post(url, json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def per_replica(text: str, sample: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and "replica" in s.labels:
                out[s.labels["replica"]] = out.get(s.labels["replica"], 0.0) + s.value
    return out


async def counters(client, base: str, names: list[str]) -> dict[str, dict[str, float]]:
    text = (await client.get(base + "/metrics", timeout=60)).text
    return {n: per_replica(text, n) for n in names}


def minus(a: dict, b: dict) -> dict:
    return {n: {r: v - b[n].get(r, 0.0) for r, v in a[n].items()} for n in a}


async def overhead(client, url: str, n: int, prompt: str) -> dict:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    times = {"one": [], "two": []}
    for _ in range(3):  # warm both
        for app in times:
            await post(client, f"{url}/{app}/v1/completions", body)
    for i in range(n):
        for app in ("one", "two") if i % 2 == 0 else ("two", "one"):  # ABBA: neither always goes first
            t0 = time.perf_counter()
            await post(client, f"{url}/{app}/v1/completions", body)
            times[app].append((time.perf_counter() - t0) * 1e3)
    p50 = {app: statistics.median(v) for app, v in times.items()}
    p25 = {app: statistics.quantiles(v, n=4)[0] for app, v in times.items()}
    return {"p50_ms": p50, "p25_ms": p25, "added_ms": p50["two"] - p50["one"],
            "added_p25_ms": p25["two"] - p25["one"], "requests": n, "prompt_chars": len(prompt)}


async def split(client, url: str, clients: int, each: int, max_tokens: int) -> dict:
    names = ["tandem:request_success_total", "tandem:generation_tokens_total"]
    before = await counters(client, f"{url}/two", names)

    async def one_client(i: int) -> None:
        for j in range(each):
            await post(client, f"{url}/two/v1/completions", {
                "model": "smollm2", "prompt": f"Client {i} asks {j}: name a colour and a fruit.", "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client(i) for i in range(clients)))
    took = time.perf_counter() - t0
    d = minus(await counters(client, f"{url}/two", names), before)
    out = {"clients": clients, "seconds": took}
    for name, key in zip(names, ("requests", "tokens")):
        shares = d[name]
        mean = sum(shares.values()) / max(1, len(shares))
        out[key] = shares
        out[f"{key}_max_over_mean"] = max(shares.values()) / mean if mean else None
    return out


async def prefix_hits(client, url: str, app: str, prefixes: int, questions: int, concurrency: int, seed: int,
                      round_: int) -> dict:
    """One round: system prompts no earlier round used (each app's pools start cold for them)."""
    names = ["tandem:prefix_cache_hits_total", "tandem:prefix_cache_queries_total", "tandem:request_success_total"]
    before = await counters(client, f"{url}/{app}", names)
    work = [(SYSTEM.format(name=f"#{p} of round {round_}") * 10, QUESTIONS[q % len(QUESTIONS)])
            for p in range(prefixes) for q in range(questions)]
    random.Random(seed).shuffle(work)
    sem = asyncio.Semaphore(concurrency)
    latencies = []

    async def one(system: str, question: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            await post(client, f"{url}/{app}/v1/chat/completions", {
                "model": "smollm2", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": 4, "temperature": 0})
            latencies.append((time.perf_counter() - t0) * 1e3)

    await asyncio.gather(*(one(s, q) for s, q in work))
    d = minus(await counters(client, f"{url}/{app}", names), before)
    hits, queries = sum(d[names[0]].values()), sum(d[names[1]].values())
    return {"requests": len(work), "hit_rate": hits / queries if queries else None, "hit_tokens": hits,
            "query_tokens": queries, "per_replica_requests": d[names[2]], "p50_ms": statistics.median(latencies)}


async def served(args) -> dict:
    import httpx

    url = f"http://127.0.0.1:{args.port}"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=args.clients + 8)) as client:
        # a short prompt has no prefix key: /two's requests take turns between its replicas;
        # a 300-character one has one, and they all go to the replica that holds it
        out = {"overhead": await overhead(client, url, args.overhead_requests, "The capital of France is"),
               "overhead_pinned": await overhead(client, url, args.overhead_requests, PINNED)}
        if args.overhead_only:
            return out
        out["split"] = await split(client, url, args.clients, args.split_requests, args.max_tokens)
        out["prefix"] = {}
        for i, app in enumerate(("two", "off", "two", "off")[:2 * args.prefix_rounds]):
            got = await prefix_hits(client, url, app, args.prefixes, args.questions, args.concurrency,
                                    seed=len(out["prefix"].get(app, [])), round_=i // 2)
            out["prefix"].setdefault(app, []).append(got)
        return out


def start(args) -> None:
    import torch
    from ray import serve

    from tandem.actors import init_local_ray
    from tandem.serve import build_app
    from tandem.serve.direct_http import start_serve

    gpu = torch.cuda.is_available() and args.device != "cpu"
    init_local_ray(log_to_driver=False, num_cpus=args.num_cpus, num_gpus=torch.cuda.device_count() if gpu else None)
    start_serve("127.0.0.1", args.port)  # Serve's proxy on the port, routing by prefix to the three apps
    engine = {"model": args.model, "max_num_seqs": args.max_num_seqs, "max_model_len": 2048, "device": args.device,
              "shard_num_gpus": args.gpus_per_engine if gpu else 0.0, "served_model_name": "smollm2",
              "max_waiting_requests": 4 * args.clients}
    apps = {"one": {"engine_replicas": 1}, "two": {"engine_replicas": 2},
            "off": {"engine_replicas": 2, "prefix_routing": False}}
    if args.overhead_only:
        del apps["off"]
    for name, extra in apps.items():
        serve.run(build_app({**engine, **extra}), name=name, route_prefix=f"/{name}", blocking=False)
    import httpx

    deadline = time.monotonic() + 900
    for name, extra in apps.items():
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{args.port}/{name}/health", timeout=10).json().get("replicas") == \
                        extra["engine_replicas"]:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"app {name} did not come up")
            time.sleep(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--gpus-per-engine", type=float, default=1.0, help="shard_num_gpus where there is a GPU (0.3: three engines share one)")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--num-cpus", type=int, default=8)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--router-reps", type=int, default=20000)
    p.add_argument("--overhead-requests", type=int, default=40)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--split-requests", type=int, default=2, help="requests each client sends, one after another")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prefixes", type=int, default=4)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prefix-rounds", type=int, default=1, choices=(1, 2))
    p.add_argument("--overhead-only", action="store_true", help="only the router's cost and the overhead (apps /one and /two)")
    args = p.parse_args()
    warn_if_busy()
    router = router_cost(args.router_reps)
    print_table(["replicas", "prompt", "us/request"], [[r["replicas"], r["prompt"], r["us"]] for r in router],
                "router: the ingress's own work a request")
    start(args)
    res = asyncio.run(served(args))
    for key, what in (("overhead", "a short prompt: /two's replicas take turns"),
                      ("overhead_pinned", "a 300-character prompt: /two sends all to the replica holding it")):
        o = res[key]
        print_table(["app", "p50 ms", "p25 ms"], [["one replica", o["p50_ms"]["one"], o["p25_ms"]["one"]],
                                                  ["two replicas", o["p50_ms"]["two"], o["p25_ms"]["two"]],
                                                  ["added", o["added_ms"], o["added_p25_ms"]]],
                    f"{key}: 1-token completions, one client, {o['requests']} each, in turns; {what}")
    if args.overhead_only:
        json_line({"bench": "replicas", "machine": machine(), "router_us": router, **res, "args": vars(args)})
        os._exit(0)
    s = res["split"]
    print_table(["replica", "requests", "tokens"], [[r, s["requests"][r], s["tokens"].get(r)] for r in s["requests"]]
                + [["max / mean", s["requests_max_over_mean"], s["tokens_max_over_mean"]]],
                f"split: {s['clients']} clients on two replicas ({s['seconds']:.1f} s)")
    print_table(["prefix routing", "hit rate", "hit tokens", "query tokens", "p50 ms", "requests per replica"],
                [[app, r["hit_rate"], r["hit_tokens"], r["query_tokens"], r["p50_ms"],
                  " ".join(str(int(v)) for v in r["per_replica_requests"].values())]
                 for app, runs in res["prefix"].items() for r in runs],
                f"prefix: {args.prefixes} system prompts x {args.questions} questions, {args.concurrency} at a time")
    json_line({"bench": "replicas", "machine": machine(), "router_us": router, **res,
               "args": vars(args)})
    import ray

    ray.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
