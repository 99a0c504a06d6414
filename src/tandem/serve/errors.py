"""HTTP errors as OpenAI error bodies: {"error": {"message", "type", "param", "code"}}.

    InvalidRequestError, a malformed body  -> 400 invalid_request_error (param = the field)
    wrong or missing API key               -> 401
    unknown model                          -> 404 model_not_found
    a body over max_body_bytes             -> 413 body_too_large (tandem.serve.request_body)
    a Content-Type other than JSON         -> 415 unsupported_media_type
    past the bound on requests held        -> 429 rate_limit_error with Retry-After
    EngineUnavailableError (recovering)    -> 503 with Retry-After
    a request whose batch failed           -> 500 server_error (in a stream: an error event)
"""
from __future__ import annotations

import json
import math
import re

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tandem.errors import EngineUnavailableError, InvalidRequestError


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def sse(self) -> str:
        return f"data: {json.dumps(self.body())}\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def from_validation(e: ValidationError) -> APIError:
    """The first problem pydantic found, naming its field."""
    err = e.errors(include_url=False)[0]
    # a union adds its member's type to the location ("prompt.str"): keep only fields and indices
    loc = [str(p) for p in err["loc"] if not (isinstance(p, str) and _TYPE_TAG.match(p))]
    msg = "missing required field" if err["type"] == "missing" else err["msg"]
    path = ".".join(loc)
    return bad_request(f"{path}: {msg}" if path else msg, param=loc[0] if loc else None, code=err["type"])


_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|list|dict|.*\[.*\].*)$")


def from_exception(e: BaseException) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, InvalidRequestError):
        return bad_request(e.message, param=e.field)
    if isinstance(e, EngineUnavailableError):
        retry = max(1, math.ceil(e.retry_after_s))
        return APIError(503, str(e), "service_unavailable", code="recovering", headers={"Retry-After": str(retry)})
    return APIError(500, f"{type(e).__name__}: {e}", "server_error", code="internal_error")


def generation_failed(error: str | None) -> APIError:
    return APIError(500, f"generation failed: {error or 'unknown error'}", "server_error", code="generation_failed")
