"""What the HTTP app costs one streamed request on the ingress replica's event loop.

    python bench/http_app_cost.py [--requests 3000] [--chunks 1]

A burst of requests is taken in one after another on one event loop, so each request's
cost in the app adds to the first token of every request behind it. This drives the
app's ASGI callable directly (no sockets, no Serve, no engine: a backend that answers
at once with `--chunks` one-token outputs) and reports the microseconds a whole
streamed /v1/completions request takes, against the same request through a bare
FastAPI route with a StreamingResponse (the usual way to write such an endpoint). Prints
a short table, then one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from tandem.outputs import RequestOutput, Usage
from tandem.serve import openai_protocol as proto
from tandem.serve.api import create_app
from tandem.serve.sse_chunks import CompletionChunks, TextDeltas, data_line

BODY = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 32, "temperature": 0, "stream": True}).encode()


class InstantBackend:
    model_name = "m"

    def __init__(self, chunks: int):
        self.chunks = chunks

    async def astream(self, prompt=None, params=None, *, messages=None, request_id=None, deltas_only=False):
        for i in range(self.chunks):
            last = i == self.chunks - 1
            yield RequestOutput("r", None, [1], "x" * (i + 1) if last else "", [7] * (i + 1) if last else [], "x", [7],
                                last, "length" if last else None, None, Usage(1, i + 1))


def fastapi_baseline(backend: InstantBackend) -> FastAPI:
    """The same work behind FastAPI's routing and StreamingResponse."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = proto.CompletionRequest.model_validate(json.loads(await request.body()))
        params = req.sampling_params(16, 1024)
        chunks, deltas = CompletionChunks("cmpl-x", "m", 0, False), TextDeltas(params.stop)
        outputs = backend.astream(req.prompts()[0], params, deltas_only=True)

        async def events():
            async for out in outputs:
                for c in chunks.delta(out, deltas.next(out)):
                    yield data_line(c)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def one(app) -> None:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000)}
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        pass

    await app(scope, receive, send)


async def per_request_us(app, n: int) -> float:
    for _ in range(min(200, n)):  # warm up
        await one(app)
    t = time.perf_counter()
    for _ in range(n):
        await one(app)
    return 1e6 * (time.perf_counter() - t) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--chunks", type=int, default=1, help="one-token outputs a request streams")
    args = ap.parse_args(argv)
    backend = InstantBackend(args.chunks)
    apps = {"tandem app": create_app(backend), "FastAPI route": fastapi_baseline(backend)}
    # best of three runs each, one app after the other: load on the machine only ever slows a run down
    results = {name: min(asyncio.run(per_request_us(app, args.requests)) for _ in range(3)) for name, app in apps.items()}
    print(f"{'app':>14} {'us a streamed request':>22}")
    for name, us in results.items():
        print(f"{name:>14} {us:>22.1f}")
    print(json.dumps({"requests": args.requests, "chunks": args.chunks, "tandem_app_us": round(results["tandem app"], 1),
                      "fastapi_route_us": round(results["FastAPI route"], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
