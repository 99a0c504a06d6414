"""The generation endpoints in FastAPI's OpenAPI document (/openapi.json, /docs).

They are plain ASGI (tandem.serve.generation), so FastAPI never sees them as routes; this
adds their paths by hand: request bodies from the pydantic models the endpoints validate
with, the 200 as JSON or, with stream: true, as Server-Sent Events, and every error
response with the OpenAI error schema. Only the document is built here; nothing of it
runs on a request.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from tandem.serve import openai_protocol as proto
from tandem.serve import tokenize_routes as tok
from tandem.serve.limits import ServeLimits
from tandem.serve.tool_fields import MessageToolCall


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong, naming the field where one is.")
    type: str = Field(description="invalid_request_error, rate_limit_error, service_unavailable or server_error.")
    param: str | None = Field(description="The offending field (prompt, messages[0].content, ...), if one is.")
    code: str | None = Field(description="A machine-readable reason (invalid_json, body_too_large, ...).")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="The text; null when the answer is tool calls alone.")
    tool_calls: list[MessageToolCall] | None = Field(None, description="Calls parsed from the output (with tools).")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


_SSE = ("With stream: true, Server-Sent Events: `data: <chunk>` lines (object: {object}), then `data: [DONE]`. "
        "A request that fails once its stream has started ends with one `data: <ErrorResponse>` event.")


def install(app: FastAPI, limits: ServeLimits) -> None:
    """Have `app` serve a document that also describes the generation endpoints."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            add_generation_paths(doc, limits)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi


def add_generation_paths(doc: dict[str, Any], limits: ServeLimits) -> None:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (proto.CompletionRequest, proto.ChatCompletionRequest, CompletionResponse, ChatCompletionResponse,
                  ErrorResponse, tok.TokenizeCompletionRequest, tok.TokenizeChatRequest, tok.TokenizeResponse,
                  tok.DetokenizeRequest, tok.DetokenizeResponse):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    doc.setdefault("paths", {})
    doc["paths"]["/v1/completions"] = {"post": _operation(
        "createCompletion", "Complete prompts", "A prompt or a list of prompts, as text or token ids: n choices "
        "of each.", "CompletionRequest",
        "CompletionResponse", "text_completion", limits)}
    doc["paths"]["/v1/chat/completions"] = {"post": _operation(
        "createChatCompletion", "Answer a conversation", "Messages through the model's chat template.",
        "ChatCompletionRequest", "ChatCompletionResponse", "chat.completion.chunk", limits)}
    doc["paths"]["/tokenize"] = {"post": _tokenizer_operation(
        "tokenize", "Tokenize a prompt or a conversation", "The token ids a generation request of the same prompt "
        "(or messages, through the chat template) runs on, as vLLM's /tokenize.",
        {"oneOf": [_ref("TokenizeCompletionRequest"), _ref("TokenizeChatRequest")]}, "TokenizeResponse")}
    doc["paths"]["/detokenize"] = {"post": _tokenizer_operation(
        "detokenize", "Detokenize token ids", "The text of token ids, as vLLM's /detokenize.",
        _ref("DetokenizeRequest"), "DetokenizeResponse")}


def _tokenizer_operation(op_id: str, summary: str, description: str, request: dict, response: str) -> dict[str, Any]:
    return {
        "operationId": op_id,
        "summary": summary,
        "description": description,
        "tags": ["tokenizer"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {
            "200": {"description": "The tokens, or the text.", "content": {"application/json": {"schema": _ref(response)}}},
            "400": _error("A malformed request: bad JSON, a field's wrong type or value, a token id outside the vocabulary."),
            "401": _error("A missing or wrong API key (Authorization: Bearer <key>), where the server has one."),
            "404": _error("A model this server does not serve."),
            "503": _error("The engine is recovering from a lost shard."),
        },
    }


def _operation(op_id: str, summary: str, description: str, request: str, response: str, chunk_object: str,
               limits: ServeLimits) -> dict[str, Any]:
    retry = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
    return {
        "operationId": op_id,
        "summary": summary,
        "description": f"{description} {_SSE.format(object=chunk_object)}",
        "tags": ["generation"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {
            "200": {"description": "The generation; with stream: true, a stream of events.", "content": {
                "application/json": {"schema": _ref(response)},
                "text/event-stream": {"schema": {"type": "string", "description": _SSE.format(object=chunk_object)}},
            }},
            "400": _error("A malformed request: bad JSON, a field's wrong type or value, text that is no Unicode, "
                          f"a prompt over the context, max_tokens over {limits.max_tokens_limit}, more than "
                          f"{limits.max_stop_strings} stop strings or one over {limits.max_stop_chars} characters."),
            "401": _error("A missing or wrong API key (Authorization: Bearer <key>), where the server has one."),
            "404": _error("A model this server does not serve."),
            "405": _error("A method other than POST."),
            "413": _error(f"A body over {limits.max_body_bytes} bytes."),
            "415": _error("A Content-Type other than application/json."),
            "429": _error(f"Over {limits.max_in_flight} requests held already (running and waiting).", retry),
            "500": _error("A fault of the server's own (a failed batch)."),
            "503": _error("The engine is recovering from a lost shard.", retry),
        },
    }


def _error(description: str, headers: dict | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ref("ErrorResponse")}}}
    if headers:
        out["headers"] = headers
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}
