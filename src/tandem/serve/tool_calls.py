"""Tool calls in a model's output, in the Qwen2.5 (Hermes) format the chat templates of
that family ask for:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Small models of the family often answer with the call's JSON alone, without the tags:
an output that is nothing but {"name": <one of the request's tools>, "arguments": {...}}
is that call too.

parse_tool_calls reads a whole output into its content and calls (OpenAI's
message.tool_calls); ToolCallStream does the same as a stream's text comes, sending
content as soon as it cannot become part of a call and each call once its block has
closed (an output that begins with "{" waits for its end: it may be a bare call). A
block whose JSON is no call (no name, bad JSON) stays content, tags and all.
Whitespace next to a call is dropped, so "<tool_call>..</tool_call>\\n<tool_call>.." is two
calls and no content, the same whole or streamed.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_message_part(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def as_delta(self, index: int) -> dict:
        return {"index": index, **self.as_message_part()}


def _call_of(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _segments(text: str) -> tuple[str, list[ToolCall]]:
    """The content and calls of `text`: whitespace next to a call dropped."""
    content, calls, pos, after_call = [], [], 0, False
    for m in _BLOCK.finditer(text):
        call = _call_of(m.group(1).strip())
        if call is None:
            continue  # stays content, as part of the text around it
        before = text[pos:m.start()].rstrip()
        content.append(before.lstrip() if after_call else before)
        calls.append(call)
        pos, after_call = m.end(), True
    rest = text[pos:]
    content.append(rest.lstrip() if after_call else rest)
    return "".join(content), calls


def _whole(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    content, calls = _segments(text)
    if not calls and text.strip().startswith("{"):
        bare = _call_of(text.strip())
        if bare is not None and bare.name in names:
            return "", [bare]
    return content, calls


def parse_tool_calls(text: str, names: frozenset[str] = frozenset()) -> tuple[str | None, list[ToolCall]]:
    """A whole output's content (None when only calls remain) and its calls; `names`:
    the request's tools, which a bare call (JSON without the tags) must name."""
    content, calls = _whole(text, names)
    return (content or None) if calls else content, calls


def _settled_prefix(text: str) -> str:
    """The longest prefix of `text` whose content and calls no later text can change:
    before an open block, a tail that may begin one, and trailing whitespace (which a
    call after it would drop)."""
    cut = len(text)
    start = text.rfind(OPEN)
    if start != -1 and text.find(CLOSE, start) == -1:
        cut = start
    else:
        for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
            if OPEN.startswith(text[-k:]):
                cut = len(text) - k
                break
    return text[:cut].rstrip()


class ToolCallStream:
    """One choice's stream: feed it the text as it may go out (cumulative pieces); each
    call gives the content to send now and the calls that completed."""

    def __init__(self, names: frozenset[str] = frozenset()):
        self.names = names
        self.text = ""
        self.sent_content = 0
        self.calls: list[ToolCall] = []

    def feed(self, piece: str, finished: bool) -> tuple[str, list[ToolCall]]:
        self.text += piece
        if finished:
            content, calls = _whole(self.text, self.names)
        elif not self.sent_content and not self.calls and self.text.lstrip()[:1] in ("", "{"):
            return "", []  # it may all be one bare call
        else:
            content, calls = _segments(_settled_prefix(self.text))
        new_content, self.sent_content = content[self.sent_content:], max(self.sent_content, len(content))
        new_calls = calls[len(self.calls):]
        self.calls.extend(new_calls)
        return new_content, new_calls
