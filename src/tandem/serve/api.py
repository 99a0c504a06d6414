"""The OpenAI-compatible HTTP API as a FastAPI app over a backend (no Ray here).

The backend is anything with the TandemHandle's async surface (agenerate, astream,
ahealth, ametrics, model_name), so the HTTP layer can be tested on a fake engine;
the Serve deployment in tandem.serve.app passes a TandemHandle on the SchedulerActor.

    POST /v1/completions        one prompt (text or token ids); stream: true = SSE
    POST /v1/chat/completions   messages through the tokenizer's chat template
    GET  /v1/models, /health, /metrics (Prometheus: the engine's counters and ours)
"""
from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.outputs import RequestOutput
from tandem.serve import openai_protocol as proto
from tandem.serve.errors import APIError, bad_request, from_exception, from_validation, generation_failed

log = logging.getLogger("tandem.serve")


class Backend(Protocol):
    model_name: str

    async def agenerate(self, prompt=None, params=None, *, messages=None, request_id=None) -> RequestOutput: ...

    def astream(self, prompt=None, params=None, *, messages=None, request_id=None,
                deltas_only=False) -> AsyncIterator[RequestOutput]: ...

    async def ahealth(self) -> dict: ...

    async def ametrics(self) -> bytes: ...


def create_app(
    backend: Backend,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_tokens_limit: int = 1024,
    default_chat_max_tokens: int | None = None,
) -> FastAPI:
    """The FastAPI app serving `backend` under the model id `model_name`."""
    model_name = model_name or backend.model_name
    chat_default = default_chat_max_tokens or max_tokens_limit
    app = FastAPI(title="tandem", description="OpenAI-compatible speculative-decoding server.")

    # ---- errors as OpenAI bodies ----------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException):
        type_ = "invalid_request_error" if e.status_code < 500 else "server_error"
        return APIError(e.status_code, str(e.detail), type_, code=str(e.status_code)).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError):
        return bad_request(str(e.errors()[0].get("msg", e))).response()

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", "invalid_request_error", code="invalid_api_key")

    async def parse(request: Request, model_cls):
        authorize(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object", code="invalid_json")
        try:
            req = model_cls.model_validate(body)
        except ValidationError as e:
            raise from_validation(e) from None
        if req.model != model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                           "invalid_request_error", param="model", code="model_not_found")
        return req

    # ---- generation ---------------------------------------------------------------------

    async def generate(req, prompt, messages, chunks, as_json) -> Response:
        """Start the request; answer with JSON (as_json(final output)) or an SSE stream.
        Errors before the first output (bad input, recovering) are plain HTTP errors."""
        outputs = None
        try:
            params = req.sampling_params(req_default_max_tokens(req), max_tokens_limit)
            if not req.stream:
                out = await backend.agenerate(prompt, params, messages=messages)
                if out.finish_reason == "error":
                    raise generation_failed(out.error)
                return JSONResponse(as_json(out))
            outputs = backend.astream(prompt, params, messages=messages, deltas_only=True)
            first = await outputs.__anext__()
        except BaseException as e:
            if outputs is not None:
                await outputs.aclose()  # aborts the request (a client that went away, say)
            if isinstance(e, Exception):  # every error becomes an OpenAI error body
                raise from_exception(e) from None
            raise
        return StreamingResponse(sse(first, outputs, chunks, TextDeltas(params.stop)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def req_default_max_tokens(req) -> int:
        return 16 if isinstance(req, proto.CompletionRequest) else chat_default

    async def sse(first: RequestOutput, outputs: AsyncIterator[RequestOutput], chunks, deltas: "TextDeltas") -> AsyncIterator[str]:
        """data: {...} chunks, then data: [DONE]; a failed request sends an error event and ends."""
        try:
            out = first
            for c in chunks.start():
                yield _data(c)
            while True:
                if out.finish_reason == "error":
                    yield generation_failed(out.error).sse()
                    return
                for c in chunks.delta(out, deltas.next(out)):
                    yield _data(c)
                if out.finished:
                    break
                out = await outputs.__anext__()
            for c in chunks.end(out):
                yield _data(c)
            yield "data: [DONE]\n\n"
        except StopAsyncIteration:
            yield generation_failed("the stream ended without a final output").sse()
        except Exception as e:  # noqa: BLE001 - a failing stream ends with an error event, never hangs
            log.exception("stream failed")
            yield from_exception(e).sse()
        finally:
            await outputs.aclose()

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await parse(request, proto.CompletionRequest)
        try:
            prompt = req.single_prompt()
        except Exception as e:  # noqa: BLE001
            raise from_exception(e) from None
        rid, created = proto.new_id("cmpl"), int(time.time())
        chunks = _CompletionChunks(rid, model_name, created, req.include_usage)
        return await generate(req, prompt, None, chunks, lambda out: proto.completion_response(rid, model_name, out))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await parse(request, proto.ChatCompletionRequest)
        try:
            messages = req.template_messages()
        except Exception as e:  # noqa: BLE001
            raise from_exception(e) from None
        rid, created = proto.new_id("chatcmpl"), int(time.time())
        chunks = _ChatChunks(rid, model_name, created, req.include_usage)
        return await generate(req, None, messages, chunks, lambda out: proto.chat_response(rid, model_name, out))

    # ---- the rest -----------------------------------------------------------------------

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "tandem"}]}

    @app.get("/health")
    async def health():
        try:
            h = await backend.ahealth()
        except Exception as e:  # noqa: BLE001
            return JSONResponse({"status": "down", "error": str(e)}, status_code=503)
        if h.get("recovering"):
            return JSONResponse(h, status_code=503, headers={"Retry-After": "5"})
        return h

    @app.get("/metrics")
    async def metrics():
        engine = await backend.ametrics()
        return Response(engine, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class TextDeltas:
    """What to send of each output's text: everything new, except a tail that may still
    turn out to begin a stop string (the final text ends before the stop string, so
    text sent early could not be taken back). Outputs before the last are deltas only
    (the backend streams with deltas_only); the last carries the whole text."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.sent = 0  # characters sent so far
        self.pending = ""  # received, held back

    def next(self, out: RequestOutput) -> str:
        if out.finished:
            delta, self.sent = out.text[self.sent :], max(self.sent, len(out.text))
            return delta
        self.pending += out.delta_text
        cut = len(self.pending) - self._held_back(self.pending)
        delta, self.pending = self.pending[:cut], self.pending[cut:]
        self.sent += len(delta)
        return delta

    def _held_back(self, text: str) -> int:
        for k in range(min(len(text), max((len(s) - 1 for s in self.stops), default=0)), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stops):
                return k
        return 0


def _data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _CompletionChunks:
    obj = "text_completion"

    def __init__(self, rid: str, model: str, created: int, include_usage: bool):
        self.rid, self.model, self.created, self.include_usage = rid, model, created, include_usage

    def start(self) -> list[dict]:
        return []

    def delta(self, out: RequestOutput, text: str) -> list[dict]:
        if not text and not out.finished:
            return []
        return [proto.completion_chunk(self.rid, self.model, self.created, text, proto.finish_reason(out))]

    def end(self, out: RequestOutput) -> list[dict]:
        return [proto.usage_chunk(self.rid, self.model, self.created, self.obj, out)] if self.include_usage else []


class _ChatChunks(_CompletionChunks):
    obj = "chat.completion.chunk"

    def start(self) -> list[dict]:
        return [proto.chat_chunk(self.rid, self.model, self.created, {"role": "assistant", "content": ""}, None)]

    def delta(self, out: RequestOutput, text: str) -> list[dict]:
        chunks = []
        if text:
            chunks.append(proto.chat_chunk(self.rid, self.model, self.created, {"content": text}, None))
        if out.finished:
            chunks.append(proto.chat_chunk(self.rid, self.model, self.created, {}, proto.finish_reason(out)))
        return chunks
