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

from tandem.choices import choice_requests
from tandem.outputs import RequestOutput
from tandem.serve import openai_protocol as proto
from tandem.serve import best_of, tokenize_routes
from tandem.serve.choices_view import ChoicesView
from tandem.serve.errors import APIError, bad_request, from_exception, from_validation, generation_failed
from tandem.serve.limits import RETRY_AFTER_S, ServeLimits
from tandem.serve.request_body import ClientGone, check_content_type, check_text, parse_object, read_body
from tandem.serve.sse_chunks import ChatChunks, CompletionChunks, TextDeltas, data_line

log = logging.getLogger("tandem.serve")

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


class Backend(Protocol):
    model_name: str

    async def agenerate(self, prompt=None, params=None, *, messages=None, request_id=None) -> RequestOutput: ...

    def astream(self, prompt=None, params=None, *, messages=None, request_id=None,
                deltas_only=False) -> AsyncIterator[RequestOutput]: ...

    async def agenerate_many(self, requests) -> list[RequestOutput]: ...

    def astream_many(self, requests, deltas_only=False) -> AsyncIterator[RequestOutput]: ...

    async def atokenize(self, prompt=None, *, messages=None, **options) -> list[int]: ...

    async def adetokenize(self, tokens) -> str: ...

    max_model_len: int

    async def ahealth(self) -> dict: ...

    async def ametrics(self) -> bytes: ...


