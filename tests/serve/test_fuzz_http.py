"""Schema-driven fuzzing of both generation endpoints of the served app (schemathesis,
from the app's own /openapi.json): negative cases (bodies that break the schema) and
positive ones, with max_tokens kept small. No case may get a 5xx, every 4xx carries an
OpenAI error body, and the server serves a normal request afterwards. Bounded: a fixed
number of cases per endpoint and mode, derandomized (the same cases every run), and a
wall-clock budget."""
from __future__ import annotations

import json
import time

import httpx
import pytest

CASES_PER_RUN = 40  # x 2 endpoints x 2 modes = 160 requests
BUDGET_S = 80


@pytest.fixture(scope="module")
def schema(server):
    import schemathesis

    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


@pytest.mark.parametrize("mode", ["negative", "positive"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_no_case_gets_a_5xx_and_every_4xx_is_an_error_body(server, schema, path, mode):
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    op = schema[path]["POST"]
    started, seen = time.monotonic(), []
    client = httpx.Client(base_url=server.base_url, timeout=60)

    @settings(max_examples=CASES_PER_RUN, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(GenerationMode(mode)))
    def check(case):
        if time.monotonic() - started > BUDGET_S / 4:
            return  # the budget of this endpoint and mode is spent
        body = case.body
        if isinstance(body, dict):  # keep generation short: the fuzzing is of the HTTP layer
            if mode == "positive":
                body["model"] = server.model  # else nearly every valid case is a 404 for its random model name
                if "max_completion_tokens" not in body:
                    body.setdefault("max_tokens", 4)  # not the server's default of max_tokens_limit
            for key, most in (("max_tokens", 4), ("max_completion_tokens", 4), ("n", 2), ("best_of", 2)):
                if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > most:
                    body[key] = most
        content = body if isinstance(body, bytes) else json.dumps(body).encode()  # NaN stays NaN: also a case
        headers = {"content-type": case.media_type or "application/json", **(case.headers or {})}
        r = client.post(path, headers=headers, content=content)
        seen.append(r.status_code)
        assert r.status_code < 500, f"{r.status_code} for {body!r}: {r.text[:500]}"
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["message"] and err["type"] and set(err) == {"message", "type", "param", "code"}, r.text

    check()
    assert len(seen) >= 10, f"only {len(seen)} cases ran"
    print(f"{path} {mode}: {len(seen)} cases in {time.monotonic() - started:.1f} s, statuses {sorted(set(seen))}")
    if mode == "negative":
        assert any(400 <= s < 500 for s in seen)
    ok = client.post("/v1/completions", json={"model": server.model, "prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200, ok.text
