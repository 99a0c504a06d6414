"""n choices of one request: the requests they run as, each seeded apart.

A request for n choices of each of its prompts runs as len(prompts) * n requests
submitted together (one admission, one prefill, verified in the same batches). Choice j
of a prompt samples with seed + j (wrapped to int64) when the request has a seed, so a
seeded request repeats exactly and its choices differ; without one, each draws its own.
Their order is OpenAI's: prompt-major, choice index = prompt index * n + j.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tandem.errors import InvalidRequestError
from tandem.intake import Request
from tandem.sampling_params import SamplingParams

MAX_CHOICES = 128  # n * prompts of one request: past it a client's mistake (each is a sequence)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index`: seed + index, wrapped into int64."""
    s = (seed + index) & ((1 << 64) - 1)
    return s - (1 << 64) if s >= 1 << 63 else s


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=choice_seed(params.seed, index))


def choice_requests(prompts: Sequence, params: SamplingParams, n: int, request_id: str, *,
                    messages: list[dict] | None = None, tools: list[dict] | None = None) -> list[Request]:
    """The requests of n choices of each prompt (or, with `messages`, of the one
    conversation), named request_id-<choice index>."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidRequestError("n", f"must be an integer >= 1, got {n!r}")
    items = [None] if messages is not None else list(prompts)
    if not items:
        raise InvalidRequestError("prompt", "must not be an empty list")
    if len(items) * n > MAX_CHOICES:
        raise InvalidRequestError("n", f"{len(items)} prompts x n={n} = {len(items) * n} choices are over the "
                                  f"limit of {MAX_CHOICES} per request")
    return [Request(prompt, choice_params(params, j), f"{request_id}-{i * n + j}", messages, tools)
            for i, prompt in enumerate(items) for j in range(n)]
