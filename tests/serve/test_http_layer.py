"""The OpenAI HTTP layer on a fake engine (no Ray, no model): error mapping, SSE framing
and the API key. The real app is tested end to end in the other files here."""
from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient

from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.outputs import RequestOutput, Usage
from tandem.serve.api import create_app


def _out(text: str, delta: str, finished: bool, reason: str | None = None, error: str | None = None) -> RequestOutput:
    n = len(text)
    return RequestOutput("r", None, [1, 2], text, list(range(n)), delta, [0] * len(delta), finished, reason, error, Usage(2, n))


class FakeBackend:
    """Answers from a script: `outputs` for streams and generate, or raises `error`."""

    model_name = "fake"

    def __init__(self, outputs=None, error: Exception | None = None):
        self.outputs = outputs or [_out("ab", "a", False), _out("abc", "bc", True, "length")]
        self.error = error
        self.calls = []

    async def agenerate(self, prompt=None, params=None, *, messages=None, request_id=None):
        self.calls.append((prompt, params, messages))
        if self.error:
            raise self.error
        return self.outputs[-1]

    async def astream(self, prompt=None, params=None, *, messages=None, request_id=None, deltas_only=False):
        self.calls.append((prompt, params, messages))
        if self.error:
            raise self.error
        for o in self.outputs:  # as the real handle: before the last output, deltas only
            yield dataclasses.replace(o, text="", token_ids=[]) if deltas_only and not o.finished else o

    async def ahealth(self):
        return {"status": "ok", "recovering": False}

    async def ametrics(self):
        return b"tandem:spec_decode_num_drafts_total 0.0\n"


def client(backend=None, **kw) -> TestClient:
    return TestClient(create_app(backend or FakeBackend(), **kw))


def events(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_a_failed_batch_is_a_500_with_an_openai_error_body():
    backend = FakeBackend([_out("", "", True, "error", error="verify failed: rank 1 lost")])
    r = client(backend).post("/v1/completions", json={"model": "fake", "prompt": "hi"})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "rank 1 lost" in err["message"]


def test_a_failed_stream_sends_an_error_event_and_ends_without_done():
    backend = FakeBackend([_out("a", "a", False), _out("a", "", True, "error", error="verify failed: rank 1 lost")])
    r = client(backend).post("/v1/completions", json={"model": "fake", "prompt": "hi", "stream": True})
    assert r.status_code == 200
    data = events(r.text)
    assert json.loads(data[0])["choices"][0]["text"] == "a"
    assert "rank 1 lost" in json.loads(data[-1])["error"]["message"]
    assert "[DONE]" not in data


def test_recovering_is_a_503_with_retry_after():
    backend = FakeBackend(error=EngineUnavailableError("recovering", retry_after_s=2.5))
    for stream in (False, True):
        r = client(backend).post("/v1/completions", json={"model": "fake", "prompt": "hi", "stream": stream})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert r.json()["error"]["code"] == "recovering"


def test_an_engine_refusal_is_a_400_naming_the_field():
    backend = FakeBackend(error=InvalidRequestError("prompt", "must not be empty"))
    r = client(backend).post("/v1/completions", json={"model": "fake", "prompt": ""})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "must not be empty", "type": "invalid_request_error", "param": "prompt", "code": None}


