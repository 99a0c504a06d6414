"""A long prompt on the default model over HTTP (real Ray Serve): the paged KV holds a
sequence as long as the context it needs, not a fixed slot, and a request that can never
fit is a 400 before anything runs."""
from __future__ import annotations

import httpx

from .test_hostile_input import assert_error, assert_serves, body, post

PARAGRAPH = ("The lighthouse keeper wrote down the weather every hour: wind, rain, the colour of the sea, "
             "and which ships passed the point before the tide turned. ")


def test_a_prompt_of_over_4000_tokens_is_answered_end_to_end(server):
    prompt = PARAGRAPH * 135 + "In one sentence, what did the keeper write down?"
    r = httpx.post(f"{server.v1}/completions", json={"model": server.model, "prompt": prompt, "max_tokens": 8,
                                                     "temperature": 0, "ignore_eos": True}, timeout=300)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 4000 and usage["completion_tokens"] == 8
    assert r.json()["choices"][0]["text"].strip()
    health = httpx.get(server.base_url + "/health", timeout=30).json()
    kv = health["kv_cache"]
    assert kv["num_tokens"] == kv["num_blocks"] * kv["block_size"] >= 4608


def test_a_max_tokens_that_cannot_fit_the_context_with_the_prompt_is_a_400(server):
    r = post(server, "completions", body(prompt=[1] * 4600, max_tokens=100))
    assert_error(r, 400, "max_tokens", None, "max_model_len 4608")
    assert_serves(server)
