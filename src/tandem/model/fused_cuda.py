"""The elementwise parts of a CUDA decoder layer as one Triton kernel each.

A small-batch GPU forward is launch-bound: around the GEMMs a layer ran about twenty
small kernels (norms, rotary embedding, the KV write, copies, SiLU). Per layer these
three replace them:

    add_rms_norm(x, delta, weight, eps) -> (h, y)   h = x + delta, y = rmsnorm(h) * weight
    rope_to_cache(qkv, ...) -> q                    q and k rotated, k and v written to the
                                                    paged cache, q returned contiguous
    silu_mul(gate_up) -> silu(gate) * up

Each rounds where the torch ops it replaces round (the eager CUDA path of llama.py), so
bf16 results stay within a rare last-bit step of it and float32 ones agree to float32
rounding: the sum rounded to the dtype, x * rstd rounded once before the weight multiply
(as F.rms_norm then `* weight`), the rope tables rounded to the dtype before each product
and every product and sum rounded, SiLU in float32 rounded before the multiply.

CUDA graphs: no host syncs, outputs allocated from shapes only, grids from shapes only.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# No fused multiply-adds: with them the compiler turns a bf16 product and the sum after it
# into one bf16 FMA, skipping the product's rounding (a quarter of RoPE's outputs moved by
# a bf16 step on an H200), and float32 ones into FMAs torch's separate kernels never use.
NO_FMA = dict(enable_fp_fusion=False)
MAX_NORM_WIDTH = 1 << 16  # one row a program, held in registers
SILU_BLOCK = 1024


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, h_ptr, w_ptr, y_ptr, stride_x, stride_delta, stride_h, stride_y,
                         width, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / width + eps)
    normed = (x32 * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (normed * weight).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_to_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, block_ptr, offset_ptr, q_ptr, k_ptr, v_ptr,
                          stride_qkv, stride_cos, stride_sin, stride_q,
                          stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt,
                          HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """One head of one row: q heads 0..HQ-1, then k heads, then v heads, as the GEMM lays them."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK_HALF)
    mask = cols < HALF
    src = qkv_ptr + row * stride_qkv + head * (2 * HALF)
    lo = tl.load(src + cols, mask=mask, other=0.0)
    hi = tl.load(src + HALF + cols, mask=mask, other=0.0)
    dtype = qkv_ptr.dtype.element_ty
    if head < HQ + HKV:  # q and k turn; v is copied as it is
        pos = tl.load(pos_ptr + row)
        cos = tl.load(cos_ptr + pos * stride_cos + cols, mask=mask, other=0.0).to(dtype).to(tl.float32)
        sin = tl.load(sin_ptr + pos * stride_sin + cols, mask=mask, other=0.0).to(dtype).to(tl.float32)
        lo32, hi32 = lo.to(tl.float32), hi.to(tl.float32)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = (-hi, lo), each product rounded
        new_lo = ((lo32 * cos).to(dtype).to(tl.float32) - (hi32 * sin).to(dtype).to(tl.float32)).to(dtype)
        new_hi = ((hi32 * cos).to(dtype).to(tl.float32) + (lo32 * sin).to(dtype).to(tl.float32)).to(dtype)
    else:
        new_lo, new_hi = lo, hi
    if head < HQ:
        dst = q_ptr + row * stride_q + head * (2 * HALF)
    else:
        block = tl.load(block_ptr + row).to(tl.int64)
        offset = tl.load(offset_ptr + row).to(tl.int64)
        if head < HQ + HKV:
            dst = k_ptr + block * stride_kb + (head - HQ) * stride_kh + offset * stride_kt
        else:
            dst = v_ptr + block * stride_vb + (head - HQ - HKV) * stride_vh + offset * stride_vt
    tl.store(dst + cols, new_lo, mask=mask)
    tl.store(dst + HALF + cols, new_hi, mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_out, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + width + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(dtype), mask=mask)


