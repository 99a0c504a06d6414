"""The fused CUDA kernels (tandem.model.fused_cuda) against the torch ops they replace, and
a CUDA model's forward with them against the one without.

Kernels run compiled on a CUDA GPU; without one, on CPU tensors in Triton's interpreter
(set up here before the kernels are decorated). Every output a kernel allocates starts
as NaN and the caches start as NaN: an element a kernel failed to write, or wrote where
it should not, fails the comparison. Sizes are no multiple of the kernels' blocks.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
if not CUDA and "tandem.model.fused_cuda" not in sys.modules:
    # read when the kernels are decorated and while the interpreter runs them; other test
    # modules' Triton kernels run on a GPU only, so the setting stays for the process
    os.environ["TRITON_INTERPRET"] = "1"
fused_cuda = pytest.importorskip("tandem.model.fused_cuda") if importlib.util.find_spec("triton") else None
if fused_cuda is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if not CUDA and type(fused_cuda._silu_mul_kernel).__name__ != "InterpretedFunction":
    pytest.skip("fused_cuda was imported compiled before this module, and there is no GPU", allow_module_level=True)

BF16, FP32 = torch.bfloat16, torch.float32
# The interpreter rounds float32 to bf16 toward zero (a GPU to nearest even): one bf16 step
# off, so bit-for-bit agreement with torch is asked of the compiled kernels only.
EXACT_BF16 = CUDA


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    def nan_filled(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(fused_cuda, "_output", nan_filled)


def assert_matches(ours: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert not ours.isnan().any(), "an element was left unwritten"
    if dtype == FP32:
        torch.testing.assert_close(ours, ref, rtol=2e-6, atol=2e-6)
    else:  # float32 maths may differ in a last bit, which moves a rare element by one bf16 step
        if EXACT_BF16:
            assert (ours == ref).float().mean().item() > 0.99
        steps = 1 if EXACT_BF16 else 3  # the interpreter's truncations add up, one per rounding
        torch.testing.assert_close(ours.float(), ref.float(), rtol=steps * 2**-7 + 1e-3, atol=steps * 1e-2)


def rms_norm_reference(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """llama.RMSNorm's rounding: normalised in float32, rounded to h's dtype, then scaled."""
    h32 = h.float()
    return (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("shape", [(3, 5, 100), (1, 1, 4096), (2, 7, 576)])
def test_add_rms_norm_is_the_add_then_the_norm(dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = (2 * torch.randn(shape, generator=g)).to(dtype).to(DEVICE)
    delta = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    weight = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(dtype).to(DEVICE)
    h, y = fused_cuda.add_rms_norm(x, delta, weight, 1e-5)
    if dtype == FP32 or EXACT_BF16:
        assert torch.equal(h, x + delta)  # one rounded add, as torch's
    assert_matches(h, x + delta, dtype)
    assert_matches(y, rms_norm_reference(x + delta, weight, 1e-5), dtype)
    same, y_only = fused_cuda.add_rms_norm(x, None, weight, 1e-6)
    assert same is x
    assert_matches(y_only, rms_norm_reference(x, weight, 1e-6), dtype)


def test_add_rms_norm_names_a_mismatched_weight():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight shape"):
        fused_cuda.add_rms_norm(x, x, torch.ones(9, device=DEVICE), 1e-5)


def rope_reference(qkv, hq, hkv, cos_t, sin_t, pos, blocks, offsets, k_cache, v_cache):
    """llama.Attention's torch ops: rotate q and k with full-width tables in qkv's dtype,
    then PagedKVCache.write."""
    n, k, width = qkv.shape
    d = width // (hq + 2 * hkv)
    cos = torch.cat([cos_t[pos]] * 2, dim=-1).to(qkv.dtype)[:, :, None]
    sin = torch.cat([sin_t[pos]] * 2, dim=-1).to(qkv.dtype)[:, :, None]
    qk = qkv[..., : (hq + hkv) * d].view(n, k, hq + hkv, d)
    half = d // 2
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    k_cache[blocks, :, offsets] = qk[:, :, hq:]
    v_cache[blocks, :, offsets] = qkv[..., (hq + hkv) * d :].view(n, k, hkv, d)
    return qk[:, :, :hq].contiguous()


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("n,k,hq,hkv,d,block_size", [(3, 5, 6, 2, 24, 4), (1, 1, 32, 8, 128, 16), (2, 3, 4, 4, 8, 8)])
def test_rope_to_cache_rotates_q_and_k_and_writes_k_and_v_where_the_rows_go(dtype, n, k, hq, hkv, d, block_size):
    g = torch.Generator().manual_seed(n * 100 + d)
    max_pos = 64
    angles = torch.rand(max_pos, d // 2, generator=g) * 6.3
    cos_t, sin_t = angles.cos().to(DEVICE), angles.sin().to(DEVICE)
    qkv = torch.randn(n, k, (hq + 2 * hkv) * d, generator=g).to(dtype).to(DEVICE)
    pos = torch.randint(0, max_pos, (n, k), generator=g).to(DEVICE)
    num_blocks = 2 * -(-n * k // block_size)
    slots = torch.randperm(num_blocks * block_size, generator=g)[: n * k].view(n, k).to(DEVICE)  # distinct places
    blocks, offsets = slots // block_size, slots % block_size
    shape = (num_blocks, hkv, block_size, d)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q = fused_cuda.rope_to_cache(qkv, hq, hkv, cos_t, sin_t, pos, blocks, offsets, k_cache, v_cache)
    q_ref = rope_reference(qkv, hq, hkv, cos_t, sin_t, pos, blocks, offsets, k_ref, v_ref)
    assert q.is_contiguous()
    assert_matches(q, q_ref, dtype)
    written = torch.zeros(num_blocks, block_size, dtype=torch.bool, device=DEVICE)
    written[blocks, offsets] = True
    for ours, ref in ((k_cache, k_ref), (v_cache, v_ref)):
        assert ours.isnan().permute(0, 2, 1, 3).all(-1).all(-1).equal(~written)  # every other place untouched
        rows, ref_rows = ours.permute(0, 2, 1, 3)[written], ref.permute(0, 2, 1, 3)[written]
        assert_matches(rows, ref_rows, dtype)
    assert torch.equal(v_cache.permute(0, 2, 1, 3)[written], v_ref.permute(0, 2, 1, 3)[written])  # v copied exactly


def test_rope_to_cache_names_a_cache_of_another_dtype():
    qkv = torch.randn(1, 1, 4 * 8, device=DEVICE)
    cache = torch.zeros(2, 1, 4, 8, dtype=BF16, device=DEVICE)
    table = torch.ones(16, 4, device=DEVICE)
    where = torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="cache dtype"):
        fused_cuda.rope_to_cache(qkv, 2, 1, table, table, where, where, where, cache, cache)


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("shape", [(3, 5, 2 * 300), (1, 1, 2 * 1500)])
def test_silu_mul_is_silu_of_the_gate_times_up(dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    gate_up = (3 * torch.randn(shape, generator=g)).to(dtype).to(DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_matches(fused_cuda.silu_mul(gate_up), F.silu(gate) * up, dtype)


# The model's forward with the kernels against the torch ops, on a GPU: tiny random models.

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
VARIANTS = ["llama", "qwen2-3kv-odd-mlp", "llama-tied-llama3-rope"]


def _greedy(model, fused: bool, prompts: torch.Tensor, steps: int, graphs_of=None, forced=None):
    """Prefill, then `steps` greedy decode steps (through VerifyGraphs when graphs_of gives
    them; with `forced` [n, steps + 1] tokens, those are fed instead of the argmax):
    (every step's logits [n, steps + 1, vocab], their argmax, the captured layer 0)."""
    from paged_slots import SlotTables

    model.fused_kernels = fused
    slots = SlotTables(model, num_slots=prompts.shape[0], positions=64)
    n, length = prompts.shape
    out = slots(model, prompts, list(range(n)), [0] * n, capture_layers=(0,))
    logits, hidden = [out.logits[:, -1]], [out.hidden[0][:, -1]]
    graphs = graphs_of(slots.cache) if graphs_of else None
    for step in range(steps):
        tokens = logits[-1].argmax(-1) if forced is None else forced[:, step].to(logits[-1].device)
        start = length + step
        if graphs is None:
            out = slots(model, tokens[:, None], list(range(n)), [start] * n, capture_layers=(0,))
        else:
            tables = [t.tolist() for t in slots.tables]
            out = graphs.forward(tokens.tolist(), n, 1, tables, [start] * n, (0,))
        # (a graph's outputs are its static buffers, overwritten by the next replay)
        logits.append(out.logits[:, 0].clone())
        hidden.append(out.hidden[0][:, 0].clone())
    logits = torch.stack(logits, 1)
    return logits, logits.argmax(-1), torch.stack(hidden, 1)


def _load(tiny_model_dir, variant, dtype=FP32):
    from tandem.model.loader import load_model

    return load_model(tiny_model_dir(variant), dtype=dtype, device="cuda", progress=False).model


@gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_fused_forward_gives_the_unfused_logits_and_greedy_tokens(variant, tiny_model_dir):
    model = _load(tiny_model_dir, variant)
    assert model.fused_kernels_for(torch.zeros(1, device="cuda")) is fused_cuda
    prompts = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(1))
    want, want_tokens, want_hidden = _greedy(model, False, prompts, steps=6)
    got, got_tokens, got_hidden = _greedy(model, True, prompts, steps=6)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    torch.testing.assert_close(got_hidden, want_hidden, rtol=1e-4, atol=1e-5)
    assert torch.equal(got_tokens, want_tokens)


