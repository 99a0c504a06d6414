"""Per-request limits the HTTP ingress enforces before a request reaches the engine, and
the bound on requests it holds at once (429 with Retry-After past it)."""
from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN_BOUND = 32  # text longer than 32 x the context cannot fit it (real text: ~4 chars a token)
UNSET_CONTEXT_BOUND = 32768  # the context assumed for that bound while max_model_len is the model's
RETRY_AFTER_S = 1  # a full queue drains by whole requests: come back soon, not at once


@dataclass(frozen=True)
class ServeLimits:
    """What TandemServeArgs sets (its defaults are the only ones): from_args builds it."""

    max_tokens_limit: int
    max_body_bytes: int
    max_prompt_chars: int
    max_stop_strings: int
    max_stop_chars: int
    max_in_flight: int  # the engine's slots (max_num_seqs) + max_waiting_requests

    @classmethod
    def from_args(cls, args) -> "ServeLimits":
        """From a TandemServeArgs (the builder's, or `tandem serve`'s)."""
        chars = args.max_prompt_chars if args.max_prompt_chars is not None else CHARS_PER_TOKEN_BOUND * (args.max_model_len or UNSET_CONTEXT_BOUND)
        return cls(max_tokens_limit=args.max_tokens_limit, max_body_bytes=args.max_body_bytes, max_prompt_chars=chars,
                   max_stop_strings=args.max_stop_strings, max_stop_chars=args.max_stop_chars,
                   max_in_flight=args.max_num_seqs + args.max_waiting_requests)
