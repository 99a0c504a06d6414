"""`tandem serve`: its own local Ray cluster and the app, the URL printed, a request
answered, and a clean stop on a SIGTERM to its whole process group (`timeout`, a
supervisor), which stops the cluster's processes too, and on Ctrl-C (SIGINT) with two
ingress replicas behind HAProxy, both serving the same text, HAProxy stopped with it.
(SIGINT and SIGTERM share one handler, so the HAProxy case's SIGINT is also the plain
SIGINT or SIGTERM stop: each case starts a cluster of its own, ~50 s on 2 cores.)"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from tandem.serve.direct_http import free_port as _free_port


def _start(port: int, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "serve", "--port", str(port), "--max-num-seqs", "4", "--api-key", "k", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return proc, lines


def _wait_for_url(proc: subprocess.Popen, lines: list[str], port: int) -> str:
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while not any(url in line for line in lines):
        assert proc.poll() is None, "".join(lines)[-4000:]
        assert time.monotonic() < deadline, "no URL printed within 300 s:\n" + "".join(lines)[-4000:]
        time.sleep(0.2)
    return url


@pytest.mark.slow
def test_tandem_serve_prints_the_url_serves_and_stops_cleanly_on_a_sigterm_to_its_group():
    with _served() as (proc, lines, port, url):
        headers = {"Authorization": "Bearer k"}
        assert httpx.get(url + "/models", timeout=30).status_code == 401
        r = httpx.post(url + "/completions", headers=headers, timeout=120,
                       json={"model": "smollm2", "prompt": "Hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3

        # the cluster's processes get the signal too: Serve must not wait for its controller
        os.killpg(proc.pid, signal.SIGTERM)
        _assert_stopped(proc, lines, port, 25)


@contextmanager
def _served(*extra: str):
    """`tandem serve` running: (process, its output lines, port, /v1 URL); killed after."""
    port = _free_port()
    proc, lines = _start(port, *extra)
    try:
        yield proc, lines, port, _wait_for_url(proc, lines, port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _assert_stopped(proc: subprocess.Popen, lines: list[str], port: int, within_s: float) -> None:
    assert proc.wait(within_s) == 0, "".join(lines)[-4000:]
    with socket.socket() as s:  # nothing listens there any more: no HAProxy left behind either
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"


def _stream_text(url: str, body: dict) -> str:
    text = ""
    with httpx.stream("POST", url + "/completions", headers={"Authorization": "Bearer k"}, timeout=120,
                      json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


@pytest.mark.slow
def test_two_ingress_replicas_behind_haproxy_both_serve_the_same_text_and_stop_cleanly():
    with _served("--ingress-replicas", "2") as (proc, lines, port, url):
        (ports_line,) = [line for line in lines if "HAProxy" in line]
        stats_port = int(re.search(r"ports (\d+) \(stats\)", ports_line).group(1))
        body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
        with ThreadPoolExecutor(8) as pool:
            streamed = list(pool.map(lambda _: _stream_text(url, body), range(8)))
            whole = list(pool.map(lambda _: httpx.post(url + "/completions", json=body, timeout=120,
                                                      headers={"Authorization": "Bearer k"}).json(), range(8)))
        texts = {w["choices"][0]["text"] for w in whole}
        assert len(texts) == 1 and texts == set(streamed), (texts, streamed)
        assert all(w["usage"]["completion_tokens"] == 6 for w in whole)

        # HAProxy's own count: two ingress replicas, and each took requests
        stats = httpx.get(f"http://127.0.0.1:{stats_port}/stats;csv", timeout=10).text
        header, *rows = [row.split(",") for row in stats.splitlines()]
        name, total = header.index("svname"), header.index("stot")
        replicas = {row[name]: int(row[total]) for row in rows if row[name].startswith("SERVE_REPLICA_")}
        assert len(replicas) == 2 and all("tandem-openai" in r for r in replicas), stats
        assert min(replicas.values()) > 0, stats

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _assert_stopped(proc, lines, port, 90)
