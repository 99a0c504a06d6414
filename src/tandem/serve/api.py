"""The OpenAI-compatible HTTP API as an ASGI app over a backend (no Ray here).

The backend is anything with the TandemHandle's async surface (agenerate, astream,
ahealth, ametrics, model_name), so the HTTP layer can be tested on a fake engine;
the Serve deployment in tandem.serve.app passes a TandemHandle on the SchedulerActor.

    POST /v1/completions        one prompt (text or token ids); stream: true = SSE
    POST /v1/chat/completions   messages through the tokenizer's chat template
    GET  /v1/models, /health, /metrics (Prometheus: the engine's counters and ours)
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.serve import openapi_doc
from tandem.serve.args import TandemServeArgs
from tandem.serve.errors import APIError, bad_request, from_exception
from tandem.serve.generation import Backend, GenerationApp, check_api_key
from tandem.serve.limits import ServeLimits

log = logging.getLogger("tandem.serve")


def create_app(
    backend: Backend,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_tokens_limit: int = 1024,
    default_chat_max_tokens: int | None = None,
    limits: ServeLimits | None = None,
) -> GenerationApp:
    """The ASGI app serving `backend` under the model id `model_name`: the generation
    endpoints in plain ASGI (tandem.serve.generation), the rest in FastAPI. `limits`
    (ServeLimits.from_args(TandemServeArgs)) replaces max_tokens_limit where given."""
    model_name = model_name or backend.model_name
    if limits is None:
        limits = ServeLimits.from_args(TandemServeArgs(max_tokens_limit=max_tokens_limit))
    chat_default = default_chat_max_tokens or limits.max_tokens_limit
    app = FastAPI(title="tandem", description="OpenAI-compatible speculative-decoding server.")

    # ---- errors as OpenAI bodies ----------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException):
        type_ = "invalid_request_error" if e.status_code < 500 else "server_error"
        return APIError(e.status_code, str(e.detail), type_, code=str(e.status_code)).response()

    @app.exception_handler(Exception)
    async def _any_error(_: Request, e: Exception):
        # a lost engine under /metrics is a 503, anything else tandem's own 500: a JSON body either way
        return from_exception(e).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError):
        return bad_request(str(e.errors()[0].get("msg", e))).response()

    # ---- the rest (generation is GenerationApp's) -------------------------------------------

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(request.headers.get("authorization", ""), api_key)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "tandem"}]}

    @app.get("/health")
    async def health():
        try:
            h = await backend.ahealth()
        except Exception as e:  # noqa: BLE001 - whatever it is, the engine does not serve
            err = from_exception(e)
            return JSONResponse({"status": "down", **err.body()}, status_code=503,
                                headers=err.headers or {"Retry-After": "5"})
        if h.get("recovering"):
            return JSONResponse(h, status_code=503, headers={"Retry-After": "5"})
        return h

    @app.get("/metrics")
    async def metrics():
        engine = await backend.ametrics()
        return Response(engine, media_type="text/plain; version=0.0.4; charset=utf-8")

    openapi_doc.install(app, limits)
    return GenerationApp(backend, app, model_name=model_name, api_key=api_key, limits=limits,
                         chat_default_max_tokens=chat_default)
