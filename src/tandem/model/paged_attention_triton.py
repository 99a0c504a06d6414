"""The CUDA kernel of `paged_attention` (semantics: paged_attention.py's docstring), in Triton.

Tiling. A program owns one (sequence, kv head) pair, a tile of BLOCK_M folded query rows
and one split of the context. The g query heads that share a kv head are folded into the
row dim, row m = r * g + j for query row r and group member j, so every K/V tile is read
once for all of them and the rows of one position stay together (a prefill chunk's causal
mask is then a per-row position compare). Rows past g * k are padding (tl.dot wants
M >= 16) and are never stored. The program walks its context in tiles of BLOCK_N
positions, each gathered through the block table (position t is row t % block_size of
block block_tables[i, t // block_size]), with an online softmax in fp32.

Splits (flash-decoding). With few (sequence, kv head, row tile) triples, e.g. decode at
batch 1 with 8 kv heads, the context of each is cut into `num_splits` parts, each written
as a partial (row max, row sum, unnormalised accumulator) to an fp32 workspace, and a
second kernel merges them, one folded row a program, every split's partial loaded at once.
The split count comes from shapes alone (choose_num_splits): none once the triples fill
every SM, else about two programs an SM, at most 64 and no more than the table's width
holds 128-token parts. Each program divides its own context, read from start_pos on the
device, evenly among the splits, so short and long contexts alike use every split.
Without splits the first kernel writes the output directly.

Workspace. Allocated inside the call from shapes only, and only when splitting:
n * hkv * num_splits * g * k * (d + 2) fp32 values (about 1 MB at batch 1 with
Llama-3.1-8B's heads, 33 splits, k = 1).

CUDA graphs. No host syncs and no value-dependent shapes: the grid depends on (n, k,
heads, max_blocks) only, and the workspace is allocated from those shapes inside the call
(under capture it comes from the graph's pool). Triton compiles on the first call of a
configuration, so run it once before capturing.

Supported: q fp16/bf16/fp32 with a unit last stride; block_size any power of two up to 256
(tested: 4 to 128);
head dim up to 256 (a power of two is fastest; others are masked); hq a multiple of hkv.
fp32 inputs use IEEE fp32 dot products (no tf32); fp16/bf16 ones multiply in their dtype
(the probabilities rounded to it for P @ V, as flash attention does) and accumulate in fp32.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

# Programs to aim for per SM when choosing splits: enough in flight to hide memory latency.
PROGRAMS_PER_SM = 2
MAX_SPLITS = 64
SPLIT_TILE, MIN_TILES_PER_SPLIT = 64, 2  # no more splits than 128-token parts of the table
SMS_WITHOUT_CUDA = 132  # the interpreter has no device: plan as on an H200
# Triton's interpreter (numpy) multiplies bf16 tiles wrongly: there every dot runs in fp32.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attend_split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, start_ptr, out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    stride_qn, stride_qr, stride_qh,
    stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt,
    stride_tn,
    stride_on, stride_or, stride_oh,
    num_rows, max_blocks, num_splits, qk_scale,
    HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pair = tl.program_id(0)  # sequence * HKV + kv head
    m_tile = tl.program_id(1)
    split = tl.program_id(2)
    seq = pair // HKV
    kv_head = pair % HKV
    rows_total = num_rows * GROUP

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < rows_total
    row = tl.minimum(offs_m, rows_total - 1)  # padding rows copy the last real row: no NaN
    q_row = row // GROUP
    q_head = kv_head * GROUP + row % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM

    start = tl.load(start_ptr + seq)
    pos = start + q_row  # each row attends to positions 0..pos
    last_row = tl.minimum(m_tile * BLOCK_M + BLOCK_M, rows_total) - 1
    ctx_end = tl.minimum(start + last_row // GROUP + 1, max_blocks * BLOCK_SIZE)
    num_tiles = tl.cdiv(ctx_end, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    q_ptrs = q_ptr + seq * stride_qn + q_row[:, None] * stride_qr + q_head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_tn
    for tile in range(tile_lo, tile_hi):
        offs_t = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        t_valid = offs_t < ctx_end  # never reads a table entry past the blocks in use
        block = tl.load(table + offs_t // BLOCK_SIZE, mask=t_valid, other=0).to(tl.int64)
        slot = offs_t % BLOCK_SIZE
        k_rows = k_ptr + block * stride_kb + kv_head * stride_kh + slot * stride_kt
        v_rows = v_ptr + block * stride_vb + kv_head * stride_vh + slot * stride_vt
        keys_t = tl.load(k_rows[None, :] + offs_d[:, None], mask=t_valid[None, :] & d_valid[:, None], other=0.0)
        values = tl.load(v_rows[:, None] + offs_d[None, :], mask=t_valid[:, None] & d_valid[None, :], other=0.0)
        if FP32_DOT:
            scores = tl.dot(q.to(tl.float32), keys_t.to(tl.float32), input_precision="ieee")
        else:
            scores = tl.dot(q, keys_t)
        scores = tl.where(offs_t[None, :] <= pos[:, None], scores * qk_scale, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # a row that has seen nothing yet (a later split of a prefill chunk) keeps max -inf
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp2(scores - safe_max[:, None])
        rescale = tl.exp2(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        if FP32_DOT:
            acc = acc * rescale[:, None] + tl.dot(probs, values.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * rescale[:, None] + tl.dot(probs.to(values.dtype), values)
        row_max = new_max

    if SPLIT:
        part = (pair.to(tl.int64) * num_splits + split) * rows_total + offs_m
        tl.store(part_max_ptr + part, row_max, mask=row_valid)
        tl.store(part_sum_ptr + part, row_sum, mask=row_valid)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None] & d_valid[None, :])
    else:
        out = acc / row_sum[:, None]
        o_ptrs = out_ptr + seq * stride_on + q_row[:, None] * stride_or + q_head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])


@triton.jit
def _merge_splits_kernel(
    part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr,
    stride_on, stride_or, stride_oh,
    num_rows, num_splits,
    HKV: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Merges the splits' partials of one folded row of one (sequence, kv head): every
    split's partial loaded at once (one round trip, not one a split)."""
    row = tl.program_id(0)
    pair = tl.program_id(1)
    seq = pair // HKV
    kv_head = pair % HKV
    rows_total = num_rows * GROUP
    offs_s = tl.arange(0, SPLITS_PAD)
    s_valid = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM

    part = (pair.to(tl.int64) * num_splits + offs_s) * rows_total + row
    part_max = tl.load(part_max_ptr + part, mask=s_valid, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + part, mask=s_valid, other=0.0)
    part_acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
                       mask=s_valid[:, None] & d_valid[None, :], other=0.0)
    total_max = tl.max(part_max, 0)  # finite: the first split holds position 0
    scale = tl.exp2(part_max - total_max)  # 0 for splits that saw nothing
    total_sum = tl.sum(part_sum * scale, 0)
    out = tl.sum(part_acc * scale[:, None], 0) / total_sum

    q_row = row // GROUP
    q_head = kv_head * GROUP + row % GROUP
    o_ptrs = out_ptr + seq * stride_on + q_row * stride_or + q_head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_valid)


