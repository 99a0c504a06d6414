"""Our own Llama-family forward (Llama, Qwen2, Mistral) over a paged KV cache.

Module and parameter names follow Hugging Face's (`model.layers.0.self_attn.q_proj.weight`,
...), so a HF safetensors state dict loads straight in. The model knows nothing about
tensor parallelism: `tensor_parallel.shard_model` narrows its linear layers from outside,
and the attention infers its local head counts from the weights' shapes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tandem.model.config import ModelConfig
from tandem.model.cpu_linear import FusedLinears, pack_linear_layers, share_fused_storage
from tandem.model.cpu_malloc import keep_freed_memory
from tandem.model.kv_cache import PagedKVCache
from tandem.model.row_places import RowPlaces


@functools.lru_cache(maxsize=None)
def fused_cuda_kernels():
    """tandem.model.fused_cuda, or None where triton does not import."""
    try:
        from tandem.model import fused_cuda
    except ImportError:
        return None
    return fused_cuda


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [n, k, vocab], float32
    # hidden[i]: output of decoder layer i, [n, k, hidden] in the model's dtype
    # (HF's `hidden_states[i + 1]`; the last layer's output is before the final norm).
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class RopeRows:
    """The rows' rotary angles: full-width cos/sin [n, k, 1, d] in the activations' dtype
    (the torch ops), or, with `positions` [n, k], the model's half-width float32 tables
    that the fused CUDA kernel reads at each row's position."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor | None = None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # Two kernels instead of seven (a small-batch GPU forward is launch-bound), with
            # HF's rounding: the fused kernel rounds x * rstd to x's dtype once, then the scale.
            # Folding the weight into the kernel (one rounding) shifted the bf16 hidden states
            # enough to cut the shipped DFlash drafter's acceptance from 3.0 to 2.7.
            return F.rms_norm(x, self.weight.shape, None, self.eps) * self.weight
        # Normalise in float32, scale in the input dtype: what HF does, so bf16 matches it too.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], float32, for the config's rope type (as HF computes them)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    if config.rope_type == "linear":
        return inv_freq / scaling["factor"]
    if config.rope_type == "llama3":
        factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hq, hkv = config.head_dim, config.num_heads, config.num_kv_heads
        self.head_dim = d
        self.q_proj = nn.Linear(config.hidden_size, hq * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.o_proj_bias)
        self.qkv = FusedLinears(self.q_proj, self.k_proj, self.v_proj)  # one GEMM where packed (CPU)

    def forward(self, x: torch.Tensor, rope: RopeRows, cache: PagedKVCache, layer: int, where: "RowPlaces",
                fused=None) -> torch.Tensor:
        # x: [n, k, hidden]; where: the rows' blocks and offsets; fused: fused_cuda or None
        n, k, _ = x.shape
        d = self.head_dim
        # Head counts come from the weights, so a tensor-parallel shard needs no other change.
        hq, hkv = self.q_proj.out_features // d, self.k_proj.out_features // d
        qkv = self.qkv.joined(x)
        # Write this step's rows first, so each row also sees itself and the rows before it.
        if fused is not None:  # rotation and KV write in one kernel
            q = fused.rope_to_cache(qkv, hq, hkv, rope.cos, rope.sin, rope.positions, where.blocks, where.offsets,
                                    cache.k[layer], cache.v[layer])
        else:
            # q and k side by side: one rotation for both (half the kernels of two)
            qk = qkv[..., : (hq + hkv) * d].view(n, k, hq + hkv, d)
            value = qkv[..., (hq + hkv) * d :].view(n, k, hkv, d)
            qk = qk * rope.cos + rotate_half(qk) * rope.sin
            q, key = qk[:, :, :hq], qk[:, :, hq:]  # [n, k, hq, d], [n, k, hkv, d]
            cache.write(layer, key, value, where.blocks, where.offsets)
            q = q.contiguous()
        out = where.attend(q, cache.k[layer], cache.v[layer])
        return self.o_proj(out.reshape(n, k, hq * d))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up = FusedLinears(self.gate_proj, self.up_proj)  # one GEMM where packed (CPU)

    def forward(self, x: torch.Tensor, fused=None) -> torch.Tensor:
        if fused is not None:
            return self.down_proj(fused.silu_mul(self.gate_up.joined(x)))
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, cache, layer, where, fused=None, normed=None, next_norm: RMSNorm | None = None):
        """The layer's output. With `fused` (the fused_cuda kernels), `normed` is this
        layer's input norm of x, already made, and the result is (output, next_norm of
        the output, or None without next_norm): each residual add runs with the norm
        after it."""
        if fused is None:
            x = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, where)
            return x + self.mlp(self.post_attention_layernorm(x))
        norm = self.post_attention_layernorm
        x, normed = fused.add_rms_norm(x, self.self_attn(normed, rope, cache, layer, where, fused), norm.weight,
                                       norm.eps)
        delta = self.mlp(normed, fused)
        if next_norm is None:
            return x + delta, None
        return fused.add_rms_norm(x, delta, next_norm.weight, next_norm.eps)


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self._build_rope_tables()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _build_rope_tables(self, device: torch.device | str | None = None) -> None:
        # Half-width tables [max_pos, head_dim / 2], float32: cos/sin of position * inv_freq.
        device = device or self.lm_head.weight.device
        inv_freq = rope_inv_freq(self.config)
        positions = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        self.register_buffer("rope_cos", freqs.cos().to(device), persistent=False)
        self.register_buffer("rope_sin", freqs.sin().to(device), persistent=False)

    @classmethod
    def from_state_dict(cls, config: ModelConfig, state_dict: dict[str, torch.Tensor],
                        dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> "LlamaForCausalLM":
        """Build the model around HF-named tensors without first allocating random weights."""
        with torch.device("meta"):
            model = cls(config)
        state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state_dict.items()
                 if not name.endswith("rotary_emb.inv_freq")}
        if config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True, assign=True)
        del state  # the model holds the tensors now; share_fused_storage below frees each as it fuses
        model.tie_weights()
        model._build_rope_tables(device)
        pack_linear_layers(model)  # float32 CPU forwards: oneDNN on packed weights (see cpu_linear)
        if torch.device(device).type == "cpu":
            keep_freed_memory()  # no page faults on every forward's temporaries (see cpu_malloc)
        else:
            share_fused_storage(model)  # q/k/v and gate/up as one GEMM each (see FusedLinears)
        return model.eval().requires_grad_(False)

    quantization = "none"  # or the method of model.quant its linear layers were quantized with
    # CUDA forwards run the fused_cuda kernels (where triton imports); False: the torch ops
    # alone, for A/B comparisons. Graphs captured under the other choice must not replay.
    fused_kernels = True

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its activations, KV and unquantized weights."""
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)  # [n, k] -> [n, k, hidden]

    def final_norm_and_head(self, hidden: torch.Tensor) -> torch.Tensor:
        fused = self.fused_kernels_for(hidden)
        norm = self.model.norm
        normed = fused.add_rms_norm(hidden, None, norm.weight, norm.eps)[1] if fused is not None else norm(hidden)
        return self.lm_head(normed).float()  # [n, k, hidden] -> [n, k, vocab] float32

    def fused_kernels_for(self, x: torch.Tensor):
        """fused_cuda when this forward of x may use it, else None: a CUDA tensor of a dtype
        the kernels take, triton importable, `fused_kernels` on, and no hook on a norm (a
        fused norm runs no module: calibration's hooks must see each one)."""
        if not (self.fused_kernels and x.is_cuda):
            return None
        fused = fused_cuda_kernels()
        if fused is None or x.dtype not in fused.DTYPES:
            return None
        layers = self.model.layers
        norms = [self.model.norm] + [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        return None if any(n._forward_hooks or n._forward_pre_hooks for n in norms) else fused

    def new_cache(self, num_blocks: int, block_size: int = 16, scratch_blocks: int = 1) -> PagedKVCache:
        """A cache in this model's dtype and device, with as many kv heads as its (possibly sharded) layers."""
        num_kv_heads = self.model.layers[0].self_attn.k_proj.out_features // self.config.head_dim
        return PagedKVCache(self.config.num_layers, num_blocks, block_size, num_kv_heads, self.config.head_dim,
                            self.dtype, self.device, scratch_blocks)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start_pos: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor,
                capture_layers: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> ModelOutput:
        """Run k new rows for each of n sequences through the model and the cache.

        tokens: [n, k]; start_pos: [n]; block_tables: [n, W] int32, each sequence's blocks
        padded with a block no sequence reads (the cache's scratch block), W covering every
        row (W * block_size >= start_pos + k).
        Row r of sequence i sits at position p = start_pos[i] + r; its K/V are written to
        block block_tables[i, p // block_size] at offset p % block_size, and it attends to
        positions 0..p of its sequence. The forward never syncs with the device (a GPU
        forward can be captured in a CUDA graph); the caller checks tables and positions.
        logit_rows: [n, m] row indices (0..k-1) per sequence: the LM head runs on those rows
        only and logits is [n, m, vocab] (m may be 0: a KV-only forward). Left out, every row
        ([n, k, vocab]). A prefill of long prompts needs one row's logits a sequence, and the
        full head there would be [n * k, vocab] floats (151k wide for Qwen: gigabytes).
        """
        where = RowPlaces.of(block_tables, start_pos, tokens.shape[1], cache.block_size)
        return self.run_rows(tokens, where, cache, capture_layers, logit_rows)

    def run_rows(self, tokens: torch.Tensor, where: RowPlaces, cache: PagedKVCache,
                 capture_layers: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None) -> ModelOutput:
        """forward's work on rows already placed: one rectangle, or several side by side
        (tandem.model.grouped_forward)."""
        n, k = tokens.shape
        bad = [i for i in capture_layers if not 0 <= i < self.config.num_layers]
        if bad:
            raise ValueError(f"capture_layers {bad} outside 0..{self.config.num_layers - 1}")
        device = tokens.device
        # (clamped: the pad rows of a prefill batch may run past the rope tables)
        pos = where.positions.clamp_max(self.rope_cos.shape[0] - 1)

        x = self.embed(tokens)  # [n, k, hidden]
        fused = self.fused_kernels_for(x)
        if fused is not None:
            x, hidden, normed = self._fused_layers(fused, x, pos, cache, where, capture_layers, logit_rows is None)
            if logit_rows is None:  # the last residual add ran with the final norm
                return ModelOutput(logits=self.lm_head(normed).float(), hidden=hidden)
        else:
            cos = torch.cat([self.rope_cos[pos]] * 2, dim=-1).to(x.dtype)[:, :, None]  # [n, k, 1, d]
            sin = torch.cat([self.rope_sin[pos]] * 2, dim=-1).to(x.dtype)[:, :, None]  # [n, k, 1, d]
            rope = RopeRows(cos, sin)
            hidden = {}
            for i, layer in enumerate(self.model.layers):
                x = layer(x, rope, cache, i, where)
                if i in capture_layers:
                    hidden[i] = x
        if logit_rows is not None:
            if logit_rows.shape[1] == 0:  # KV only (an empty GEMM is not for every backend)
                empty = torch.empty(n, 0, self.lm_head.out_features, dtype=torch.float32, device=device)
                return ModelOutput(logits=empty, hidden=hidden)
            x = x.gather(1, logit_rows[:, :, None].expand(-1, -1, x.shape[-1]))  # [n, m, hidden]
        return ModelOutput(logits=self.final_norm_and_head(x), hidden=hidden)

    def _fused_layers(self, fused, x, pos, cache, where, capture_layers, final_norm: bool):
        """The decoder layers with the fused kernels: (output, captured outputs, the final
        norm of the output where `final_norm`, else None)."""
        rope = RopeRows(self.rope_cos, self.rope_sin, pos)
        layers = self.model.layers
        first = layers[0].input_layernorm
        _, normed = fused.add_rms_norm(x, None, first.weight, first.eps)
        hidden = {}
        for i, layer in enumerate(layers):
            last = i + 1 == len(layers)
            next_norm = (self.model.norm if final_norm else None) if last else layers[i + 1].input_layernorm
            x, normed = layer(x, rope, cache, i, where, fused, normed, next_norm)
            if i in capture_layers:
                hidden[i] = x
        return x, hidden, normed
