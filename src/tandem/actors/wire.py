"""Request outputs over Ray as deltas.

An engine output carries the whole text and token ids so far; sent like that on every
tick, a stream of n tokens moves O(n^2) data through pickling and Ray (64 streams of 2k
tokens: megabytes a tick). So the scheduler actor sends, before the last output, only
what is new: `text` and `token_ids` empty, the prompt only in a request's first output.
The last output goes whole. A consumer that wants whole outputs (the Python handle's
stream) rebuilds them with Rebuilder; a server that forwards deltas (the HTTP app) takes
the deltas as they come.

On the wire an output is a plain tuple (from_wire makes it a RequestOutput again): at 64
streams the scheduler actor pickles 64 outputs a tick, and a tuple pickles about 20x
faster than the dataclass (0.008 against 0.19 ms for 64), time the actor's engine thread
would otherwise wait for the GIL.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from tandem.outputs import RequestOutput, Usage


def to_wire(out: RequestOutput, first: bool) -> tuple:
    """What goes over Ray for `out`; `first`: the request's first output on this stream."""
    prompt, prompt_ids, text, ids = out.prompt, out.prompt_token_ids, out.text, out.token_ids
    logprobs, prompt_logprobs = out.logprobs, out.prompt_logprobs
    if not out.finished:
        text, ids, logprobs = "", [], None
        if not first:
            prompt, prompt_ids, prompt_logprobs = None, [], None
    return (out.request_id, prompt, prompt_ids, text, ids, out.delta_text, out.delta_token_ids, out.finished,
            out.finish_reason, out.error, (out.usage.prompt_tokens, out.usage.completion_tokens), out.num_drafts,
            out.num_draft_tokens, out.num_accepted_tokens, logprobs, out.delta_logprobs, prompt_logprobs)


def to_wire_on(out: RequestOutput, started: set[str]) -> tuple:
    """to_wire for a stream that carries many requests: `started` holds the requests
    that have had an output on it (updated here), so only a request's first has its prompt."""
    wire = to_wire(out, out.request_id not in started)
    if out.finished:
        started.discard(out.request_id)
    else:
        started.add(out.request_id)
    return wire


def from_wire(t: tuple) -> RequestOutput:
    return RequestOutput(*t[:10], Usage(*t[10]), *t[11:])


def merge(outs: list[RequestOutput]) -> RequestOutput:
    """Several outputs of one request, in order, as one: the deltas joined, the latest
    state, and the prompt of the first (of wire outputs only a request's first has it)."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    merged = dataclasses.replace(
        last,
        delta_text="".join(o.delta_text for o in outs),
        delta_token_ids=[t for o in outs for t in o.delta_token_ids],
        delta_logprobs=None if last.delta_logprobs is None else [x for o in outs for x in o.delta_logprobs or ()],
    )
    if last.finished:
        return merged  # whole already
    return dataclasses.replace(merged, prompt=outs[0].prompt, prompt_token_ids=outs[0].prompt_token_ids,
                               prompt_logprobs=outs[0].prompt_logprobs)


class Rebuilder:
    """Whole outputs again from one request's wire outputs, in order."""

    def __init__(self):
        self.prompt: str | None = None
        self.prompt_token_ids: list[int] = []
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list | None = None
        self.prompt_logprobs: list | None = None

    def __call__(self, out: RequestOutput) -> RequestOutput:
        if out.finished:
            return out
        if out.prompt_token_ids:
            self.prompt, self.prompt_token_ids = out.prompt, out.prompt_token_ids
            self.prompt_logprobs = out.prompt_logprobs
        self.text += out.delta_text
        self.token_ids += out.delta_token_ids
        if out.delta_logprobs is not None:
            self.logprobs = (self.logprobs or []) + out.delta_logprobs
        return dataclasses.replace(out, prompt=self.prompt, prompt_token_ids=self.prompt_token_ids,
                                   text=self.text, token_ids=list(self.token_ids), logprobs=self.logprobs,
                                   prompt_logprobs=self.prompt_logprobs)


def as_received(deltas_only: bool) -> Callable[[RequestOutput], RequestOutput]:
    """What a stream consumer applies to each wire output: nothing when it wants deltas
    only, else a Rebuilder (one per request)."""
    return (lambda out: out) if deltas_only else Rebuilder()
