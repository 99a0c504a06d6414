"""Configured limits, met over real HTTP on the real engine (tests/serve/limits_app.py):
the body size, stop strings, prompt characters and the bound on requests held (429 with
Retry-After); past each, the next request is served."""
from __future__ import annotations

import threading
import time

import httpx

from tandem.serve.args import TandemServeArgs
from tandem.serve.limits import ServeLimits

from .limits_app import serve_with_limits


def _limits(**fields) -> ServeLimits:
    return ServeLimits.from_args(TandemServeArgs(max_model_len=512, max_num_seqs=1, **fields))


def _ok(v1: str) -> None:
    r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text


def test_from_args_counts_the_engine_slots_and_the_waiting_bound():
    limits = ServeLimits.from_args(TandemServeArgs(max_num_seqs=8, max_waiting_requests=3, max_model_len=100))
    assert limits.max_in_flight == 11 and limits.max_prompt_chars == 3200
    default = ServeLimits.from_args(TandemServeArgs())
    assert (default.max_body_bytes, default.max_stop_strings, default.max_tokens_limit) == (8 << 20, 4, 1024)


def test_configured_body_stop_and_prompt_limits_are_400s_and_413s_naming_them(server):
    limits = _limits(max_body_bytes=4096, max_stop_strings=1, max_stop_chars=3, max_prompt_chars=100)
    with serve_with_limits(limits) as (_, v1):
        r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "a" * 5000}, timeout=60)
        assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]
        r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "hi", "stop": ["a", "b"]}, timeout=60)
        assert r.status_code == 400 and "at most 1 stop" in r.json()["error"]["message"]
        r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "hi", "stop": "abcd"}, timeout=60)
        assert r.status_code == 400 and "3 characters" in r.json()["error"]["message"]
        r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "a" * 101}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        _ok(v1)


def test_past_the_waiting_bound_a_request_is_a_429_with_retry_after_and_the_held_ones_go_on(server):
    # max_num_seqs 1 + max_waiting_requests 1: two held at once, the third refused
    with serve_with_limits(_limits(max_waiting_requests=1)) as (app, v1):
        release, got = threading.Event(), []

        def hold() -> None:
            body = {"model": "smollm2", "prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{v1}/completions", json=body, timeout=120) as r:
                got.append(r.status_code)
                for _ in r.iter_lines():
                    if release.is_set():
                        break

        holders = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 60
        while app.in_flight < 2:
            assert time.monotonic() < deadline, f"{app.in_flight} requests held after 60 s"
            time.sleep(0.02)
        r = httpx.post(f"{v1}/completions", json={"model": "smollm2", "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "too_many_waiting_requests"
        release.set()
        for t in holders:
            t.join(120)
        assert got == [200, 200]
        deadline = time.monotonic() + 60
        while app.in_flight:
            assert time.monotonic() < deadline, "the held requests were not let go"
            time.sleep(0.02)
        _ok(v1)
