"""Run by test_engine_replicas.py in a process of its own (its own local Ray cluster):
serve with two engine replicas, then with autoscaling, and print as JSON what clients
and the engines' own counters saw.

    python tests/serve/replicas_app.py
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for polling
from polling import wait_for  # noqa: E402

# health checks every 2 s: the killed replica is replaced after three failed ones
ENGINE = {"max_num_seqs": 8, "max_model_len": 1024, "rpc_deadline_s": 20.0, "health_check_period_s": 2.0}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Count to ten: 1, 2, 3,", "Once upon a time, a fox",
           "The three primary colours are", "Water boils at", "A haiku about the sea:", "import numpy as np\n"]
PREFIX = ("You are a careful assistant for a library. The library opens at nine and closes at five. "
          "Members may borrow six books for three weeks; a late book costs ten cents a day. ") * 16
BASE = "tandem-engine.tandem"  # the app's scheduler actors: BASE/<replica id>


def serve_app(port: int | None, args: dict) -> int:
    from ray import serve

    from tandem.actors import init_local_ray
    from tandem.serve import build_app
    from tandem.serve.direct_http import free_port, start_serve, use_direct_http

    if port is None:
        port = free_port()
        use_direct_http(port)
        init_local_ray(log_to_driver=False)
        start_serve("127.0.0.1", port)
    serve.run(build_app({**ENGINE, **args}), name="tandem", route_prefix="/", blocking=False)
    return port


_references: dict[tuple, dict[str, str]] = {}


def reference(prompts: list[str], max_tokens: int) -> dict[str, str]:
    """The embedded engine's greedy text of each prompt (the single-engine, fault-free text);
    computed once for each (prompts, max_tokens)."""
    from tandem.engine import Engine
    from tandem.sampling_params import SamplingParams

    global _embedded
    key = (tuple(prompts), max_tokens)
    if key in _references:
        return _references[key]
    if "_embedded" not in globals():
        _embedded = Engine.from_config(progress=False, model="smollm2", max_num_seqs=8, max_model_len=1024)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    _references[key] = {p: o.text for p, o in zip(prompts, _embedded.generate(prompts, params))}
    return _references[key]


def complete(base: str, prompt: str, max_tokens: int) -> tuple[int, str]:
    r = httpx.post(base + "/v1/completions", json={"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens,
                                                   "temperature": 0, "ignore_eos": True}, timeout=300)
    return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text


def stream(base: str, prompt: str, max_tokens: int, seen: dict) -> None:
    seen.update(text="", first=None, error=None, done=False)
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    try:
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=300) as r:
            if r.status_code != 200:
                seen["error"] = f"HTTP {r.status_code}: {r.read()[:300]!r}"
                return
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    seen["done"] = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        seen["error"] = chunk["error"]["message"]
                        break
                    seen["text"] += chunk["choices"][0]["text"]
                    seen["first"] = seen["first"] or time.monotonic()
    except httpx.HTTPError as e:
        seen["error"] = f"{type(e).__name__}: {e}"


def in_threads(calls) -> list:
    out = [None] * len(calls)

    def run(i, f):
        out[i] = f()

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


def per_replica(base: str, sample: str) -> dict[str, float]:
    """A counter's value on each engine replica (its `replica` label), from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=60).text):
        for s in family.samples:
            if s.name == sample and "replica" in s.labels:
                out[s.labels["replica"]] = out.get(s.labels["replica"], 0.0) + s.value
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def health(base: str) -> dict:
    try:
        r = httpx.get(base + "/health", timeout=30)
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    except httpx.HTTPError:
        return {}


def serving(base: str, n: int, timeout_s: float = 300) -> float:
    t0 = time.monotonic()
    wait_for(lambda: health(base).get("replicas") == n, timeout_s, f"{n} engine replicas serving", every_s=0.5)
    return time.monotonic() - t0


