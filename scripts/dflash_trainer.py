"""The DFlash training objective and loop (scripts/train_dflash.py): anchors, the packed
block forward, the position-weighted loss through the target's head, the regularisers,
and the training loop fitted to a time budget."""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from tandem.drafters.dflash import DFlashDraftModel

from dflash_corpus import Packed


def sample_anchors(prompt_len, seq_len, per_seq: int, gen: torch.Generator | None = None):
    """[b, per_seq] positions p in [prompt_len, seq_len - 2]: blocks whose first token is a
    generated one with at least one generated token after it."""
    span = (seq_len - 1 - prompt_len).clamp(min=1)  # [b]
    u = torch.rand(prompt_len.shape[0], per_seq, device=prompt_len.device, generator=gen)
    return prompt_len[:, None] + (u * span[:, None]).long()


def block_hidden(model: DFlashDraftModel, target, tokens, feats, anchors):
    """The drafter's output rows for blocks anchored at `anchors` [b, nb] of the sequences
    tokens [b, T] with target rows feats [b, T, nL*H]: [b, nb, B-1, H], row j drafting the
    token at anchor + 1 + j. Many blocks of a sequence share one forward: block j sees the
    context before its anchor and its own B rows (both ways), as a propose at the anchor
    would."""
    c = model.config
    B = c.block_size
    b, nb = anchors.shape
    T = feats.shape[1]
    dev = tokens.device
    ctx_pos = torch.arange(T, device=dev)
    kv = model.context_kv(feats, ctx_pos[None].expand(b, T))  # per layer k, v: [b, T, hkv, d]
    ctx_k = [k.transpose(1, 2) for k, _ in kv]
    ctx_v = [v.transpose(1, 2) for _, v in kv]
    pos = anchors[:, :, None] + torch.arange(B, device=dev)  # [b, nb, B]
    block = torch.full((b, nb, B), c.mask_token_id, dtype=torch.long, device=dev)
    block[:, :, 0] = tokens.gather(1, anchors)
    x = target.embed(block.flatten(1)) * c.input_embedding_scale  # [b, nb*B, H]
    ctx_ok = ctx_pos[None, None, :] < anchors[:, :, None]  # [b, nb, T]
    ctx_ok = ctx_ok[:, :, None, :].expand(b, nb, B, T).reshape(b, nb * B, T)
    blk = torch.arange(nb, device=dev).repeat_interleave(B)
    own = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_ok, own], dim=-1)[:, None]  # [b, 1, nb*B, T + nb*B]
    hidden = model.block_hidden(x, pos.flatten(1), ctx_k, ctx_v, mask)  # [b, nb*B, H]
    return hidden.view(b, nb, B, -1)[:, :, 1:]


def block_loss(model: DFlashDraftModel, target, tokens, feats, prompt_len, seq_len, anchors, decay: float,
               label_smoothing: float = 0.0):
    """Weighted cross-entropy of the drafts of blocks anchored at `anchors` [b, nb], and
    the accepted count of each block (leading drafts equal to the target's tokens) [b, nb].
    With a draft vocabulary the head is its rows only; labels outside it (never draftable)
    count as misses and stay out of the loss."""
    B = model.config.block_size
    b, nb = anchors.shape
    T = tokens.shape[1]
    offs = torch.arange(1, B, device=tokens.device)
    label_pos = anchors[:, :, None] + offs  # [b, nb, B-1]
    labels = tokens.gather(1, label_pos.clamp(max=T - 1).flatten(1)).view(b, nb, B - 1)
    valid = label_pos < seq_len[:, None, None]
    vocab = getattr(model, "draft_vocab", None)
    head = target.lm_head
    if vocab is not None:
        to_row = torch.full((model.config.vocab_size,), -1, dtype=torch.long, device=tokens.device)
        to_row[vocab] = torch.arange(vocab.numel(), device=tokens.device)
        labels = to_row[labels]  # -1 outside the draft vocabulary
        head = target.lm_head.weight[vocab]
    hidden = block_hidden(model, target, tokens, feats, anchors)
    sel = (valid & (labels >= 0)).flatten()
    logits = model.logits(hidden.flatten(0, 2)[sel], head)  # [R, V']
    ce = F.cross_entropy(logits, labels.flatten()[sel], reduction="none", label_smoothing=label_smoothing)
    weight = torch.exp(-(offs - 1).float() / decay)[None, None].expand(b, nb, B - 1).flatten()[sel]
    loss = (ce * weight).sum() / weight.sum().clamp_min(1e-6)
    hit = torch.zeros(b * nb * (B - 1), dtype=torch.bool, device=tokens.device)
    hit[sel] = logits.argmax(-1) == labels.flatten()[sel]
    accepted = hit.view(b, nb, B - 1).long().cumprod(-1).sum(-1)  # [b, nb]
    return loss, accepted