@functools.lru_cache(maxsize=None)
def device_sm_count(device_index: int | None) -> int:
    if device_index is None:
        return SMS_WITHOUT_CUDA
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(programs: int, table_tokens: int, sm_count: int) -> int:
    """How many parts each (sequence, kv head, row tile) cuts its context into, from shapes
    only (a captured graph keeps its launch): none once the `programs` unsplit fill every
    SM; else enough for PROGRAMS_PER_SM on each, no more than the table's width holds
    parts of MIN_TILES_PER_SPLIT tiles."""
    if programs >= sm_count:
        return 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * sm_count, programs)
    widest = max(1, triton.cdiv(table_tokens, SPLIT_TILE * MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, widest, MAX_SPLITS))


class LaunchPlan:
    """Tiles, split count and launch settings of one call, from its shapes (measured on an
    H200 with Llama-3.1-8B's heads: bench/paged_attention_gpu.py)."""

    def __init__(self, n: int, rows_total: int, hkv: int, head_dim: int, dtype: torch.dtype,
                 table_tokens: int, sm_count: int, num_splits: int | None = None):
        self.block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot wants K >= 16: smaller heads are masked
        # one tile for decode and verify (g * k <= 64), 64-row tiles for prefill chunks
        self.block_m = min(max(16, triton.next_power_of_2(rows_total)), 64)
        self.m_tiles = triton.cdiv(rows_total, self.block_m)
        self.num_splits = num_splits or choose_num_splits(n * hkv * self.m_tiles, table_tokens, sm_count)
        if self.block_d * torch.finfo(dtype).bits // 8 > 256:  # K rows over 256 bytes (fp32 with d > 64, or d > 128)
            self.block_n = 32
        elif self.num_splits == 1 and self.block_m <= 32:
            self.block_n = 128  # few rows, a whole context each: half the loop's trips
        else:
            self.block_n = 64  # prefill tiles keep the scores in registers; splits stay short
        self.num_warps = 4
        self.num_stages = 2


