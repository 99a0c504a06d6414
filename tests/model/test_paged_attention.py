"""Paged attention: the reference against a naive per-row loop, the CPU kernel against the
reference, the kernel's input checks, and the dispatch."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from tandem.model import paged_attention as pa
from tandem.model import paged_attention_cpu as cpu
from tandem.model.paged_attention import paged_attention, paged_attention_reference


@pytest.fixture(scope="session")
def kernel():
    """The CPU kernel, built once for the test session (a first build takes about 20 s on 2 cores)."""
    op = cpu.load_kernel()
    assert op is not None, f"the CPU kernel did not build: {cpu._state.get('error')}"
    return cpu.paged_attention_cpu


def make_case(n, k, hq, hkv, d, bs, starts, dtype=torch.float32, seed=0, spare_blocks=3, tail=None):
    """Random inputs; every sequence's blocks at shuffled places of the pool, its table one
    entry longer than it needs. tail: what the unused entries hold (default: valid ids)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.tensor(starts, dtype=torch.int32)
    used = [-(-(s + k) // bs) for s in starts]
    max_blocks = max(used) + 1
    num_blocks = sum(used) + spare_blocks
    k_cache = torch.randn(num_blocks, hkv, bs, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, hkv, bs, d, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (n, max_blocks), generator=gen, dtype=torch.int32)
    at = 0
    for i, u in enumerate(used):
        tables[i, :u] = order[at : at + u].to(torch.int32)
        if tail is not None:
            tables[i, u:] = tail
        at += u
    q = torch.randn(n, k, hq, d, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, start


def naive_attention(q, k_cache, v_cache, tables, start):
    """Each row alone: its positions' keys looked up one by one, softmax, weighted sum."""
    n, k, hq, d = q.shape
    hkv, bs = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for i in range(n):
        for r in range(k):
            last = int(start[i]) + r
            for h in range(hq):
                kvh = h // (hq // hkv)
                keys = torch.stack([k_cache[tables[i, t // bs], kvh, t % bs] for t in range(last + 1)])
                values = torch.stack([v_cache[tables[i, t // bs], kvh, t % bs] for t in range(last + 1)])
                weights = torch.softmax(keys @ q[i, r, h] / math.sqrt(d), dim=0)
                out[i, r, h] = weights @ values
    return out


def test_reference_equals_a_naive_loop():
    for args in [(2, 3, 4, 2, 8, 5, [0, 7]), (1, 1, 3, 3, 16, 4, [9]), (3, 2, 6, 1, 8, 3, [2, 0, 5])]:
        case = make_case(*args)
        torch.testing.assert_close(paged_attention_reference(*case), naive_attention(*case), atol=1e-5, rtol=1e-5)


# (n, k, hq, hkv, d, block_size, start positions): decode and verify rows, GQA and MHA,
# d 64 / 128 / others, block sizes 16, odd and 1, contexts from 0 across block boundaries
SHAPES = [
    (1, 1, 9, 3, 64, 16, [0]),
    (3, 1, 9, 3, 64, 16, [15, 16, 40]),
    (2, 1, 12, 2, 128, 16, [20, 70]),
    (4, 3, 9, 3, 64, 16, [0, 13, 31, 100]),
    (2, 8, 12, 2, 128, 16, [5, 77]),
    (3, 17, 12, 2, 128, 5, [0, 3, 62]),
    (2, 17, 9, 3, 64, 16, [30, 1]),
    (2, 5, 32, 8, 128, 16, [47, 200]),
    (3, 3, 4, 4, 64, 5, [4, 9, 21]),  # MHA
    (2, 8, 4, 4, 128, 7, [0, 33]),
    (2, 17, 6, 6, 64, 16, [16, 50]),
    (2, 2, 9, 3, 64, 1, [0, 19]),
    (2, 3, 4, 2, 80, 16, [3, 40]),  # a head dim without its own instantiation
    (2, 4, 8, 2, 32, 3, [10, 2]),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}k{}h{}-{}d{}bs{}".format(*s[:6]))
def test_kernel_equals_reference_float32(kernel, shape):
    case = make_case(*shape, seed=len(SHAPES) + shape[1])
    torch.testing.assert_close(kernel(*case), paged_attention_reference(*case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[4], SHAPES[7]], ids=["gqa64", "gqa128-bs5", "mha"])
def test_kernel_equals_reference_half_precision(kernel, shape, dtype):
    q, k_cache, v_cache, tables, start = make_case(*shape, dtype=dtype)
    got = kernel(q, k_cache, v_cache, tables, start)
    assert got.dtype == dtype
    # against the definition in float32 on the same rounded inputs: only the output's rounding differs
    want = paged_attention_reference(q.float(), k_cache.float(), v_cache.float(), tables, start)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("threads", [1, 2])
def test_long_contexts_split_across_threads(kernel, threads):
    """Few sequences over long contexts: the kernel cuts each context in pieces and merges them."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in [(1, 1, 9, 3, 64, 16, [3000]), (1, 5, 12, 2, 128, 16, [1500]), (2, 17, 9, 3, 64, 16, [900, 5])]:
            case = make_case(*shape)
            torch.testing.assert_close(kernel(*case), paged_attention_reference(*case), atol=1e-5, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3, 64), (12, 2, 128), (4, 4, 48)], ids=["gqa64", "gqa128", "mha-d48"])
def test_a_rows_output_is_bitwise_the_same_alone_or_beside_others(kernel, heads, dtype):
    """A verify's k rows and k one-row decodes (the same cache) agree bit for bit, across key
    chunk edges and every row tiling: what keeps greedy speculation exact on the CPU."""
    hq, hkv, d = heads
    for starts, k in [([3], 5), ([30], 2), ([35, 60], 5), ([100], 17), ([7, 0, 64], 3), ([20], 40)]:
        q, k_cache, v_cache, tables, start = make_case(len(starts), k, hq, hkv, d, 16, starts, dtype=dtype, seed=k)
        together = kernel(q, k_cache, v_cache, tables, start)
        for r in range(k):
            alone = kernel(q[:, r : r + 1], k_cache, v_cache, tables, start + r)
            assert torch.equal(alone[:, 0], together[:, r]), (starts, k, r)


def test_prefill_chunk_of_many_rows(kernel):
    """More rows than one tile: the rows are cut into tiles that each read only their keys."""
    case = make_case(2, 70, 12, 2, 64, 16, [0, 45])
    torch.testing.assert_close(kernel(*case), paged_attention_reference(*case), atol=1e-5, rtol=1e-5)


def test_unused_table_entries_are_never_read(kernel):
    """Entries past a sequence's blocks may hold anything, even ids outside the pool."""
    for garbage in (-1, 1 << 30):
        q, k_cache, v_cache, tables, start = make_case(3, 3, 9, 3, 64, 16, [2, 40, 17], tail=garbage)
        clean = tables.clone()
        clean[clean == garbage] = 0  # the reference gathers up to the longest sequence's blocks
        torch.testing.assert_close(kernel(q, k_cache, v_cache, tables, start),
                                   paged_attention_reference(q, k_cache, v_cache, clean, start), atol=1e-5, rtol=1e-5)


def test_non_contiguous_query_and_table(kernel):
    q, k_cache, v_cache, tables, start = make_case(2, 3, 9, 3, 64, 16, [10, 30])
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    wide = torch.zeros(2, 2 * tables.shape[1], dtype=torch.int32)
    wide[:, ::2] = tables
    torch.testing.assert_close(kernel(q_strided, k_cache, v_cache, wide[:, ::2], start),
                               paged_attention_reference(q, k_cache, v_cache, tables, start), atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise(kernel):
    q, k_cache, v_cache, tables, start = make_case(2, 3, 9, 3, 64, 16, [10, 30])
    short = tables[:, :2].clone()  # sequence 1 needs 3 blocks
    with pytest.raises(RuntimeError, match="needs 3 blocks"):
        kernel(q, k_cache, v_cache, short, start)
    for bad in (-1, k_cache.shape[0]):
        wrong = tables.clone()
        wrong[1, 2] = bad  # a block sequence 1 reads
        with pytest.raises(RuntimeError, match="outside the pool"):
            kernel(q, k_cache, v_cache, wrong, start)
    with pytest.raises(RuntimeError, match="negative"):
        kernel(q, k_cache, v_cache, tables, torch.tensor([-1, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="int32"):
        kernel(q, k_cache, v_cache, tables.long(), start)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernel(q.double(), k_cache, v_cache, tables, start)
    with pytest.raises(RuntimeError, match="no multiple"):
        kernel(q[:, :, :8], k_cache, v_cache, tables, start)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel(q, k_cache.transpose(1, 2).contiguous().transpose(1, 2), v_cache, tables, start)


def test_empty_batch(kernel):
    q, k_cache, v_cache, tables, start = make_case(1, 1, 9, 3, 64, 16, [4])
    out = kernel(q[:0], k_cache, v_cache, tables[:0], start[:0])
    assert out.shape == (0, 1, 9, 64)


def test_dispatch_takes_the_kernel_on_the_cpu(kernel, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu, "paged_attention_cpu", lambda *a: calls.append(1) or kernel(*a))
    case = make_case(2, 3, 9, 3, 64, 16, [10, 30])
    torch.testing.assert_close(paged_attention(*case), paged_attention_reference(*case), atol=1e-5, rtol=1e-5)
    assert calls == [1]
    monkeypatch.setenv("TANDEM_PAGED_ATTENTION", "reference")
    paged_attention(*case)
    assert calls == [1]
    monkeypatch.delenv("TANDEM_PAGED_ATTENTION")
    q = case[0].clone().requires_grad_()
    paged_attention(q, *case[1:]).sum().backward()  # autograd: the reference
    assert calls == [1] and q.grad is not None


def test_an_unbuildable_kernel_warns_once_and_falls_back(monkeypatch, caplog):
    from torch.utils import cpp_extension

    def no_ninja(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpu, "_state", {})
    monkeypatch.setattr(cpp_extension, "load", no_ninja)
    case = make_case(1, 1, 9, 3, 64, 16, [5])
    with caplog.at_level(logging.WARNING, logger=cpu.__name__):
        for _ in range(2):
            torch.testing.assert_close(pa.paged_attention(*case), paged_attention_reference(*case))
    warnings = [r.getMessage() for r in caplog.records if "could not be built" in r.getMessage()]
    assert len(warnings) == 1 and "Ninja is required" in warnings[0]


def test_extension_name_follows_the_cpu(monkeypatch):
    name = cpu.extension_name()
    monkeypatch.setattr(cpu, "cpu_flags", lambda: "x86_64 sse2 avx2")
    assert cpu.extension_name() != name and cpu.extension_name().startswith("tandem_paged_attention_cpu_")
