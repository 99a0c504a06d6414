"""best_of on completions: best_of choices of each prompt are generated (with their
logprobs, asked for them when the client did not), and the n of each prompt with the
highest cumulative logprob are returned, the best first. The usage counts every choice
generated. Streaming cannot choose before the end: best_of > n with stream is a 400."""
from __future__ import annotations

import dataclasses

from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams


def ranked_params(params: SamplingParams) -> SamplingParams:
    """The params the best_of choices run with: each token's logprob is needed to rank them."""
    return params if params.logprobs is not None else dataclasses.replace(params, logprobs=0)


def cumulative_logprob(out: RequestOutput) -> float:
    return sum(x.logprob for x in out.logprobs or ())


def best_choices(outs: list[RequestOutput], n: int, best_of: int) -> list[RequestOutput]:
    """outs: best_of choices of each prompt, prompt-major; the n best of each, prompt-major."""
    chosen = []
    for at in range(0, len(outs), best_of):
        chosen += sorted(outs[at : at + best_of], key=cumulative_logprob, reverse=True)[:n]
    return chosen


def usage_of_all(outs: list[RequestOutput], best_of: int) -> dict:
    prompt = sum(o.usage.prompt_tokens for o in outs[::best_of])
    completion = sum(o.usage.completion_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