def _output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A kernel's output, every element of which it writes (the tests poison these)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, width] with a unit last stride (a view where it can be)."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in DTYPES:
        raise ValueError(f"{name}: dtype {t.dtype} is not one of {DTYPES}")


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = x + delta (x itself when delta is None), y = rmsnorm(h) * weight, both
    [..., width]; h in x's dtype, y in x's and weight's promoted dtype."""
    width = x.shape[-1]
    _check_dtype("add_rms_norm x", x)
    if weight.shape != (width,):
        raise ValueError(f"add_rms_norm: weight shape {tuple(weight.shape)} != ({width},)")
    if width > MAX_NORM_WIDTH:
        raise ValueError(f"add_rms_norm: width {width} > {MAX_NORM_WIDTH}")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(f"add_rms_norm: delta {tuple(delta.shape)} {delta.dtype} does not match "
                         f"x {tuple(x.shape)} {x.dtype}")
    x2 = _rows(x)
    d2 = _rows(delta) if delta is not None else x2
    h = _output(x2.shape, x.dtype, x.device) if delta is not None else x2
    y = _output(x2.shape, torch.promote_types(x.dtype, weight.dtype), x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(width)
        _add_rms_norm_kernel[(x2.shape[0],)](
            x2, d2, h, weight, y, x2.stride(0), d2.stride(0), h.stride(0), y.stride(0), width, eps,
            HAS_DELTA=delta is not None, BLOCK=block, num_warps=min(8, max(1, block // 256)), **NO_FMA)
    return (h.view(x.shape) if delta is not None else x), y.view(x.shape)


def rope_to_cache(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, cos_table: torch.Tensor,
                  sin_table: torch.Tensor, positions: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """The rotary embedding and the KV write of one layer in one kernel.

    qkv [n, k, (hq + 2 hkv) * d]: the fused q/k/v GEMM's output; cos/sin_table
    [max_pos, d / 2] (half-width, float32); positions, blocks, offsets [n, k]: each row's
    rope position and its place in the cache (k/v_cache [num_blocks, hkv, block_size, d],
    as PagedKVCache lays them out). Writes rotated k and v at [block, :, offset]; returns
    rotated q, [n, k, hq, d], contiguous."""
    n, k, width = qkv.shape
    heads = num_q_heads + 2 * num_kv_heads
    d = width // heads
    _check_dtype("rope_to_cache qkv", qkv)
    if d * heads != width or d % 2:
        raise ValueError(f"rope_to_cache: width {width} is not {heads} heads of an even head dim")
    if k_cache.shape[1] != num_kv_heads or k_cache.shape[3] != d or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_to_cache: caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} do not hold "
                         f"{num_kv_heads} kv heads of {d}")
    if k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype:
        raise ValueError(f"rope_to_cache: cache dtype {k_cache.dtype} != qkv dtype {qkv.dtype}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_to_cache: the caches' head dim must be contiguous")
    if cos_table.shape[-1] != d // 2 or sin_table.shape != cos_table.shape:
        raise ValueError(f"rope_to_cache: tables {tuple(cos_table.shape)} are not half of head dim {d}")
    rows = _rows(qkv)
    q = _output((n, k, num_q_heads, d), qkv.dtype, qkv.device)
    if n * k:
        half = d // 2
        _rope_to_cache_kernel[(n * k, heads)](
            rows, cos_table, sin_table, positions.reshape(-1).contiguous(), blocks.reshape(-1).contiguous(),
            offsets.reshape(-1).contiguous(), q, k_cache, v_cache,
            rows.stride(0), cos_table.stride(0), sin_table.stride(0), num_q_heads * d,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            HQ=num_q_heads, HKV=num_kv_heads, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
            num_warps=1 if half <= 64 else 2, **NO_FMA)
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up from gate_up [..., 2 * width] (gate first, as the fused GEMM lays
    them): [..., width] in gate_up's dtype."""
    _check_dtype("silu_mul gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul: width {gate_up.shape[-1]} is not gate and up side by side")
    width = gate_up.shape[-1] // 2
    rows = _rows(gate_up)
    out = _output((rows.shape[0], width), gate_up.dtype, gate_up.device)
    if rows.shape[0] and width:
        _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, SILU_BLOCK))](
            rows, out, rows.stride(0), out.stride(0), width, BLOCK=SILU_BLOCK, num_warps=4, **NO_FMA)
    return out.view(*gate_up.shape[:-1], width)
