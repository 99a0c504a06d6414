"""The DFlash drafter a training run starts from (scripts/train_dflash.py): new weights or
a warm start from a checkpoint, and the draft vocabulary, the most frequent tokens the
target generated in the corpus, whose rows alone the head scores."""
from __future__ import annotations

from dataclasses import replace

import torch

from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel
from tandem.drafters.dflash.checkpoint import load_dflash_checkpoint

from dflash_corpus import Packed

# ---- draft vocabulary -------------------------------------------------------------------


def generated(data) -> torch.Tensor:
    if isinstance(data, Packed):
        own = torch.repeat_interleave(data.off, data.seq_len)  # each row's sequence start
        first = own + torch.repeat_interleave(data.prompt_len, data.seq_len)
        return data.tokens[torch.arange(data.tokens.shape[0], device=data.tokens.device) >= first]
    tokens, _, prompt_len, seq_len = data
    pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return tokens[(pos >= prompt_len[:, None]) & (pos < seq_len[:, None])]


def draft_vocab_of(data, vocab_size: int, coverage: float) -> torch.Tensor:
    """The most frequent generated tokens that cover `coverage` of them, rounded up to a
    multiple of 256, sorted by id."""
    counts = torch.bincount(generated(data), minlength=vocab_size).float()
    order = counts.argsort(descending=True)
    share = counts[order].cumsum(0) / counts.sum()
    size = min(vocab_size, -(-(int((share < coverage).sum()) + 1) // 256) * 256)
    return order[:size].sort().values


def draft_vocab_top(data, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent generated tokens, sorted by id."""
    counts = torch.bincount(generated(data), minlength=vocab_size)
    return counts.argsort(descending=True)[:size].sort().values


def in_vocab_share(vocab: torch.Tensor, data) -> float:
    toks = generated(data)
    return torch.isin(toks, vocab.to(toks.device)).float().mean().item()


# ---- the drafter to train ---------------------------------------------------------------


def make_drafter(args, target, device, layer_ids, mask_id: int, train_data, eval_data, log) -> DFlashDraftModel:
    """The drafter the flags ask for: with --init-from that checkpoint (its architecture and
    draft vocabulary; --revocab re-chooses the vocabulary on train_data), else new weights
    shaped by the flags (the head's rows chosen on train_data by --draft-vocab-coverage)."""
    tc = target.config
    config = DFlashConfig(
        hidden_size=tc.hidden_size, num_layers=args.layers, num_heads=tc.num_heads, num_kv_heads=tc.num_kv_heads,
        head_dim=tc.head_dim, intermediate_size=args.intermediate_size, vocab_size=tc.vocab_size,
        target_layer_ids=layer_ids, block_size=args.block_size, mask_token_id=mask_id, num_target_layers=tc.num_layers,
        rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta, max_position_embeddings=tc.max_position_embeddings,
    )
    if args.init_from:  # its architecture and draft vocabulary; the flags that shape a new drafter are ignored
        model = load_dflash_checkpoint(args.init_from, device=device).requires_grad_(True)
        config = model.config
        if config.target_layer_ids != layer_ids or config.mask_token_id != mask_id:
            log(f"note: {args.init_from} reads layers {config.target_layer_ids}, mask {config.mask_token_id}")
        vocab = model.draft_vocab if config.draft_vocab_size else None
        if vocab is not None:
            log(f"draft vocabulary of {args.init_from}: covers {in_vocab_share(vocab, train_data):.4f} of this corpus")
        if args.revocab and args.draft_vocab_size:  # other rows, the same head cost in the engine
            new_vocab = draft_vocab_top(train_data, tc.vocab_size, args.draft_vocab_size)
            old_n = 0 if vocab is None else vocab.numel()
        elif args.revocab and args.draft_vocab_coverage < 1:
            new_vocab = draft_vocab_of(train_data, tc.vocab_size, args.draft_vocab_coverage)
            old_n = 0 if vocab is None else vocab.numel()
            if vocab is not None:  # keep every old row too: the held-out families keep their drafts
                new_vocab = torch.unique(torch.cat([new_vocab.to(device), vocab.to(device)]))
        if args.revocab and (args.draft_vocab_size or args.draft_vocab_coverage < 1):
            state = {k: v for k, v in model.state_dict().items() if k != "draft_vocab"}
            config = replace(config, draft_vocab_size=int(new_vocab.numel()))
            model = DFlashDraftModel(config).to(device)
            missing, unexpected = model.load_state_dict(state, strict=False)
            assert set(missing) <= {"draft_vocab"} and not unexpected, (missing, unexpected)
            model.draft_vocab.copy_(new_vocab)
            model.requires_grad_(True)
            vocab = model.draft_vocab
            log(f"new draft vocabulary: {old_n} -> {vocab.numel()} tokens, covering {in_vocab_share(vocab, train_data):.4f} "
                f"of this corpus")
        log(f"init from {args.init_from}: {config.num_layers} layers, draft vocabulary "
            f"{config.draft_vocab_size or config.vocab_size}")
    else:
        vocab = None
        if args.draft_vocab_coverage < 1:  # trained with the head it will draft with
            vocab = draft_vocab_of(train_data, tc.vocab_size, args.draft_vocab_coverage)
            config = replace(config, draft_vocab_size=int(vocab.numel()))
        model = DFlashDraftModel(config).init_weights(args.seed).to(device)
        if vocab is not None:
            model.draft_vocab.copy_(vocab)
        with torch.no_grad():  # start from the target's output scale: the head is the target's
            model.norm.weight.copy_(target.model.model.norm.weight.float())
    if vocab is not None:
        log(f"draft vocabulary: {vocab.numel()} tokens, covering {in_vocab_share(vocab, eval_data):.4f} of the held-out tokens")
    log(f"drafter: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, layers {layer_ids}, mask {args.mask_token}={mask_id}")
    return model
