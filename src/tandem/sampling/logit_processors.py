"""Penalties and biases on a sequence's logits, as the state is at each row it decides.

Row r of a verify follows the sequence's committed history, its last token and drafts
d0..d(r-1): it is penalised as if those drafts were already emitted, which is exactly
the state after the accept walk reaches it. So greedy speculation equals greedy decoding
under the same rules, and sampling from the processed p stays lossless.

The definitions are vLLM's (and OpenAI's for presence/frequency), in vLLM's order:
  min_tokens         EOS and stop_token_ids get -inf while fewer than min_tokens are out;
  logit_bias         added to the token's logit;
  repetition_penalty a token seen in the prompt or the output: a positive logit is
                     divided by it, a negative one multiplied;
  frequency_penalty  minus penalty * the token's count in the output;
  presence_penalty   minus penalty once the token is in the output.
Then temperature, top-k, min-p and top-p (tandem.sampling.filters). Sequences without
rules cost one check a sequence; their logits are not copied.
"""
from __future__ import annotations

import torch

from tandem.shard.commands import LogitRules, SamplingSpec


def apply_to_rows(
    logits: torch.Tensor,  # [n, k, V]
    rows: torch.Tensor,  # [n, k] row tokens: the last token, then the drafts
    histories: list[list[int]] | None,  # [n] each slot's committed tokens (before row 0)
    sampling: list[SamplingSpec],
) -> torch.Tensor:
    """The verify's logits with every sequence's rules applied (fp32 when any has rules)."""
    if all(spec.rules is None for spec in sampling):
        return logits
    assert histories is not None, "logit rules need the slots' histories"
    out = logits.to(torch.float32, copy=True)
    device_rows = None
    for i, spec in enumerate(sampling):
        if spec.rules is not None:
            if device_rows is None:
                device_rows = rows.to(out.device)
            context = list(histories[i]) + [int(rows[i, 0])]
            _apply(out[i], context, device_rows[i, 1:], spec.rules)
    return out


def apply_to_last(logits: torch.Tensor, contexts: list[list[int]] | None, sampling: list[SamplingSpec]) -> torch.Tensor:
    """logits [n, V] of each sequence's next token after contexts[i] (its whole history)."""
    if all(spec.rules is None for spec in sampling):
        return logits
    assert contexts is not None, "logit rules need the sequences' contexts"
    out = logits.to(torch.float32, copy=True)
    none = torch.empty(0, dtype=torch.long, device=out.device)
    for i, spec in enumerate(sampling):
        if spec.rules is not None:
            _apply(out[i : i + 1], contexts[i], none, spec.rules)
    return out


def _apply(x: torch.Tensor, context: list[int], added: torch.Tensor, rules: LogitRules) -> None:
    """x [R, V] float32, in place: row r decides the token after context + added[:r]
    (added: R-1 tokens on x's device). Token ids past V (a smaller draft vocabulary) are
    left out."""
    rows, vocab = x.shape
    device = x.device
    generated = len(context) - rules.prompt_len  # output tokens before row 0's pick
    if rules.min_tokens > generated and rules.min_tokens_ids:
        ids = torch.tensor([t for t in rules.min_tokens_ids if t < vocab], dtype=torch.long, device=device)
        short = min(rows, rules.min_tokens - generated)  # rows r with generated + r < min_tokens
        x[:short, ids] = float("-inf")
    if rules.logit_bias:
        pairs = [(t, b) for t, b in rules.logit_bias if t < vocab]
        ids = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=device)
        x[:, ids] += torch.tensor([b for _, b in pairs], dtype=torch.float32, device=device)
    if rules.repetition_penalty == 1.0 and rules.frequency_penalty == 0.0 and rules.presence_penalty == 0.0:
        return
    ctx = torch.tensor(context, dtype=torch.long, device=device)
    counts = _counts(ctx[rules.prompt_len :], added[: rows - 1], rows, vocab)  # [R, V]
    if rules.repetition_penalty != 1.0:
        prompt = ctx[: rules.prompt_len]
        seen = counts > 0
        seen[:, prompt[prompt < vocab]] = True
        rp = rules.repetition_penalty
        x.copy_(torch.where(seen, torch.where(x > 0, x / rp, x * rp), x))
    if rules.frequency_penalty != 0.0:
        x -= rules.frequency_penalty * counts
    if rules.presence_penalty != 0.0:
        x -= rules.presence_penalty * (counts > 0).float()


def _counts(output: torch.Tensor, added: torch.Tensor, rows: int, vocab: int) -> torch.Tensor:
    """[R, V] each token's count in the output before row r: output, then added[:r]."""
    output = output[output < vocab]
    base = torch.bincount(output, minlength=vocab).to(torch.float32)[None].repeat(rows, 1)
    if rows > 1:
        inside = (added < vocab).float()[:, None]
        step = torch.nn.functional.one_hot(added.clamp(max=vocab - 1), vocab).float() * inside  # [R-1, V]
        base[1:] += step.cumsum(dim=0)
    return base