class GenerationApp:
    """ASGI: the two generation endpoints and /tokenize, /detokenize; every other request
    goes to `fallback`."""

    def __init__(self, backend: Backend, fallback, *, model_name: str, api_key: str | None, limits: ServeLimits,
                 chat_default_max_tokens: int):
        self.backend, self.fallback = backend, fallback
        self.model_name, self.api_key = model_name, api_key
        self.limits, self.chat_default = limits, chat_default_max_tokens
        self.max_tokens_limit = limits.max_tokens_limit
        self.in_flight = 0  # generation requests this app holds, from their headers to their last byte
        self.routes = {"/v1/completions": self._completion, "/v1/chat/completions": self._chat,
                       "/tokenize": self._tokenize, "/detokenize": self._detokenize}

    async def __call__(self, scope, receive, send) -> None:
        route = self.routes.get(_route_path(scope)) if scope["type"] == "http" else None
        if route is None:
            await self.fallback(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self._serve(route, scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, route, scope, receive, send) -> None:
        try:
            if scope["method"] != "POST":
                raise APIError(405, f"{scope['method']} is not allowed here; use POST", "invalid_request_error",
                               code="method_not_allowed", headers={"Allow": "POST"})
            self._authorize(scope)
            if self.in_flight > self.limits.max_in_flight:
                raise APIError(429, f"this server holds {self.limits.max_in_flight} requests (running and waiting) "
                               "already; retry shortly", "rate_limit_error", code="too_many_waiting_requests",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
            check_content_type(scope["headers"])
            started = await route(await read_body(scope["headers"], receive, self.limits.max_body_bytes))
        except ClientGone:
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
            await self._stream(*started, receive, send)  # (events, outputs)

    def _authorize(self, scope) -> None:
        if self.api_key is not None:
            check_api_key(next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1"), self.api_key)

    def _parse(self, body: bytes, model_cls):
        raw = parse_object(body)
        if not isinstance(model_cls, type):  # a function of the body: which shape it has
            model_cls = model_cls(raw)
        try:
            req = model_cls.model_validate(raw)
        except ValidationError as e:
            raise from_validation(e) from None
        check_text(body, raw)
        if req.model is not None and req.model != self.model_name:  # (None: /tokenize's optional model)
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {self.model_name!r}",
                           "invalid_request_error", param="model", code="model_not_found")
        return req

    async def _completion(self, body: bytes):
        req = self._parse(body, proto.CompletionRequest)
        prompts = req.prompts()
        self._check_prompt_chars(sum(len(p) for p in prompts if isinstance(p, str)), "prompt")
        rid, created = proto.new_id("cmpl"), int(time.time())
        if len(prompts) > 1 or req.n > 1 or req.echo or req.logprobs is not None or (req.best_of or 1) > 1:
            return await self._start_many(req, 16, rid, created, prompts)
        chunks = CompletionChunks(rid, self.model_name, created, req.include_usage)
        return await self._start(req, 16, prompts[0], None, chunks,
                                 lambda out: proto.completion_response(rid, self.model_name, out))

    async def _chat(self, body: bytes):
        req = self._parse(body, proto.ChatCompletionRequest)
        messages, tools = req.template_messages(), req.template_tools()
        self._check_prompt_chars(sum(len(m["content"]) for m in messages), "messages")
        rid, created = proto.new_id("chatcmpl"), int(time.time())
        if tools or req.n > 1 or req.logprobs:
            return await self._start_many(req, self.chat_default, rid, created, None, messages, tools)
        chunks = ChatChunks(rid, self.model_name, created, req.include_usage)
        return await self._start(req, self.chat_default, None, messages, chunks,
                                 lambda out: proto.chat_response(rid, self.model_name, out))

    async def _tokenize(self, body: bytes):
        req = self._parse(body, tokenize_routes.tokenize_model)
        prompt, options = tokenize_routes.tokenize_call(req)
        if prompt is not None:
            self._check_prompt_chars(len(prompt), "prompt")
        else:
            self._check_prompt_chars(sum(len(m["content"]) for m in options["messages"]), "messages")
        tokens = await self.backend.atokenize(prompt, **options)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.backend.max_model_len}

    async def _detokenize(self, body: bytes):
        req = self._parse(body, tokenize_routes.DetokenizeRequest)
        return {"prompt": await self.backend.adetokenize(req.tokens)}

    def _check_prompt_chars(self, chars: int, field: str) -> None:
        # before the tokenizer, which runs on the engine's step thread: a huge text stalls every stream
        if chars > self.limits.max_prompt_chars:
            raise bad_request(f"{field}: {chars} characters of prompt text are over this server's limit of "
                              f"{self.limits.max_prompt_chars} (no prompt that long fits the context; send token ids "
                              "to give a prompt of rare long tokens)", param=field, code="prompt_too_long")

    async def _start(self, req, default_max_tokens: int, prompt, messages, chunks, as_json):
        """The JSON body of a whole response, or what its stream starts from (its first
        output). Errors before the first output (bad input, recovering) raise: they are
        plain HTTP errors, not a stream's error event."""
        params = req.sampling_params(default_max_tokens, self.max_tokens_limit, max_stop_strings=self.limits.max_stop_strings,
                                     max_stop_chars=self.limits.max_stop_chars)
        if not req.stream:
            out = await self.backend.agenerate(prompt, params, messages=messages)
            if out.finish_reason == "error":
                raise generation_failed(out.error)
            return as_json(out)
        outputs = self.backend.astream(prompt, params, messages=messages, deltas_only=True)
        first = await _first_of(outputs)
        return sse_events(first, outputs, chunks, TextDeltas(params.stop)), outputs

    async def _start_many(self, req, default_max_tokens: int, rid: str, created: int, prompts, messages=None,
                          tools=None):
        """_start for several choices (n > 1, several prompts) or tools to parse: all of
        them submitted together (tandem.choices), sent as ChoicesView says."""
        params = req.sampling_params(default_max_tokens, self.max_tokens_limit, max_stop_strings=self.limits.max_stop_strings,
                                     max_stop_chars=self.limits.max_stop_chars)
        shown_logprobs = params.logprobs is not None
        best = max(req.n, getattr(req, "best_of", None) or 1)  # completions' best_of (tandem.serve.best_of)
        requests = choice_requests(prompts or (), best_of.ranked_params(params) if best > req.n else params, best, rid,
                                   messages=messages, tools=tools)

        def view_of(request_ids: list[str]) -> ChoicesView:
            return ChoicesView(messages is not None, rid, self.model_name, created, request_ids, req.n,
                               stops=params.stop, include_usage=req.include_usage,
                               tool_names=frozenset(t["function"]["name"] for t in tools) if tools else None,
                               parallel_tool_calls=getattr(req, "parallel_tool_calls", True),
                               logprobs=shown_logprobs, echo=getattr(req, "echo", False),
                               detokenize=self.backend.adetokenize)

        if best > req.n:  # never streamed (CompletionRequest.prompts)
            outs = await self.backend.agenerate_many(requests)
            failed = next((o for o in outs if o.finish_reason == "error"), None)
            if failed is not None:
                raise generation_failed(failed.error)
            chosen = best_of.best_choices(outs, req.n, best)
            body = await view_of([o.request_id for o in chosen]).response(chosen)
            return {**body, "usage": best_of.usage_of_all(outs, best)}
        view = view_of([r.request_id for r in requests])
        if not req.stream:
            outs = await self.backend.agenerate_many(requests)
            failed = next((o for o in outs if o.finish_reason == "error"), None)
            if failed is not None:
                raise generation_failed(failed.error)
            return await view.response(outs)
        outputs = self.backend.astream_many(requests, deltas_only=True)
        first = await _first_of(outputs)
        return view.sse(first, outputs), outputs

    async def _stream(self, events, outputs, receive, send) -> None:
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
            await self._send_events(events, outputs, send)  # its `finally` aborts the request
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, not the caller's
                task.uncancel()
        finally:
            state["sending"] = False
            watcher.cancel()

    async def _send_events(self, events, outputs, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            async for event in events:
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


async def _first_of(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    try:
        return await outputs.__anext__()
    except BaseException:
        await outputs.aclose()  # aborts the request (a client that went away, say)
        raise


async def send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    # "replace": an error body may quote a client's text, which need not encode
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    extra = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]})
    await send({"type": "http.response.body", "body": data})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _route_path(scope) -> str:
    """The path the app routes on: without the prefix it is mounted at (root_path)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path
