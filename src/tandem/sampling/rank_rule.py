"""The rank-side half of verification: the target's pick for every verify row, and
what the scheduler's accept walk needs (the acceptance probability of each draft).

Greedy rows: pick = argmax, accept = 1 if the draft is the argmax else 0.
Sampled rows (Leviathan et al. / Chen et al. speculative sampling):
  accept_j = min(1, p_j(d_j) / q_j(d_j));
  pick_j   = a draw from normalise(max(0, p_j - q_j)) (used only if d_j is rejected);
  last row: pick = a draw from p (the bonus token).
A drafter with no distribution (n-gram lookup) has a one-hot q at its draft.
"""
from __future__ import annotations

import torch

from tandem.sampling.filters import filtered_probs
from tandem.sampling.logit_processors import apply_to_last, apply_to_rows
from tandem.sampling.grammar_mask import mask_last_logits, mask_verify_logits
from tandem.sampling.noise import STREAM_TARGET, row_key, sample_rows
from tandem.shard.commands import SamplingSpec


def pick_rows(
    logits: torch.Tensor,  # [n, k, V]
    rows: torch.Tensor,  # [n, k] the row tokens: last token, then drafts (host or device)
    start_pos: list[int],  # [n]
    sampling: list[SamplingSpec],  # [n]
    draft_probs: list[torch.Tensor | None],  # [n] each [k-1, V] or None (one-hot)
    histories: list[list[int]] | None = None,  # [n] each slot's committed tokens; needed by logit rules
    grammar_masks: list[bytes] | None = None,  # [n] each k rows, b"" = unconstrained (VerifyBatch)
) -> tuple[list[int], list[float]]:
    # the rules first, the grammar last: a bias never brings back a token the grammar refuses
    logits = mask_verify_logits(apply_to_rows(logits, rows, histories, sampling), grammar_masks)
    n, k, vocab = logits.shape
    picks = logits.argmax(dim=-1)  # [n, k]
    if all(spec.greedy for spec in sampling):
        # a draft passes iff it is the pick: compared on the host, no more device work
        flat = picks.flatten().tolist()
        tokens = rows.flatten().tolist()
        accept = [float(j < k - 1 and tokens[i * k + j + 1] == flat[i * k + j]) for i in range(n) for j in range(k)]
        return flat, accept
    drafts = rows.to(logits.device)[:, 1:]  # [n, k-1]
    accept = torch.zeros(n, k, dtype=torch.float32, device=logits.device)
    accept[:, :-1] = (drafts == picks[:, :-1]).float()
    for i, spec in enumerate(sampling):
        if spec.greedy:
            continue
        p = filtered_probs(logits[i], spec.temperature, spec.top_p, spec.top_k, spec.min_p)  # [k, V]
        keys = [row_key(spec.seed, start_pos[i] + j + 1, STREAM_TARGET) for j in range(k)]
        if k > 1:
            d = drafts[i]  # [k-1]
            q = draft_probs[i]
            if q is None:
                q = torch.nn.functional.one_hot(d, vocab).float()
            q = q.to(p.device, torch.float32)
            p_d = p[:-1].gather(-1, d[:, None])[:, 0]
            q_d = q.gather(-1, d[:, None])[:, 0]
            accept[i, :-1] = torch.where(q_d > 0, torch.clamp(p_d / q_d.clamp_min(1e-30), max=1.0), torch.zeros_like(p_d))
            residual = torch.clamp(p[:-1] - q, min=0.0)
            mass = residual.sum(dim=-1, keepdim=True)
            # p == q leaves no residual; the draft is then always accepted, so any p will do
            residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:-1])
            target = torch.cat([residual, p[-1:]], dim=0)  # [k, V]
        else:
            target = p
        picks[i] = sample_rows(target, keys)
    return picks.flatten().tolist(), accept.flatten().tolist()


def pick_last(logits: torch.Tensor, lengths: list[int], sampling: list[SamplingSpec],
              contexts: list[list[int]] | None = None, grammar_masks: list[bytes] | None = None) -> list[int]:
    """logits [n, V] of each sequence's last row -> its next token (prefill / plain decode);
    contexts[i]: the tokens before it, needed by logit rules."""
    logits = mask_last_logits(apply_to_last(logits, contexts, sampling), grammar_masks)
    out = logits.argmax(dim=-1).tolist()
    for i, spec in enumerate(sampling):
        if not spec.greedy:
            p = filtered_probs(logits[i : i + 1], spec.temperature, spec.top_p, spec.top_k, spec.min_p)
            out[i] = int(sample_rows(p, [row_key(spec.seed, lengths[i], STREAM_TARGET)])[0])
    return out
