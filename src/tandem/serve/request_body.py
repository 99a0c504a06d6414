"""A generation request's body, from bytes to a JSON object, with every way it can be
malformed answered as a 4xx naming what is wrong (never a 500 from the decoder):

    Content-Type not JSON                         -> 415 unsupported_media_type
    over the size limit (Content-Length or read)  -> 413 body_too_large, naming the limit
    not UTF-8, not JSON, NaN / Infinity, 1e999,
    an integer of thousands of digits, nested
    deeper than the decoder's stack               -> 400 invalid_json
    a string that is no Unicode text (a lone
    UTF-16 surrogate such as "\\ud800")             -> 400 invalid_text, param = its field
"""
from __future__ import annotations

import json
import math
import re

from tandem.serve.errors import APIError, bad_request


class ClientGone(Exception):
    """The client went away before its request was read: nothing to answer."""


def check_content_type(headers) -> None:
    """JSON or nothing: a body sent as a form or as text is refused before it is read
    (an absent Content-Type is read as JSON, as hand-written clients often send none)."""
    value = next((v for k, v in headers if k == b"content-type"), None)
    if value is None:
        return
    media = value.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json")):
        return
    raise APIError(415, f"Content-Type {value.decode('latin-1')!r} is not supported; send the body as "
                   "application/json", "invalid_request_error", code="unsupported_media_type")


async def read_body(headers, receive, max_bytes: int) -> bytes:
    """The whole body, or a 413 as soon as it is known to be over `max_bytes`: from its
    Content-Length before a byte is read, else once that many have come."""
    declared = next((v for k, v in headers if k == b"content-length"), None)
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        # A client that waits for 100 Continue has sent none of it: answer now. Another is
        # sending it all; closing on unread data resets the connection, and many clients
        # then lose the answer: read it to the end first, unless it is absurdly large.
        if not any(k == b"expect" for k, _ in headers) and int(declared) <= DRAIN_LIMIT:
            await _discard(receive)
        raise too_large(max_bytes)
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > max_bytes:
            raise too_large(max_bytes)
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


DRAIN_LIMIT = 64 << 20  # what a 413 reads (and drops) before it answers


async def _discard(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


def too_large(max_bytes: int) -> APIError:
    # Connection: close, as the rest of the body is left unread
    return APIError(413, f"the body is over this server's limit of {max_bytes} bytes", "invalid_request_error",
                    code="body_too_large", headers={"Connection": "close"})


def parse_object(body: bytes) -> dict:
    """The body as a JSON object; strict JSON only (RFC 8259: no NaN or Infinity)."""
    try:
        raw = json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJSON as e:
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("the body is not valid JSON: arrays or objects nested too deeply", code="invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int past Python's 4300 digits
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise bad_request(f"the body must be a JSON object, got {_json_type(raw)}", code="invalid_json")
    return raw


def check_text(body: bytes, raw: dict) -> None:
    """Raise a 400 naming the first string that is no Unicode text. JSON's \\u escapes can
    spell half of a UTF-16 pair alone, which decodes to a str that cannot be encoded (and
    the tokenizer refuses); only bodies holding such an escape are walked."""
    if _SURROGATE_ESCAPE.search(body) is None:
        return
    where = _unencodable(raw, "")
    if where is not None:
        raise APIError(400, f"{where}: is not valid Unicode text (it holds a lone UTF-16 surrogate)",
                       "invalid_request_error", param=where, code="invalid_text")


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class _NotJSON(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotJSON(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJSON(f"the number {text[:40]} is out of range")
    return value


def _unencodable(value, path: str) -> str | None:
    """The path (messages[0].content) of the first string that does not encode to UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str):
            if _unencodable(key, path) is not None:
                return path or "body"
            where = _unencodable(item, f"{path}.{key}" if path else key)
        else:
            where = _unencodable(item, f"{path}[{key}]")
        if where is not None:
            return where
    return None


def _json_type(value) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
