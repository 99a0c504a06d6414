"""The generation endpoints, POST /v1/completions and /v1/chat/completions, as plain ASGI.

Every request a server serves comes through here, and a burst of them is taken in one
after another on the ingress replica's single event loop: what each costs there is
added to the time to first token of all that come after it. Through FastAPI (routing,
dependency solving, two exception middlewares, StreamingResponse's task group and
send wrappers) a streamed request cost 135 us in the app against 24 us here
(`python bench/http_app_cost.py` on the project's 2-core CPU box). Everything else
(models, health, metrics, unknown paths) goes to the FastAPI app behind (`fallback`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Protocol

from pydantic import ValidationError

from tandem.outputs import RequestOutput
from tandem.serve import openai_protocol as proto
from tandem.serve.errors import APIError, bad_request, from_exception, from_validation, generation_failed
from tandem.serve.sse_chunks import ChatChunks, CompletionChunks, TextDeltas, data_line

log = logging.getLogger("tandem.serve")

MAX_BODY_BYTES = 8 << 20  # a prompt of a long context, as text or token ids, fits many times over
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


class Backend(Protocol):
    model_name: str

    async def agenerate(self, prompt=None, params=None, *, messages=None, request_id=None) -> RequestOutput: ...

    def astream(self, prompt=None, params=None, *, messages=None, request_id=None,
                deltas_only=False) -> AsyncIterator[RequestOutput]: ...

    async def ahealth(self) -> dict: ...

    async def ametrics(self) -> bytes: ...


class GenerationApp:
    """ASGI: the two generation endpoints; every other request goes to `fallback`."""

    def __init__(self, backend: Backend, fallback, *, model_name: str, api_key: str | None, max_tokens_limit: int,
                 chat_default_max_tokens: int):
        self.backend, self.fallback = backend, fallback
        self.model_name, self.api_key = model_name, api_key
        self.max_tokens_limit, self.chat_default = max_tokens_limit, chat_default_max_tokens
        self.routes = {"/v1/completions": self._completion, "/v1/chat/completions": self._chat}

    async def __call__(self, scope, receive, send) -> None:
        route = self.routes.get(_route_path(scope)) if scope["type"] == "http" else None
        if route is None:
            await self.fallback(scope, receive, send)
            return
        try:
            if scope["method"] != "POST":
                raise APIError(405, f"{scope['method']} is not allowed here; use POST", "invalid_request_error",
                               code="method_not_allowed", headers={"Allow": "POST"})
            self._authorize(scope)
            started = await route(await _read_body(receive))
        except _ClientGone:
            return
        except Exception as e:  # noqa: BLE001 - every error before the stream is an OpenAI error body
            err = from_exception(e)
            if err.status >= 500 and not isinstance(e, APIError):
                log.exception("request failed")
            await send_json(send, err.status, err.body(), err.headers)
            return
        if isinstance(started, dict):
            await send_json(send, 200, started)
        else:
            await self._stream(*started, receive, send)

    def _authorize(self, scope) -> None:
        if self.api_key is not None:
            check_api_key(next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1"), self.api_key)

    def _parse(self, body: bytes, model_cls):
        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(raw, dict):
            raise bad_request("the body must be a JSON object", code="invalid_json")
        try:
            req = model_cls.model_validate(raw)
        except ValidationError as e:
            raise from_validation(e) from None
        if req.model != self.model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                           "invalid_request_error", param="model", code="model_not_found")
        return req

    async def _completion(self, body: bytes):
        req = self._parse(body, proto.CompletionRequest)
        prompt = req.single_prompt()
        rid, created = proto.new_id("cmpl"), int(time.time())
        chunks = CompletionChunks(rid, self.model_name, created, req.include_usage)
        return await self._start(req, 16, prompt, None, chunks,
                                 lambda out: proto.completion_response(rid, self.model_name, out))

    async def _chat(self, body: bytes):
        req = self._parse(body, proto.ChatCompletionRequest)
        messages = req.template_messages()
        rid, created = proto.new_id("chatcmpl"), int(time.time())
        chunks = ChatChunks(rid, self.model_name, created, req.include_usage)
        return await self._start(req, self.chat_default, None, messages, chunks,
                                 lambda out: proto.chat_response(rid, self.model_name, out))

    async def _start(self, req, default_max_tokens: int, prompt, messages, chunks, as_json):
        """The JSON body of a whole response, or what its stream starts from (its first
        output). Errors before the first output (bad input, recovering) raise: they are
        plain HTTP errors, not a stream's error event."""
        params = req.sampling_params(default_max_tokens, self.max_tokens_limit)
        if not req.stream:
            out = await self.backend.agenerate(prompt, params, messages=messages)
            if out.finish_reason == "error":
                raise generation_failed(out.error)
            return as_json(out)
        outputs = self.backend.astream(prompt, params, messages=messages, deltas_only=True)
        try:
            first = await outputs.__anext__()
        except BaseException:
            await outputs.aclose()  # aborts the request (a client that went away, say)
            raise
        return first, outputs, chunks, TextDeltas(params.stop)

    async def _stream(self, first, outputs, chunks, deltas, receive, send) -> None:
        """Send the events; a client that goes away stops its request at once: a watcher
        on `receive` cancels this task (cheaper than a task group: one task a request)."""
        task = asyncio.current_task()
        state = {"sending": True, "gone": False}

        def on_disconnect(watcher: asyncio.Task) -> None:
            if state["sending"] and not watcher.cancelled() and watcher.exception() is None:
                state["gone"] = True
                task.cancel()

        watcher = asyncio.ensure_future(_disconnected(receive))
        watcher.add_done_callback(on_disconnect)
        try:
            await self._send_events(first, outputs, chunks, deltas, send)  # its `finally` aborts the request
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, not the caller's
                task.uncancel()
        finally:
            state["sending"] = False
            watcher.cancel()

    async def _send_events(self, first, outputs, chunks, deltas, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            async for event in sse_events(first, outputs, chunks, deltas):
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await outputs.aclose()


def check_api_key(authorization: str, api_key: str | None) -> None:
    """Raise a 401 unless the Authorization header carries `api_key` (None: no key needed)."""
    if api_key is None:
        return
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", "invalid_request_error",
                       code="invalid_api_key")


async def sse_events(first: RequestOutput, outputs: AsyncIterator[RequestOutput], chunks,
                     deltas: TextDeltas) -> AsyncIterator[str]:
    """data: {...} chunks, then data: [DONE]; a failed request sends an error event and ends."""
    try:
        out = first
        for c in chunks.start():
            yield data_line(c)
        while True:
            if out.finish_reason == "error":
                yield generation_failed(out.error).sse()
                return
            for c in chunks.delta(out, deltas.next(out)):
                yield data_line(c)
            if out.finished:
                break
            out = await outputs.__anext__()
        for c in chunks.end(out):
            yield data_line(c)
        yield "data: [DONE]\n\n"
    except StopAsyncIteration:
        yield generation_failed("the stream ended without a final output").sse()
    except Exception as e:  # noqa: BLE001 - a failing stream ends with an error event, never hangs
        log.exception("stream failed")
        yield from_exception(e).sse()


async def send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the body is over {MAX_BODY_BYTES} bytes", "invalid_request_error", code="body_too_large")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


class _ClientGone(Exception):
    """The client went away before its request was read: nothing to answer."""


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _route_path(scope) -> str:
    """The path the app routes on: without the prefix it is mounted at (root_path)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path
