"""The DFlash draft model: block diffusion conditioned on the target's hidden states.

A few decoder layers draft a whole block at once. The block is [last token, mask x (B-1)]
at positions P..P+B-1; its rows attend, without a causal mask, to each other and to the
*context*: the target's hidden states of the chosen layers (`target_layer_ids`) at the
positions 0..P-1, concatenated, projected by `fc` and normalised by `hidden_norm`. Every
layer reads the same projected context through its own k/v projections, so a position's
context keys and values depend on that position's target rows alone and are computed
once (`context_kv`) and kept. Rows 1..B-1 of the output, after the final `norm`, go
through the *target's* LM head: the drafts for positions P+1..P+B-1. The block's input
embeddings are the target's embeddings too. (arXiv 2602.06036; parameter names and
config keys follow the z-lab checkpoints, Qwen3-style layers with q/k norms.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # tandem's extension: drafts come from these many token ids only (the tensor
    # `draft_vocab`), which cuts the LM head the drafter runs; None = the whole vocabulary
    draft_vocab_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # unknown-to-us keys, kept on save

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"DFlashConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the last token and at least one mask), got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")

    # ---- the z-lab config.json layout ---------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DFlashConfig":
        """Read a z-lab style config: Qwen3 keys at the top level, the DFlash keys either in
        `dflash_config` or at the top level (the dflash package reads both, in that order)."""
        dflash = d.get("dflash_config") or {}

        def draft(name, default=None):
            return dflash.get(name, d.get(name, default))

        archs = d.get("architectures") or []
        if "DFlash2DraftModel" in archs or draft("conv_kernel_size") is not None:
            raise ValueError("DFlash2 checkpoints (causal convolutions, candidate selector) are not supported")
        layer_types = d.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types) or d.get("use_sliding_window"):
            raise ValueError(f"only full-attention DFlash layers are supported, got layer_types {layer_types}")
        if draft("is_causal"):
            raise ValueError("causal DFlash layers are not supported (the block attends to itself both ways)")
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"only default rope is supported in a DFlash checkpoint, got {rope}")
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
        num_heads = d["num_attention_heads"]
        target_layer_ids = draft("target_layer_ids")
        if target_layer_ids is None:
            raise ValueError("the config names no target_layer_ids")
        if draft("mask_token_id") is None:
            raise ValueError("the config names no mask_token_id")
        known = {
            "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "block_size", "num_target_layers", "rms_norm_eps", "rope_theta",
            "rope_scaling", "rope_parameters", "max_position_embeddings", "attention_bias", "dflash_config",
            "target_layer_ids", "mask_token_id", "input_embedding_scale", "output_multiplier", "final_logit_softcapping",
            "architectures", "model_type", "hidden_act", "tie_word_embeddings", "dtype", "torch_dtype",
            "draft_vocab_size",
        }
        return cls(
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads", num_heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            intermediate_size=d["intermediate_size"],
            vocab_size=d["vocab_size"],
            target_layer_ids=tuple(int(i) for i in target_layer_ids),
            block_size=int(draft("block_size", 16)),
            mask_token_id=int(draft("mask_token_id")),
            num_target_layers=d.get("num_target_layers"),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=d.get("max_position_embeddings", 32768),
            attention_bias=bool(d.get("attention_bias", False)),
            input_embedding_scale=float(draft("input_embedding_scale", 1.0)),
            output_multiplier=float(draft("output_multiplier", 1.0)),
            final_logit_softcapping=draft("final_logit_softcapping"),
            draft_vocab_size=draft("draft_vocab_size"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.extra)
        d.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            hidden_act="silu",
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=None,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            tie_word_embeddings=False,
            num_target_layers=self.num_target_layers,
            block_size=self.block_size,
            dflash_config={"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id},
        )
        for name in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping", "draft_vocab_size"):
            value = getattr(self, name)
            if value not in (None, 1.0):
                d[name] = value
        return d


def spread_layer_ids(num_target_layers: int, count: int) -> tuple[int, ...]:
    """`count` target layers spread from the second to the last (the last layer's output
    carries the target's own next-token guess; the first ones the token identities)."""
    if count == 1:
        return (num_target_layers - 1,)
    start, end = 1, num_target_layers - 1
    return tuple(round(start + i * (end - start) / (count - 1)) for i in range(count))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:  # two kernels, HF's rounding (see tandem.model.llama.RMSNorm)
            return F.rms_norm(x, self.weight.shape, None, self.eps) * self.weight
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.head_dim = c.head_dim
        self.num_heads, self.num_kv_heads = c.num_heads, c.num_kv_heads
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [..., hidden]; cos, sin: [..., 1, d] -> k, v: [..., hkv, d]
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return _rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        # x: [n, Q, hidden]; cos, sin: [n, Q, 1, d]; ctx_k, ctx_v: [n, hkv, C, d]
        # mask: [n, 1, Q, C + Q] (True = attend): context columns first, then the block's rows
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)))
        q = _rope(q, cos, sin).transpose(1, 2)  # [n, hq, Q, d]
        k, v = self.key_value(x, cos, sin)  # [n, Q, hkv, d]
        keys = torch.cat([ctx_k, k.transpose(1, 2)], dim=2)  # [n, hkv, C + Q, d]
        values = torch.cat([ctx_v, v.transpose(1, 2)], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [n, hq, Q, d]
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DFlashMLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(c)
        self.mlp = DFlashMLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        c = config
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if c.draft_vocab_size:
            self.register_buffer("draft_vocab", torch.arange(c.draft_vocab_size, dtype=torch.long))

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "DFlashDraftModel":
        """Random weights (linear ~ N(0, std), norms 1): what training starts from, and
        what the losslessness tests draft with."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [...] -> cos, sin: [..., 1, d] (one table row per head)
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], dim=-1)[..., None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context keys and values for the target rows `feats` [..., nL*H]
        (the chosen layers concatenated in target_layer_ids order) at `positions` [...]:
        a list over layers of (k, v), each [..., hkv, d]."""
        ctx = self.hidden_norm(self.fc(feats))
        cos, sin = self._cos_sin(positions, ctx.dtype)
        return [layer.self_attn.key_value(ctx, cos, sin) for layer in self.layers]

    def block_hidden(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: list[torch.Tensor],
                     ctx_v: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """x: [n, Q, H] block input embeddings at positions [n, Q]; ctx_k/ctx_v: per layer
        [n, hkv, C, d]; mask [n, 1, Q, C + Q]. Returns the normalised block rows [n, Q, H]."""
        cos, sin = self._cos_sin(positions, x.dtype)
        for layer, k, v in zip(self.layers, ctx_k, ctx_v):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module | torch.Tensor) -> torch.Tensor:
        """The drafts' logits through the target's LM head (or rows of its weight), float32."""
        if isinstance(lm_head, torch.Tensor):  # 2-D: a 3-D bf16 linear on a CPU copies the weight every call
            logits = F.linear(hidden.reshape(-1, hidden.shape[-1]), lm_head).view(*hidden.shape[:-1], -1).float()
        else:
            logits = lm_head(hidden).float()
        c = self.config
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping:
            cap = float(c.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        return logits
