"""Bad HTTP input against the running app: 4xx with an OpenAI error body, and the
server keeps serving."""
from __future__ import annotations

import httpx
import pytest

from .conftest import MAX_TOKENS_LIMIT

CASES = [
    ("completions", '{"model": "smollm2", "prompt": "hi", ', 400, None),
    ("completions", '{"model": "smollm2"}', 400, "prompt"),
    ("completions", '{"prompt": "hi"}', 400, "model"),
    ("completions", '{"model": "smollm2", "prompt": "hi", "max_tokens": "12"}', 400, "max_tokens"),
    ("completions", '{"model": "smollm2", "prompt": "hi", "temperature": [1]}', 400, "temperature"),
    ("completions", '{"model": "smollm2", "prompt": "hi", "max_tokens": %d}' % (MAX_TOKENS_LIMIT + 1), 400, "max_tokens"),
    ("completions", '{"model": "smollm2", "prompt": "hi", "top_p": 0}', 400, "top_p"),
    ("completions", '{"model": "smollm2", "prompt": ""}', 400, "prompt"),
    ("completions", '{"model": "smollm2", "prompt": [99999999]}', 400, "prompt"),
    ("completions", '{"model": "gpt-4", "prompt": "hi"}', 404, "model"),
    ("chat/completions", '{"model": "smollm2", "messages": [{"role": "user"}]}', 400, "messages"),
    ("chat/completions", '{"model": "smollm2", "messages": "hi", "stream": true}', 400, "messages"),
    ("chat/completions", '{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}', 400, "max_tokens"),
]


@pytest.mark.parametrize("path, body, status, param", CASES)
def test_bad_input_is_a_4xx_openai_error_and_the_server_keeps_serving(server, path, body, status, param):
    r = httpx.post(f"{server.v1}/{path}", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error" and err["param"] == param

    ok = httpx.post(f"{server.v1}/completions", json={"model": server.model, "prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_an_unknown_route_is_a_404_error_body(server):
    r = httpx.get(server.base_url + "/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