def two_replicas(base: str) -> dict:
    import ray

    from tandem.actors import connect

    result: dict = {"up_s": serving(base, 2)}
    result["outputs"] = sorted(e["outputs"] for e in health(base)["engines"].values())
    ref = reference(PROMPTS[:4], 24)
    texts = in_threads([lambda p=p: complete(base, p, 24) for p in PROMPTS[:4]])
    result["equal"] = [t == (200, ref[p]) for p, t in zip(PROMPTS[:4], texts)]

    before = per_replica(base, "tandem:request_success_total")
    in_threads([lambda i=i: complete(base, PROMPTS[i % 8], 8) for i in range(32)])
    result["spread"] = delta(per_replica(base, "tandem:request_success_total"), before)

    hits0, done0 = per_replica(base, "tandem:prefix_cache_hits_total"), per_replica(base, "tandem:request_success_total")
    for i in range(4):
        complete(base, PREFIX + f"Question {i}: when does the library open?", 4)
    result["prefix_requests"] = delta(per_replica(base, "tandem:request_success_total"), done0)
    result["prefix_hits"] = delta(per_replica(base, "tandem:prefix_cache_hits_total"), hits0)

    # kill one replica's scheduler actor while four streams run over both
    ref = reference(PROMPTS[:4], 96)
    seen = [{} for _ in range(4)]
    threads = [threading.Thread(target=stream, args=(base, p, 96, s)) for p, s in zip(PROMPTS, seen)]
    for t in threads:
        t.start()
    wait_for(lambda: all(s.get("first") for s in seen), 120, "a first chunk on every stream", every_s=0.01)
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["namespace"] == "tandem" and a["name"].startswith(BASE + "/"))
    held = {n: connect(n).health()["running"] for n in names}
    victim = max(names, key=lambda n: held[n])
    ray.kill(ray.get_actor(victim, namespace="tandem"), no_restart=True)
    killed = time.monotonic()
    during = [complete(base, PROMPTS[5], 8)[0] for _ in range(3)]  # new requests: to the replica that serves
    for t in threads:
        t.join(600)
    result["kill"] = {
        "held": held, "victim": victim, "during": during,
        "streams": [{"error": s["error"], "done": s["done"], "equal": s["text"] == ref[p]} for p, s in zip(PROMPTS, seen)],
        "restored_s": serving(base, 2) and time.monotonic() - killed,
        "after": [complete(base, p, 24) == (200, r) for p, r in reference(PROMPTS[:4], 24).items()],
    }
    return result


def autoscaled(base: str) -> dict:
    from ray import serve

    serve.delete("tandem")
    serve_app(int(base.rsplit(":", 1)[1]), {"autoscaling": {"min_replicas": 1, "max_replicas": 2,
                                                            "target_load_tokens": 150, "upscale_window_s": 2,
                                                            "downscale_window_s": 4}})
    result: dict = {"one_s": serving(base, 1)}
    prompts = PROMPTS[:6]
    ref = reference(prompts, 48)
    runs: list[tuple[str, dict]] = []
    state = {"clients": len(prompts)}

    def client(i: int) -> None:
        while i < state["clients"]:
            seen: dict = {}
            stream(base, prompts[i], 48, seen)
            runs.append((prompts[i], seen))

    def clients() -> list[threading.Thread]:
        ts = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in ts:
            t.start()
        return ts

    ts = clients()
    t0 = time.monotonic()
    result["up_s"] = serving(base, 2, 400)
    done0 = len(runs)
    wait_for(lambda: len(runs) >= done0 + 2 * len(prompts), 300, "requests served by two replicas", every_s=0.2)
    state["clients"] = 1  # a trickle: one stream at a time, while the count goes back down
    result["down_s"] = serving(base, 1, 400)
    state["clients"] = 0
    for t in ts:
        t.join(600)
    result["total_s"] = time.monotonic() - t0
    result["runs"] = len(runs)
    result["bad"] = [(p, s) for p, s in runs if s["error"] or not s["done"] or s["text"] != ref[p]][:5]
    result["deployment"] = serve.status().applications["tandem"].deployments["tandem-engine"].replica_states
    return result


if __name__ == "__main__":
    t0 = time.monotonic()
    port = serve_app(None, {"engine_replicas": 2})
    base = f"http://127.0.0.1:{port}"
    up = time.monotonic()
    result = {"two": two_replicas(base)}
    print("RESULT-TWO " + json.dumps(result["two"], default=str), flush=True)
    two = time.monotonic()
    result["auto"] = autoscaled(base)
    result["seconds"] = {"start": up - t0, "two": two - up, "auto": time.monotonic() - two}
    print("RESULT " + json.dumps(result, default=str), flush=True)
    import ray

    ray.shutdown()
    os._exit(0)