def _check(q, k_cache, v_cache, block_tables, start_pos) -> None:
    n, k, hq, d = q.shape
    num_blocks, hkv, block_size, d_cache = k_cache.shape
    assert v_cache.shape == k_cache.shape and d_cache == d, "k/v caches must be [num_blocks, hkv, block_size, d]"
    assert hq % hkv == 0, f"hq={hq} is not a multiple of hkv={hkv}"
    assert block_size & (block_size - 1) == 0 and block_size <= 256, f"block_size {block_size}: a power of two <= 256"
    assert d <= 256, f"head dim {d} > 256"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32) and k_cache.dtype == v_cache.dtype == q.dtype
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "the head dim must be contiguous"
    assert block_tables.dtype == torch.int32 and block_tables.shape[0] == n and block_tables.stride(-1) == 1
    assert start_pos.dtype == torch.int32 and start_pos.shape == (n,) and start_pos.is_contiguous()


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, start_pos: torch.Tensor) -> torch.Tensor:
    """`paged_attention` on CUDA tensors (paged_attention.py has the semantics); the split
    count is chosen from the shapes and the device."""
    return paged_attention_with_splits(q, k_cache, v_cache, block_tables, start_pos, None)


def paged_attention_with_splits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, start_pos: torch.Tensor,
                                num_splits: int | None) -> torch.Tensor:
    """The kernels with the split count given (None: chosen from shapes; 1: no workspace,
    no merge)."""
    _check(q, k_cache, v_cache, block_tables, start_pos)
    n, k, hq, d = q.shape
    hkv, block_size = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    rows_total = k * group
    device_index = (q.device.index if q.device.index is not None else torch.cuda.current_device()) if q.is_cuda else None
    plan = LaunchPlan(n, rows_total, hkv, d, q.dtype, block_tables.shape[1] * block_size, device_sm_count(device_index),
                      num_splits)
    num_splits = plan.num_splits
    out = torch.empty_like(q)
    split = num_splits > 1
    if split:  # fp32 partials, from shapes only
        part_acc = torch.empty((n * hkv, num_splits, rows_total, d), dtype=torch.float32, device=q.device)
        part_max = torch.empty((n * hkv, num_splits, rows_total), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused
    qk_scale = 1.0 / math.sqrt(d) * math.log2(math.e)  # exp2 in the kernel
    _attend_split_kernel[(n * hkv, plan.m_tiles, num_splits)](
        q, k_cache, v_cache, block_tables, start_pos, out, part_acc, part_max, part_sum,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        k, block_tables.shape[1], num_splits, qk_scale,
        HKV=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=plan.block_d, BLOCK_SIZE=block_size,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, SPLIT=split, FP32_DOT=q.dtype == torch.float32 or INTERPRETED,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if split:
        _merge_splits_kernel[(rows_total, n * hkv)](
            part_acc, part_max, part_sum, out,
            out.stride(0), out.stride(1), out.stride(2),
            k, num_splits,
            HKV=hkv, GROUP=group, HEAD_DIM=d, BLOCK_D=plan.block_d, SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
        )
    return out