@pytest.mark.parametrize(
    "body, param",
    [
        ('{"model": "fake", "prompt": ', None),
        ('{"model": "fake"}', "prompt"),
        ('{"prompt": "x"}', "model"),
        ('{"model": "fake", "prompt": "x", "max_tokens": "7"}', "max_tokens"),
        ('{"model": "fake", "prompt": "x", "temperature": "hot"}', "temperature"),
        ('{"model": "fake", "prompt": "x", "max_tokens": 100000}', "max_tokens"),
        ('{"model": "fake", "prompt": "x", "n": 0}', "n"),
        ('{"model": "fake", "prompt": "x", "n": 1000}', "n"),
        ('{"model": "fake", "prompt": "x", "n": 3, "best_of": 2}', "best_of"),
        ('{"model": "fake", "prompt": "x", "best_of": 2, "stream": true}', "best_of"),
        ('{"model": "fake", "prompt": "x", "logprobs": 21}', "logprobs"),
        ('{"model": "fake", "prompt": "x", "max_tokenz": 3}', "max_tokenz"),
        ('{"model": "fake", "prompt": []}', "prompt"),
        ('{"model": "fake", "prompt": ["a", []]}', "prompt"),
        ('{"model": "fake", "prompt": 5}', "prompt"),
        ('["model"]', None),
    ],
)
def test_bad_completion_bodies_are_400s_naming_the_field(body, param):
    r = client(max_tokens_limit=512).post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_bad_chat_messages_are_400s():
    c = client()
    for messages in ([], [{"role": "user"}], [{"role": "wizard", "content": "x"}], "hi"):
        r = c.post("/v1/chat/completions", json={"model": "fake", "messages": messages})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_an_unknown_model_is_a_404_model_not_found():
    r = client().post("/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_api_key_is_required_on_v1_but_not_on_health():
    c = client(api_key="sekret")
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert c.post("/v1/completions", json={"model": "fake", "prompt": "x"}).status_code == 401
    assert c.get("/health").status_code == 200


def test_chat_stream_frames_role_then_content_then_finish_then_usage_then_done():
    r = client().post("/v1/chat/completions", json={
        "model": "fake", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 5,
    })
    data = events(r.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "abc"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_request_fields_reach_the_engine_as_sampling_params():
    backend = FakeBackend()
    client(backend).post("/v1/completions", json={
        "model": "fake", "prompt": [1, 2, 3], "max_tokens": 9, "temperature": 0.5, "top_p": 0.9,
        "seed": 4, "stop": "\n", "top_k": 3, "ignore_eos": True,
    })
    prompt, params, _ = backend.calls[0]
    assert prompt == [1, 2, 3]
    assert (params.max_tokens, params.temperature, params.top_p, params.seed, params.stop, params.top_k, params.ignore_eos) == (
        9, 0.5, 0.9, 4, ("\n",), 3, True)


def test_a_stream_holds_back_text_that_may_begin_a_stop_string():
    backend = FakeBackend([_out("The Pa", "The Pa", False), _out("The Par", "r", False), _out("The ", "", True, "stop")])
    r = client(backend).post("/v1/completions", json={"model": "fake", "prompt": "x", "stream": True, "stop": ["Paris"]})
    texts = [json.loads(d)["choices"][0]["text"] for d in events(r.text)[:-1]]
    assert "".join(texts) == "The "


def test_stream_deltas_hold_back_what_may_begin_a_stop_string():
    from tandem.serve.sse_chunks import TextDeltas

    d = TextDeltas(("\n\nEND",))
    sent = [d.next(_out("", x, False)) for x in ("a", "b\n", "\nE", "N")]
    assert sent == ["a", "b", "", ""]  # "\n", "\n\nE", "\n\nEN" might begin the stop string
    assert d.next(_out("ab", "", True, "stop")) == ""  # the engine cut the text at the stop string
    d = TextDeltas(("\n\nEND",))
    sent = [d.next(_out("", x, False)) for x in ("a\n", "\nx")]
    assert sent == ["a", "\n\nx"] and d.next(_out("a\n\nxyz", "yz", True, "length")) == "yz"


class LostEngine(FakeBackend):
    """An engine whose scheduler actor is gone: health and metrics raise as the handle does."""

    async def ahealth(self):
        raise EngineUnavailableError("the engine's scheduler actor is gone", retry_after_s=3.0)

    async def ametrics(self):
        raise EngineUnavailableError("the engine's scheduler actor is gone", retry_after_s=3.0)


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_health_and_metrics_of_a_lost_engine_are_503_json_with_retry_after(path):
    r = TestClient(create_app(LostEngine()), raise_server_exceptions=False).get(path)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "3"
    err = r.json()["error"]
    assert err["type"] == "service_unavailable" and "scheduler actor is gone" in err["message"]


def test_an_unexpected_fault_outside_generation_is_a_500_json_body():
    class Broken(FakeBackend):
        async def ametrics(self):
            raise RuntimeError("registry exploded")

    r = TestClient(create_app(Broken()), raise_server_exceptions=False).get("/metrics")
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error" and "registry exploded" in r.json()["error"]["message"]
