"""Run by test_actor_loss.py in a process of its own (its own local Ray cluster): serve
with N ingress replicas, kill the app's actors in turn (each case once the app is whole
again), and print as JSON what clients saw in each case.

    python tests/serve/lose_actor.py engine,ingress N
      engine:  the engine's scheduler actor
      ingress: one ingress replica, mid-stream
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

BODY = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
LONG = {"model": "smollm2", "prompt": "Count to one hundred: 1, 2, 3,", "max_tokens": 150, "temperature": 0,
        "ignore_eos": True}


def serve_app(replicas: int) -> int:
    """The app on a local cluster, HAProxy in front of `replicas` ingress replicas; its port."""
    from ray import serve

    from tandem.actors import init_local_ray
    from tandem.serve import build_app
    from tandem.serve.direct_http import free_port, start_serve, use_direct_http

    port = free_port()
    use_direct_http(port, replicas)
    init_local_ray(log_to_driver=False)
    start_serve("127.0.0.1", port)
    # health checks every 2 s: the lost engine's replica is replaced after three failed ones
    serve.run(build_app({"max_num_seqs": 4, "max_model_len": 256, "engine_actor_name": "lose-me",
                         "ingress_replicas": replicas, "health_check_period_s": 2.0}),
              name="tandem", route_prefix="/", blocking=False)
    return port


def wait_running(since: float, limit_s: float = 300) -> str:
    from ray import serve

    while serve.status().applications["tandem"].status != "RUNNING" and time.monotonic() - since < limit_s:
        time.sleep(1)
    return serve.status().applications["tandem"].status.value


def lose_engine(base: str, replicas: int) -> dict:
    import ray

    url = base + "/v1/completions"
    before = httpx.post(url, json=BODY, timeout=60).json()["choices"][0]["text"]
    engine = ray.get_actor("lose-me", namespace="tandem")
    ray.kill(engine)
    killed = time.monotonic()
    # ray.kill returns before the actor is dead: a request sent sooner may still be served
    wait_for(lambda: dead(engine), 60, "the killed scheduler actor to be dead")
    outage = []  # what each response said until the first 200
    took = []  # how long each request took, that 200 too
    while time.monotonic() - killed < 240:
        sent = time.monotonic()
        r = httpx.post(url, json=BODY, timeout=60)
        took.append(time.monotonic() - sent)
        if r.status_code == 200:
            break
        outage.append(said(r))
        time.sleep(0.5)  # the client's pace between retries, not a wait for a condition
    back_s = time.monotonic() - killed
    status = wait_running(killed)
    after = [httpx.post(url, json=BODY, timeout=60) for _ in range(2 * replicas + 2)]
    return {
        "before": before,
        "outage": outage,
        "took_s": took,
        "back_s": back_s,
        "status": status,
        "after": [(r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text) for r in after],
    }


def dead(actor) -> bool:
    import ray

    try:
        ray.get(actor.health.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:  # dying: it answers no more
        pass
    return False


def said(r: httpx.Response) -> tuple:
    """(status, Retry-After, the OpenAI error type), or for a body that is not JSON
    (status, Retry-After, "not JSON", its content type, its start)."""
    try:
        kind = r.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return r.status_code, r.headers.get("retry-after"), "not JSON", r.headers.get("content-type"), r.text[:200]
    return r.status_code, r.headers.get("retry-after"), kind


def replica_ports(replicas: int) -> list[int]:
    """The ingress replicas' own ports, from the config Serve writes for HAProxy (a port of
    their range that something listens on may be any process's)."""
    import re

    import ray

    folder, name = os.path.split(os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "/tmp/haproxy-serve/haproxy.cfg"))
    path = os.path.join(folder, ray.get_runtime_context().get_node_id(), name)
    deadline = time.monotonic() + 60
    while True:
        with open(path) as f:
            ports = sorted({int(p) for p in re.findall(r"server SERVE_REPLICA_\S*tandem-openai\S* [\d.]+:(\d+)", f.read())})
        if len(ports) >= replicas or time.monotonic() > deadline:
            return ports
        time.sleep(0.5)


def stream(port: int, seen: dict) -> None:
    """LONG, streamed straight from one replica's port; what came, and how it ended."""
    seen.update(text="", first=None, ended=None, error=None)
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json={**LONG, "stream": True},
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        seen["error"] = chunk["error"]["message"]
                        break
                    seen["text"] += chunk["choices"][0]["text"]
                    seen["first"] = seen["first"] or time.monotonic()
    except httpx.HTTPError as e:
        seen["error"] = f"{type(e).__name__}: {e}"
    seen["ended"] = time.monotonic()


def running(base: str) -> float:
    metrics = httpx.get(base + "/metrics", timeout=30).text
    (line,) = [x for x in metrics.splitlines() if x.startswith("tandem:num_requests_running{")]  # one replica's
    return float(line.split()[-1])


def lose_ingress(base: str, replicas: int) -> dict:
    import ray

    alone = httpx.post(base + "/v1/completions", json=LONG, timeout=120).json()["choices"][0]["text"]
    ports = replica_ports(replicas)
    seen = [{}, {}]
    threads = [threading.Thread(target=stream, args=(port, into)) for port, into in zip(ports, seen)]
    for t in threads:
        t.start()
    wait_for(lambda: all(into.get("first") for into in seen), 60, "a first chunk on both streams", every_s=0.01)
    # one replica goes: one stream, on one of the two ports, must end and the other go on
    replica = next(a for a in ray.util.list_named_actors(all_namespaces=True) if "tandem-openai" in a["name"])
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    killed = time.monotonic()
    for t in threads:
        t.join(120)
    settled = time.monotonic()
    while running(base) > 0 and time.monotonic() - settled < 30:  # the lost replica's request is aborted
        time.sleep(0.2)
    status = wait_running(killed)
    return {
        "alone": alone,
        "ports": ports,
        "streams": [{"text": x["text"], "error": x["error"], "ended_s": x["ended"] - killed} for x in seen],
        "running_after": running(base),
        "status": status,
        "after": [httpx.post(base + "/v1/completions", json=BODY, timeout=60).status_code for _ in range(2 * replicas)],
    }


if __name__ == "__main__":
    cases, n = sys.argv[1].split(","), int(sys.argv[2])
    base = f"http://127.0.0.1:{serve_app(n)}"
    # one app for every case (a cluster and an app take most of a case's time); each case
    # ends with the app RUNNING and serving on every replica, so the next starts whole
    result = {what: {"engine": lose_engine, "ingress": lose_ingress}[what](base, n) for what in cases}
    print("RESULT " + json.dumps(result), flush=True)
    import ray

    from tandem.serve.direct_http import stop_haproxy

    node_id = ray.get_runtime_context().get_node_id()
    ray.shutdown()  # the local cluster's processes; Serve's own shutdown would wait 30 s on its controller
    print(f"HAPROXY_STOPPED {stop_haproxy(node_id)}", flush=True)
    os._exit(0)
