"""The logprobs of a choice in OpenAI's two shapes: completions' parallel lists (tokens,
token_logprobs, top_logprobs, text_offset) and chat's content list (token, logprob, bytes,
top_logprobs). The values are the target's raw log-probabilities (tandem.sampling.logprobs)."""
from __future__ import annotations

import math

from tandem.outputs import TokenLogprob

FLOOR = -9999.0  # what JSON gets for a log-probability of -inf (vLLM's choice too)


def _value(v: float) -> float:
    return v if math.isfinite(v) else FLOOR


class CompletionLogprobs:
    """One choice's completions logprobs, built chunk by chunk (text_offset runs on across them)."""

    def __init__(self, offset: int = 0):
        self.offset = offset  # where the next token's text starts in the choice's text

    def part(self, entries: list[TokenLogprob | None], first_token: str = "") -> dict:
        """entries: tokens in order; None is the prompt's first token (text `first_token`, no logprob)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = first_token if e is None else e.token
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if e is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_value(e.logprob))
            top = {t: _value(v) for _, t, v in e.top}
            top.setdefault(e.token, _value(e.logprob))  # the chosen token is always listed
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {"content": [_chat_token(e.token, e.logprob, [_chat_token(t, v) for _, t, v in e.top]) for e in entries],
            "refusal": None}


def _chat_token(token: str, logprob: float, top: list | None = None) -> dict:
    out = {"token": token, "logprob": _value(logprob), "bytes": list(token.encode("utf-8", "replace"))}
    if top is not None:
        out["top_logprobs"] = top
    return out
