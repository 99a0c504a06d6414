"""The Triton kernel of paged attention against `paged_attention_reference`, the definition.

Runs on a CUDA GPU. Without one it is skipped, unless TANDEM_TRITON_INTERPRET_TEST=1 asks
for Triton's interpreter on CPU tensors (a smaller set of shapes: the interpreter is slow).
Every table carries garbage past the blocks its sequence uses (block ids far outside the
pool): a kernel that read one would fault or fail the comparison.
"""
from __future__ import annotations

import os
import zlib

import pytest
import torch

INTERPRET = os.environ.get("TANDEM_TRITON_INTERPRET_TEST") == "1"
if INTERPRET:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated
elif not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (or TANDEM_TRITON_INTERPRET_TEST=1 for the interpreter)", allow_module_level=True)

pytest.importorskip("triton")

from tandem.model.paged_attention import paged_attention_reference  # noqa: E402
from tandem.model.paged_attention_triton import (  # noqa: E402
    MAX_SPLITS,
    choose_num_splits,
    paged_attention_triton,
    paged_attention_with_splits,
)

DEVICE = "cpu" if INTERPRET else "cuda"
GARBAGE_BLOCK = 1 << 30  # far past any pool: reading it faults (GPU) or fails
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
TOLERANCE = {BF16: 2e-2, FP16: 1e-2, FP32: 1e-4}

# (n, k, hq, hkv, d, block_size, dtype, longest cached prefix)
GPU_CASES = [
    (1, 1, 32, 8, 128, 16, BF16, 8192),  # Llama-3.1-8B decode at batch 1
    (32, 1, 32, 8, 128, 16, BF16, 4096),
    (4, 4, 32, 8, 128, 16, BF16, 1000),
    (9, 9, 9, 3, 64, 16, BF16, 700),  # SmolLM2-135M: g = 3, d = 64
    (17, 17, 12, 2, 128, 32, BF16, 900),  # Qwen2.5-1.5B: g = 6
    (64, 5, 32, 8, 128, 16, BF16, 600),  # n x k verify
    (256, 1, 32, 8, 128, 16, BF16, 300),
    (300, 1, 8, 8, 64, 16, BF16, 200),  # MHA
    (64, 4, 9, 3, 64, 32, FP16, 400),
    (2, 9, 16, 2, 128, 8, BF16, 500),  # g = 8, block_size 8
    (3, 5, 8, 4, 128, 64, BF16, 800),
    (5, 3, 8, 2, 64, 128, BF16, 900),
    (4, 2, 8, 2, 128, 4, FP16, 100),
    (1, 300, 32, 8, 128, 16, BF16, 1500),  # a prefill chunk after a cached prefix
    (2, 512, 9, 3, 64, 16, BF16, 700),
    (4, 64, 12, 2, 128, 16, BF16, 2000),
    (9, 17, 8, 8, 128, 32, FP32, 600),
    (17, 4, 9, 3, 64, 16, FP32, 500),
    (1, 300, 12, 2, 128, 32, FP32, 400),
    (4, 3, 4, 2, 8, 16, FP32, 60),  # the tests' tiny models: heads of 8 (padded to tl.dot's 16)
    (3, 5, 4, 2, 8, 16, BF16, 90),
]
INTERPRET_CASES = [
    (1, 1, 8, 2, 64, 16, FP32, 200),
    (3, 4, 6, 2, 64, 16, BF16, 90),
    (2, 9, 4, 4, 64, 32, FP32, 100),
    (2, 17, 9, 3, 64, 16, FP32, 70),
    (1, 1, 4, 1, 128, 8, BF16, 150),
    (1, 64, 4, 2, 64, 16, BF16, 40),
    (1, 300, 2, 1, 64, 32, FP32, 50),
    (3, 5, 4, 2, 64, 4, FP32, 60),
    (2, 3, 4, 1, 64, 128, BF16, 300),
]
CASES = INTERPRET_CASES if INTERPRET else GPU_CASES


def _case_id(case) -> str:
    n, k, hq, hkv, d, bs, dtype, ctx = case
    return f"n{n}-k{k}-h{hq}x{hkv}-d{d}-bs{bs}-{str(dtype).split('.')[-1]}-c{ctx}"


def random_starts(n, k, block_size, longest, gen):
    """Start positions with the longest prefix, 0 and block edges among them, shuffled."""
    picks = torch.tensor([longest, 0, block_size - 1, block_size, max(0, longest - 1)])[: min(n, 5)]
    start = torch.randint(0, longest + 1, (n,), generator=gen)
    start[: len(picks)] = picks.clamp(max=longest)
    return start[torch.randperm(n, generator=gen)].to(torch.int32)


def random_tables(start, k, block_size, max_blocks, num_blocks, gen):
    """Each sequence's blocks drawn from a shuffled pool (non-contiguous, none shared),
    garbage past them; and a clean copy for the reference, which gathers every row's table
    up to the longest context."""
    used = (start.long() + k + block_size - 1) // block_size
    assert int(used.max()) <= max_blocks and int(used.sum()) < num_blocks
    pool = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(start), max_blocks), GARBAGE_BLOCK, dtype=torch.int32)
    taken = 0
    for i, u in enumerate(used.tolist()):
        tables[i, :u] = pool[taken : taken + u]
        taken += u
    return tables, torch.where(tables == GARBAGE_BLOCK, pool[-1], tables)