@gpu
@pytest.mark.parametrize("variant", VARIANTS[:2])
def test_captured_graphs_of_the_fused_forward_give_the_unfused_eager_tokens(variant, tiny_model_dir):
    from tandem.model.verify_graphs import VerifyGraphs

    model = _load(tiny_model_dir, variant)
    prompts = torch.randint(0, 256, (3, 9), generator=torch.Generator().manual_seed(2))
    want, want_tokens, _ = _greedy(model, False, prompts, steps=6)
    made = []

    def graphs_of(cache):
        made.append(VerifyGraphs(model, cache, 64, capture=True))
        return made[-1]

    for fused in (True, False):
        got, got_tokens, _ = _greedy(model, fused, prompts, steps=6, graphs_of=graphs_of)
        assert all(g.graph is not None for g in made[-1].graphs.values()) and made[-1].graphs
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        assert torch.equal(got_tokens, want_tokens)


@gpu
def test_graphs_are_captured_again_when_the_kernel_choice_changes(tiny_model_dir):
    from tandem.model.verify_graphs import VerifyGraphs

    model = _load(tiny_model_dir, "llama")
    model.fused_kernels = True
    cache = model.new_cache(16, 4, scratch_blocks=1)
    graphs = VerifyGraphs(model, cache, 64, capture=True)
    fused = graphs.forward([5], 1, 1, [[0]], [0], ()).logits.clone()
    first = weakref.ref(next(iter(graphs.graphs.values())))  # held weakly: the old graphs are freed
    model.fused_kernels = False
    plain = graphs.forward([5], 1, 1, [[0]], [0], ()).logits
    gc.collect()
    assert len(graphs.graphs) == 1 and first() is None
    assert next(iter(graphs.graphs.values())).graph is not None
    torch.testing.assert_close(plain, fused, rtol=1e-4, atol=1e-4 * fused.abs().max().item())


@gpu
def test_bf16_fused_forward_stays_within_bf16_rounding_of_the_unfused_one(tiny_model_dir):
    model = _load(tiny_model_dir, "llama", dtype=BF16)
    prompts = torch.randint(0, 256, (4, 13), generator=torch.Generator().manual_seed(3))
    want, want_tokens, want_hidden = _greedy(model, False, prompts, steps=3)
    # the same tokens in: a near tie the two roundings break apart would change the context
    got, _, got_hidden = _greedy(model, True, prompts, steps=3, forced=want_tokens)
    scale = want_hidden.float().abs().max().item()
    assert (got_hidden.float() - want_hidden.float()).abs().max().item() <= 0.02 * scale
    assert (got - want).abs().max().item() <= 0.02 * want.abs().max().item()


def test_a_cpu_forward_never_takes_the_kernels(tiny_model_dir):
    from tandem.model.loader import load_model

    model = load_model(tiny_model_dir("llama"), progress=False).model
    assert model.fused_kernels and model.fused_kernels_for(torch.zeros(1)) is None
