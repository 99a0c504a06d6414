"""A tiny random target and DFlash drafters for it, for the DFlash tests."""
from __future__ import annotations

import torch

from slot_blocks import BLOCK, pool_blocks
from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, DFlashDrafter
from tandem.model.config import ModelConfig
from tandem.model.kv_cache import PagedKVCache
from tandem.model.llama import LlamaForCausalLM
from tandem.model.verify_graphs import VerifyGraphs
from tandem.shard.model_shard import ModelShard

VOCAB = 96
TARGET = ModelConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_layers=4, num_heads=4,
                     num_kv_heads=2, head_dim=12, rope_theta=10000.0, max_position_embeddings=512,
                     tie_word_embeddings=True)
SLOTS, CONTEXT, ROW_BUDGET = 16, 192, 256


def tiny_target(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(TARGET)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.5 if "embed_tokens" in name else 0.15)
    return model.eval().requires_grad_(False)


def tiny_dflash_config(block_size: int = 6, layers: tuple[int, ...] = (0, 2, 3)) -> DFlashConfig:
    return DFlashConfig(hidden_size=TARGET.hidden_size, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=12,
                        intermediate_size=64, vocab_size=VOCAB, target_layer_ids=layers, block_size=block_size,
                        mask_token_id=VOCAB - 1, num_target_layers=TARGET.num_layers, rope_theta=10000.0)


def random_dflash(seed: int = 0, std: float = 0.3, **kw) -> DFlashDraftModel:
    """Random weights, larger than training's init so the drafts vary with the context."""
    return DFlashDraftModel(tiny_dflash_config(**kw)).init_weights(seed, std=std).eval().requires_grad_(False)


def tiny_shard(target: LlamaForCausalLM, draft: DFlashDraftModel | None, cuda_graphs: bool | None = None,
               target_graphs: bool = False) -> ModelShard:
    """A shard of `target` with slots for SLOTS sequences, drafting with `draft` (None: no
    drafter). cuda_graphs=True graphs the drafter's forwards, target_graphs=True the
    target's verify forward; on the CPU their padded graph shapes then run eagerly. Its KV
    pool holds the per-slot tables of tests/slot_blocks.py, and the scratch block the shard
    pads tables with."""
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    cache = PagedKVCache(TARGET.num_layers, pool_blocks(SLOTS), BLOCK, TARGET.num_kv_heads, TARGET.head_dim, dtype, device,
                         scratch_blocks=1)
    drafter = (DFlashDrafter(draft, target, num_slots=SLOTS, num_blocks=pool_blocks(SLOTS), block_size=BLOCK,
                              max_seq_len=CONTEXT, cuda_graphs=cuda_graphs)
               if draft is not None else None)
    graphs = VerifyGraphs(target, cache, CONTEXT, capture=device.type == "cuda") if target_graphs else None
    return ModelShard(target, cache, num_slots=SLOTS, max_model_len=CONTEXT, row_budget=ROW_BUDGET, vocab_size=VOCAB,
                      drafter=drafter, graphs=graphs)


class DigitsTokenizer:
    """Enough of a tokenizer for an engine fed token ids."""

    chat_template = None

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return " ".join(str(i) for i in ids)


def random_prompts(count: int, seed: int = 0, low: int = 3, high: int = 40) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(low, high, (1,), generator=g))
        out.append(torch.randint(0, VOCAB - 1, (n,), generator=g).tolist())
    return out