def make_inputs(n, k, hq, hkv, d, block_size, dtype, longest, seed, spare_blocks=3):
    """Random q and caches, start positions, the kernel's tables and the clean copy."""
    gen = torch.Generator().manual_seed(seed)
    start = random_starts(n, k, block_size, longest, gen)
    max_blocks = (longest + k + block_size - 1) // block_size + spare_blocks
    num_blocks = n * max_blocks + 1
    tables, clean = random_tables(start, k, block_size, max_blocks, num_blocks, gen)
    q = torch.randn(n, k, hq, d, generator=gen).to(dtype)
    k_cache = torch.randn(num_blocks, hkv, block_size, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, hkv, block_size, d, generator=gen).to(dtype)
    return [t.to(DEVICE) for t in (q, k_cache, v_cache, tables, clean, start)]


def reference(q, k_cache, v_cache, clean_tables, start):
    """The definition in float64, so the comparison measures the kernel alone."""
    out = paged_attention_reference(q.double(), k_cache.double(), v_cache.double(), clean_tables, start)
    return out.to(q.device)


def assert_matches(out, ref, dtype, what):
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = (out.double() - ref).abs()
    tol = TOLERANCE[dtype]
    used = (err / (tol + tol * ref.abs())).max().item()  # assert_close's bound: atol + rtol * |ref|
    print(f"{what}: max abs error {err.max().item():.2e}, {used:.0%} of the tolerance ({tol:.0e} abs + rel)")
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def poison_allocator():
    """Leaves NaNs in the memory the next allocations reuse (CUDA), so rows the kernel
    forgets to write fail the comparison instead of reading as zeros."""
    if DEVICE == "cuda":
        torch.full((64 << 20,), float("nan"), device=DEVICE)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_the_reference(case):
    n, k, hq, hkv, d, bs, dtype, longest = case
    q, k_cache, v_cache, tables, clean, start = make_inputs(*case, seed=zlib.crc32(_case_id(case).encode()))
    ref = reference(q, k_cache, v_cache, clean, start)
    poison_allocator()
    out = paged_attention_triton(q, k_cache, v_cache, tables, start)
    assert_matches(out, ref, dtype, _case_id(case))
    # forced split counts: split boundaries inside blocks, splits with nothing to do
    for splits in (1, 3) if INTERPRET else (1, 3, 7, 64):
        poison_allocator()
        out = paged_attention_with_splits(q, k_cache, v_cache, tables, start, splits)
        assert_matches(out, ref, dtype, f"{_case_id(case)} splits={splits}")


def test_every_row_at_position_zero():
    """start_pos 0 everywhere: the first row sees only itself."""
    q, k_cache, v_cache, tables, clean, start = make_inputs(3, 4, 8, 2, 64, 16, FP32, 0, seed=5)
    start.zero_()
    ref = reference(q, k_cache, v_cache, clean, start)
    for splits in (1, 4):
        out = paged_attention_with_splits(q, k_cache, v_cache, tables, start, splits)
        assert_matches(out, ref, FP32, f"start 0, splits={splits}")


def test_split_count_follows_shapes():
    """Many splits where few programs would leave SMs idle, none once they fill the
    device, never more than the table's width holds."""
    assert choose_num_splits(8, 8192, 132) == 33  # batch 1, 8 kv heads: 2 programs an SM
    assert choose_num_splits(32 * 8, 8192, 132) == 1
    assert choose_num_splits(8, 64, 132) == 1  # a 64-token table
    for programs in (1, 8, 64, 131, 132, 4096):
        for tokens in (16, 128, 1024, 1 << 20):
            assert 1 <= choose_num_splits(programs, tokens, 132) <= MAX_SPLITS


@pytest.mark.skipif(INTERPRET, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("n, k", [(1, 1), (4, 5), (64, 5), (2, 100)])
def test_cuda_graph_replays_with_new_positions_and_tables(n, k):
    """Captured once, replayed with new start positions, table contents and queries (the
    same shapes): each replay matches the reference."""
    hq, hkv, d, bs, longest = 32, 8, 128, 16, 3000
    q, k_cache, v_cache, tables, clean, start = make_inputs(n, k, hq, hkv, d, bs, BF16, longest, seed=1)
    paged_attention_triton(q, k_cache, v_cache, tables, start)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(q, k_cache, v_cache, tables, start)
    for seed in (2, 3, 4):
        gen = torch.Generator().manual_seed(seed)
        new_start = random_starts(n, k, bs, longest - 700 * seed, gen)  # a new longest too
        new_tables, new_clean = random_tables(new_start, k, bs, tables.shape[1], k_cache.shape[0], gen)
        start.copy_(new_start)
        tables.copy_(new_tables)
        q.copy_(torch.randn(q.shape, generator=gen).to(q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(q, k_cache, v_cache, new_clean.to(DEVICE), start)
        assert_matches(out, ref, BF16, f"graph n{n} k{k} replay {seed}")
