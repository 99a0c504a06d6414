"""What the engine hands back for a request: whole results and streaming deltas."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class TokenLogprob(NamedTuple):
    """A token with the target's raw log-probability of it and its row's top N (as
    SamplingParams.logprobs asks): (token id, text, logprob) each, most likely first."""

    token_id: int
    token: str  # its text alone
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str  # the whole output text so far
    token_ids: list[int]  # the whole output so far
    delta_text: str  # new since the previous output of this request
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    error: str | None
    usage: Usage
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # params.logprobs: one for each of token_ids / delta_token_ids; None when not asked
    logprobs: list[TokenLogprob] | None = None
    delta_logprobs: list[TokenLogprob] | None = None
    # params.prompt_logprobs: one for each prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "prompt": self.prompt,
            "prompt_token_ids": self.prompt_token_ids,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "usage": {"prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens},
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
        }
