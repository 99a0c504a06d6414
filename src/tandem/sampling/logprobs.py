"""The target's own log-probabilities at the rows of sequences that ask for them
(SamplingSpec.logprobs, PrefillItem.prompt_logprobs), computed on rank 0 where the logits are.

Raw: log_softmax of the model's logits (fp32), before the logit rules, the grammar mask and
temperature / top-k / top-p, as vLLM's default logprobs mode (raw_logprobs) gives them.
They are the same whether a token came from an accepted draft or a bonus pick, and do not
depend on the drafter. Rows of sequences that do not ask are not touched.
"""
from __future__ import annotations

import torch

from tandem.shard.commands import NO_LOGPROBS, RowLogprobs, SamplingSpec


def verify_logprobs(logits: torch.Tensor, rows: torch.Tensor, picks: list[int],
                    sampling: list[SamplingSpec]) -> list[RowLogprobs]:
    """logits [n, k, V] (raw), rows [n, k] (the last token, then the drafts), picks [n*k]:
    for each sequence that asks, the logprob of each row's pick and of the draft it checked,
    and its rows' top N; [] when none asks."""
    want = [i for i, spec in enumerate(sampling) if spec.logprobs is not None]
    if not want:
        return []
    n, k, _ = logits.shape
    device = logits.device
    # Log-probabilities as logits - logsumexp, taken only where they are read: the full
    # log_softmax tensor and its top-k cost twice as much (topk of the logits orders them alike).
    sel = logits if len(want) == n else logits.index_select(0, torch.tensor(want, dtype=torch.long, device=device))
    sel = sel.float()  # [m, k, V]
    lse = torch.logsumexp(sel, dim=-1)  # [m, k]
    pick = torch.tensor([picks[i * k : (i + 1) * k] for i in want], dtype=torch.long, device=device)
    chosen = sel.gather(-1, pick[..., None])[..., 0] - lse  # [m, k]
    drafts = rows[want][:, 1:].to(device)
    drafted = sel[:, :-1].gather(-1, drafts[..., None])[..., 0] - lse[:, :-1]  # [m, k-1]
    top_n = max(sampling[i].logprobs for i in want)
    parts = [chosen.flatten(), drafted.flatten()]
    if top_n:
        top = sel.topk(top_n, dim=-1)
        parts += [(top.values - lse[..., None]).flatten(), top.indices.flatten().float()]  # ids < 2**24 are exact in fp32
    flat = torch.cat(parts).tolist()  # one read back from the device
    m, at = len(want), 0

    def take(count: int) -> list[float]:
        nonlocal at
        at += count
        return flat[at - count : at]

    chosen_h, drafted_h = take(m * k), take(m * (k - 1))
    vals_h, ids_h = (take(m * k * top_n), take(m * k * top_n)) if top_n else ([], [])
    out = [NO_LOGPROBS] * n
    for j, i in enumerate(want):
        asked, rows = sampling[i].logprobs, range(j * k, (j + 1) * k)
        out[i] = RowLogprobs(
            chosen=chosen_h[j * k : (j + 1) * k],
            top_ids=[int(ids_h[r * top_n + c]) for r in rows for c in range(asked)],
            top_logprobs=[vals_h[r * top_n + c] for r in rows for c in range(asked)],
            drafts=drafted_h[j * (k - 1) : (j + 1) * (k - 1)],
        )
    return out


def last_logprobs(logits: torch.Tensor, picks: list[int], sampling: list[SamplingSpec]) -> list[RowLogprobs]:
    """logits [n, V] of each sequence's last row (a prefill): its pick's logprob and top N;
    [] when none asks."""
    return verify_logprobs(logits[:, None], torch.tensor(picks, dtype=torch.long)[:, None], picks, sampling)


def rows_logprobs(logits: torch.Tensor, targets: list[int], top_n: int) -> RowLogprobs:
    """logits [R, V] (raw) of R rows, targets [R] the token each row is scored for."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)  # [R]
    at = torch.tensor(targets, dtype=torch.long, device=logits.device)[:, None]
    chosen = (logits.gather(-1, at)[:, 0] - lse).tolist()
    if not top_n:
        return RowLogprobs(chosen=chosen)
    top = logits.topk(top_n, dim=-1)
    values = top.values - lse[:, None]
    return RowLogprobs(chosen=chosen, top_ids=top.indices.flatten().tolist(), top_logprobs=values.flatten().tolist())


def joined(parts: list[RowLogprobs]) -> RowLogprobs:
    """Consecutive rows' RowLogprobs as one (a prompt scored in chunks)."""
    return RowLogprobs(chosen=[v for p in parts for v in p.chosen], top_ids=[t for p in parts for t in p.top_ids],
                       top_logprobs=[v for p in parts for v in p.top_logprobs])