def add_dropout(model: DFlashDraftModel, p: float) -> list:
    """Dropout on every layer's attention and MLP outputs (the residual branches), active
    in training mode only; forward hooks, so the model and its checkpoint are unchanged.
    Returns the hook handles (remove() them to take it out)."""
    def hook(module, inputs, output):
        return F.dropout(output, p, module.training)

    return [m.register_forward_hook(hook) for layer in model.layers for m in (layer.self_attn, layer.mlp)]


def noisy_features(feats: torch.Tensor, num_layers: int, std: float, gen: torch.Generator) -> torch.Tensor:
    """feats [..., nL*H] plus Gaussian noise of `std` times each layer row's own RMS (the
    target layers' scales differ widely)."""
    f = feats.unflatten(-1, (num_layers, -1)).float()
    rms = f.pow(2).mean(-1, keepdim=True).sqrt()
    noise = torch.randn(f.shape, device=f.device, generator=gen)
    return (f + std * rms * noise).flatten(-2).to(feats.dtype)


def train(model, target, data, args, log, evaluate=None) -> None:
    """`data` is a padded (tokens, feats, prompt_len, seq_len) or a Packed; `evaluate`,
    if given, is called every args.eval_every steps (held-out numbers while training)."""
    if isinstance(data, Packed):
        tokens, feats, prompt_len, seq_len = data.tokens, data.feats, data.prompt_len, data.seq_len
        N = data.n
    else:
        tokens, feats, prompt_len, seq_len = data
        N = tokens.shape[0]
    dev = tokens.device
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    steps, step, t_start = args.max_steps, 0, time.time()
    timed_from = None
    while step < steps:
        # Fit the schedule to the time budget from the measured step time, and fit it again
        # later: the first steps run slow (allocator growth, kernel choice for new shapes),
        # and a schedule fitted on them alone once ended a 340 s budget after 118 s.
        if step == 10:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            timed_from = (time.time(), step)
        if step in (30, 300, 1000, 3000) and timed_from is not None and step < steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - timed_from[0]) / (step - timed_from[1])
            left = args.train_seconds - (time.time() - t_start)
            steps = min(args.max_steps, max(step + 1, step + int(left / per_step)))
            log(f"train: {per_step * 1000:.1f} ms/step -> {steps} steps")
        idx = torch.randint(0, N, (args.batch,), device=dev, generator=gen)
        t_len = int(seq_len[idx].max())
        anchors = sample_anchors(prompt_len[idx], seq_len[idx], args.blocks_per_seq, gen)
        warm = min(1.0, (step + 1) / args.warmup)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, steps))))
        for group in opt.param_groups:
            group["lr"] = args.lr * warm * (0.1 + 0.9 * cos)
        if isinstance(data, Packed):
            tok_b, feat_b = data.batch(idx, t_len)
        else:
            tok_b, feat_b = tokens[idx, :t_len], feats[idx, :t_len]
        if args.feature_noise > 0:
            feat_b = noisy_features(feat_b, len(model.config.target_layer_ids), args.feature_noise, gen)
        with amp:
            loss, accepted = block_loss(model, target, tok_b, feat_b, prompt_len[idx], seq_len[idx], anchors,
                                        args.loss_decay, args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step + 1 == steps:
            log(f"step {step}/{steps} loss {loss.item():.3f} offline acceptance length {1 + accepted.float().mean().item():.2f} "
                f"({time.time() - t_start:.0f} s)")
        step += 1
        if evaluate is not None and args.eval_every and step % args.eval_every == 0 and step < steps:
            model.eval()
            log(f"step {step}: {evaluate()}")
            model.train()
    args.steps_done, args.train_seconds_done = step, time.time() - t_start

