"""What a generation stream sends: the SSE chunks of each endpoint, and the text of each
output that may go out before a stop string could still claim it."""
from __future__ import annotations

import json

from tandem.outputs import RequestOutput
from tandem.serve import openai_protocol as proto


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


def data_line(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class CompletionChunks:
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


class ChatChunks(CompletionChunks):
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
