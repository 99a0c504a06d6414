"""What a request of several choices sends (n > 1, several prompts, or tools to parse on
chat): its JSON response or its SSE stream, every choice under its own index (OpenAI's
order: prompt-major, prompt i's choice j is index i * n + j), the usage of all of them
(each prompt's tokens once, every choice's completion tokens), and on chat with tools
each choice's tool calls parsed from its text (tandem.serve.tool_calls). With logprobs, each
choice (and each streamed chunk) carries its tokens' (tandem.serve.logprob_fields); with
echo, a completion's text (and its first chunk) starts with the prompt, and its logprobs
with the prompt's."""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from tandem.outputs import RequestOutput
from tandem.serve import openai_protocol as proto
from tandem.serve.errors import from_exception, generation_failed
from tandem.serve.logprob_fields import CompletionLogprobs, chat_logprobs
from tandem.serve.sse_chunks import TextDeltas, data_line
from tandem.serve.tool_calls import ToolCall, ToolCallStream, parse_tool_calls

log = logging.getLogger("tandem.serve")


class ChoicesView:
    def __init__(self, chat: bool, rid: str, model: str, created: int, request_ids: list[str], n: int, *,
                 stops: tuple[str, ...] = (), include_usage: bool = False, tool_names: frozenset[str] | None = None,
                 parallel_tool_calls: bool = True, logprobs: bool = False, echo: bool = False, detokenize=None):
        self.chat, self.rid, self.model, self.created = chat, rid, model, created
        self.index = {r: k for k, r in enumerate(request_ids)}
        self.n, self.stops, self.include_usage = n, stops, include_usage
        # tool_names: the request's tools, whose calls are parsed from each choice (None: no tools)
        self.tool_names, self.max_calls = tool_names, None if parallel_tool_calls else 1
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        # echo: the prompt's text is the request's, or its ids' detokenized (an async call)
        self.logprobs, self.echo, self.detokenize = logprobs, echo, detokenize

    def usage(self, outs: list[RequestOutput]) -> dict:
        by_index = {self.index[o.request_id]: o for o in outs}
        prompt = sum(o.usage.prompt_tokens for k, o in by_index.items() if k % self.n == 0)
        completion = sum(o.usage.completion_tokens for o in outs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _reason(self, out: RequestOutput, calls: list[ToolCall]) -> str | None:
        reason = proto.finish_reason(out)
        return "tool_calls" if calls and reason == "stop" else reason

    # ---- a whole response ------------------------------------------------------------------

    async def response(self, outs: list[RequestOutput]) -> dict:
        ordered = sorted(outs, key=lambda o: self.index[o.request_id])
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": int(time.time()), "model": self.model,
                "choices": [await self._choice(o) for o in ordered], "usage": self.usage(outs)}

    async def _choice(self, out: RequestOutput) -> dict:
        k = self.index[out.request_id]
        if not self.chat:
            prefix, entries, first = await self._echo(out)
            logprobs = CompletionLogprobs().part(entries + (out.logprobs or []), first) if self.logprobs else None
            return {"index": k, "text": prefix + out.text, "logprobs": logprobs, "finish_reason": proto.finish_reason(out)}
        content, calls = parse_tool_calls(out.text, self.tool_names) if self.tool_names is not None else (out.text, [])
        calls = calls[:self.max_calls]
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.as_message_part() for c in calls]
        logprobs = chat_logprobs(out.logprobs or []) if self.logprobs else None
        return {"index": k, "message": message, "logprobs": logprobs, "finish_reason": self._reason(out, calls)}

    async def _echo(self, out: RequestOutput) -> tuple[str, list, str]:
        """What a completion choice starts with under echo: the prompt's text, its tokens'
        logprobs (with logprobs; None first: the first has none) and the first token's text."""
        if not self.echo:
            return "", [], ""
        prompt = out.prompt if out.prompt is not None else await self.detokenize(out.prompt_token_ids)
        if not self.logprobs:
            return prompt, [], ""
        return prompt, list(out.prompt_logprobs or []), await self.detokenize(out.prompt_token_ids[:1])

    # ---- a stream --------------------------------------------------------------------------

    def _chunk(self, k: int, part: dict) -> dict:
        return {"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                "choices": [{"index": k, "logprobs": None, **part}]}

    async def sse(self, first: RequestOutput, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        """data: {...} chunks, each of one choice, then data: [DONE]; as sse_events (tandem.serve.generation)."""
        deltas = {r: TextDeltas(self.stops) for r in self.index}
        tools = {r: ToolCallStream(self.tool_names) for r in self.index} if self.tool_names is not None else {}
        sent_calls = {r: 0 for r in self.index}
        offsets = {r: CompletionLogprobs() for r in self.index}  # each choice's completions logprobs so far
        finals: dict[str, RequestOutput] = {}
        try:
            if self.chat:
                for k in range(len(self.index)):
                    yield data_line(self._chunk(k, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
            out, seen = first, set()
            while True:
                if out.finish_reason == "error":
                    yield generation_failed(out.error).sse()
                    return
                rid, k = out.request_id, self.index[out.request_id]
                text = deltas[rid].next(out)
                entries = list(out.delta_logprobs or []) if self.logprobs else []
                if not self.chat:
                    prefix, first_token = "", ""
                    if rid not in seen:  # a choice's first output: echo its prompt
                        prefix, echoed, first_token = await self._echo(out)
                        entries = echoed + entries
                    seen.add(rid)
                    if prefix or text or entries or out.finished:
                        lps = offsets[rid].part(entries, first_token) if self.logprobs else None
                        yield data_line(self._chunk(k, {"text": prefix + text, "logprobs": lps,
                                                        "finish_reason": proto.finish_reason(out)}))
                else:
                    calls: list[ToolCall] = []
                    if rid in tools:
                        text, calls = tools[rid].feed(text, out.finished)
                        room = len(calls) if self.max_calls is None else max(0, self.max_calls - sent_calls[rid])
                        calls = calls[:room]
                    if text or entries:
                        lps = chat_logprobs(entries) if self.logprobs else None
                        yield data_line(self._chunk(k, {"delta": {"content": text}, "logprobs": lps, "finish_reason": None}))
                    for call in calls:
                        delta = {"tool_calls": [call.as_delta(sent_calls[rid])]}
                        sent_calls[rid] += 1
                        yield data_line(self._chunk(k, {"delta": delta, "finish_reason": None}))
                    if out.finished:
                        reason = proto.finish_reason(out)
                        reason = "tool_calls" if sent_calls[rid] and reason == "stop" else reason
                        yield data_line(self._chunk(k, {"delta": {}, "finish_reason": reason}))
                if out.finished:
                    finals[rid] = out
                    if len(finals) == len(self.index):
                        break
                out = await outputs.__anext__()
            if self.include_usage:
                yield data_line({"id": self.rid, "object": self.obj, "created": self.created, "model": self.model,
                                 "choices": [], "usage": self.usage(list(finals.values()))})
            yield "data: [DONE]\n\n"
        except StopAsyncIteration:
            yield generation_failed("the stream ended without a final output").sse()
        except Exception as e:  # noqa: BLE001 - a failing stream ends with an error event, never hangs
            log.exception("stream failed")
            yield from_exception(e).sse()
