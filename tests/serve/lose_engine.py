"""Run by test_engine_loss.py in a process of its own (its own local Ray cluster): serve
with N ingress replicas, kill the engine's scheduler actor, and print as JSON what
clients saw until the app was whole again.

    python tests/serve/lose_engine.py N
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402


def main(replicas: int) -> dict:
    import ray
    from ray import serve

    from tandem.actors import init_local_ray
    from tandem.serve import build_app
    from tandem.serve.direct_http import free_port, start_serve, use_direct_http

    port = free_port()
    use_direct_http(port, replicas)
    init_local_ray(log_to_driver=False)
    start_serve("127.0.0.1", port)
    serve.run(build_app({"max_num_seqs": 4, "max_seq_len": 256, "engine_actor_name": "lose-me",
                         "ingress_replicas": replicas}), name="tandem", route_prefix="/", blocking=False)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    before = httpx.post(url, json=body, timeout=60).json()["choices"][0]["text"]

    ray.kill(ray.get_actor("lose-me", namespace="tandem"))
    killed = time.monotonic()
    outage = []  # (status, Retry-After) until the first 200
    while time.monotonic() - killed < 240:
        r = httpx.post(url, json=body, timeout=60)
        if r.status_code == 200:
            break
        outage.append((r.status_code, r.headers.get("retry-after"), r.json().get("error", {}).get("type")))
        time.sleep(0.5)
    back_s = time.monotonic() - killed
    while serve.status().applications["tandem"].status != "RUNNING" and time.monotonic() - killed < 300:
        time.sleep(1)
    after = [httpx.post(url, json=body, timeout=60) for _ in range(2 * replicas + 2)]
    return {
        "before": before,
        "outage": outage,
        "back_s": back_s,
        "status": serve.status().applications["tandem"].status.value,
        "after": [(r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text) for r in after],
    }


if __name__ == "__main__":
    result = main(int(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
    import ray

    ray.shutdown()  # the local cluster's processes; Serve's own shutdown would wait 30 s on its controller
    os._exit(0)
