"""The generation endpoints at the ASGI level (no Ray, no model): a client that goes away
mid-stream stops its request, and what HTTP itself gets wrong is an OpenAI error body."""
from __future__ import annotations

import asyncio
import json

from tandem.outputs import RequestOutput, Usage
from tandem.serve.args import TandemServeArgs
from tandem.serve.api import create_app
from tandem.serve.limits import ServeLimits


class EndlessBackend:
    """Streams one-token outputs until closed; records that it was."""

    model_name = "fake"

    def __init__(self):
        self.closed = asyncio.Event()

    async def astream(self, prompt=None, params=None, *, messages=None, request_id=None, deltas_only=False):
        try:
            n = 0
            while True:
                n += 1
                yield RequestOutput("r", None, [1], "", [], "x", [7], False, None, None, Usage(1, n))
                await asyncio.sleep(0.01)
        finally:
            self.closed.set()


def scope(method: str = "POST", path: str = "/v1/completions") -> dict:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": [], "query_string": b""}


async def call(app, scope_: dict, body: bytes, *, disconnect_after_chunks: int | None = None) -> list[dict]:
    """Run one request; the client goes away after that many body chunks (None: never)."""
    sent: list[dict] = []
    gone = asyncio.Event()
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        chunks = sum(1 for m in sent if m["type"] == "http.response.body")
        if disconnect_after_chunks is not None and chunks >= disconnect_after_chunks:
            gone.set()

    await asyncio.wait_for(app(scope_, receive, send), 10)
    return sent


def error_of(sent: list[dict]) -> tuple[int, dict]:
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]


def test_a_client_that_goes_away_mid_stream_stops_its_request():
    backend = EndlessBackend()
    app = create_app(backend)
    body = json.dumps({"model": "fake", "prompt": "hi", "max_tokens": 100, "stream": True}).encode()

    async def run():
        sent = await call(app, scope(), body, disconnect_after_chunks=3)
        assert backend.closed.is_set(), "the request's stream was not closed when its client left"
        return sent

    sent = asyncio.run(run())
    assert sent[0]["status"] == 200
    assert all(m.get("more_body", False) for m in sent[1:]), "no end of body is sent to a client that left"


def test_a_get_on_a_generation_endpoint_is_a_405_openai_error():
    status, err = error_of(asyncio.run(call(create_app(EndlessBackend()), scope("GET"), b"")))
    assert status == 405 and err["code"] == "method_not_allowed"


def test_a_body_over_the_limit_is_a_413_and_the_app_keeps_serving():
    app = create_app(EndlessBackend(), limits=ServeLimits.from_args(TandemServeArgs(max_body_bytes=1024)))
    big = json.dumps({"model": "fake", "prompt": "x" * 2000, "max_tokens": 1}).encode()
    status, err = error_of(asyncio.run(call(app, scope(), big)))
    assert status == 413 and err["code"] == "body_too_large"
    status, err = error_of(asyncio.run(call(app, scope(), b'{"model": "fake"}')))
    assert status == 400 and err["param"] == "prompt"


def test_other_paths_go_to_the_rest_of_the_api():
    sent = asyncio.run(call(create_app(EndlessBackend()), scope("GET", "/v1/models"), b""))
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"])["data"][0]["id"] == "fake"


def test_an_app_mounted_under_a_prefix_routes_on_the_path_below_it():
    # Serve with route_prefix "/llm" passes the prefix in both root_path and path
    mounted = {**scope("GET", "/llm/v1/completions"), "root_path": "/llm"}
    status, err = error_of(asyncio.run(call(create_app(EndlessBackend()), mounted, b"")))
    assert status == 405 and err["code"] == "method_not_allowed"  # reached the generation endpoint
