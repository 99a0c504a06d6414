"""The verify forward through VerifyGraphs: padding to a power-of-two batch and a block
table bucket gives the eager forward's logits and K/V; padding rows touch only the scratch
block. On the CPU the graphs run uncaptured on the same static buffers; with a GPU they are
captured."""
from __future__ import annotations

import pytest
import torch

from tandem.model.kv_cache import PagedKVCache
from tandem.model.loader import load_model
from tandem.model.verify_graphs import VerifyGraphs

K = 3
BLOCK = 4
CONTEXT = 64
# slot -> its blocks (shuffled, non-consecutive): CONTEXT positions each
TABLES = {s: [int(b) for b in t] for s, t in
          enumerate(torch.randperm(4 * CONTEXT // BLOCK, generator=torch.Generator().manual_seed(2)).view(4, -1))}


def _cache(model, device) -> PagedKVCache:
    c = model.config
    return PagedKVCache(c.num_layers, 4 * CONTEXT // BLOCK, BLOCK, c.num_kv_heads, c.head_dim, model.dtype, device,
                        scratch_blocks=1)


def _eager(model, cache, rows, slots, starts, device, **kw):
    tables = torch.tensor([TABLES[s] for s in slots], dtype=torch.int32, device=device)
    return model(rows.to(device), torch.tensor(starts, dtype=torch.int32, device=device), cache, tables, **kw)


def _prefilled(model, device):
    cache = _cache(model, device)
    gen = torch.Generator().manual_seed(3)
    prompts = {0: torch.randint(256, (9,), generator=gen), 2: torch.randint(256, (14,), generator=gen),
               3: torch.randint(256, (5,), generator=gen)}
    for slot, p in prompts.items():
        _eager(model, cache, p[None], [slot], [0], device)
    return cache, {slot: len(p) for slot, p in prompts.items()}


def _run_both(model, device, capture: bool):
    slots = [2, 0, 3]  # n=3: padded to 4
    rows = torch.randint(256, (3, K), generator=torch.Generator().manual_seed(5))
    eager_cache, lengths = _prefilled(model, device)
    starts = [lengths[s] for s in slots]
    eager = _eager(model, eager_cache, rows, slots, starts, device, capture_layers=(0,))
    graph_cache, _ = _prefilled(model, device)
    graphs = VerifyGraphs(model, graph_cache, CONTEXT, capture=capture)
    graphed = graphs.forward(rows.flatten().tolist(), 3, K, [TABLES[s] for s in slots], starts, (0,))
    return eager, eager_cache, graphed, graph_cache, graphs


def _check(eager, eager_cache, graphed, graph_cache, tol: float):
    assert graphed is not None and graphed.logits.shape == eager.logits.shape
    assert (graphed.logits - eager.logits).abs().max().item() <= tol * eager.logits.abs().max().item()
    assert torch.equal(graphed.logits.argmax(-1), eager.logits.argmax(-1))
    assert (graphed.hidden[0] - eager.hidden[0]).abs().max().item() <= tol * eager.hidden[0].abs().max().item() + 1e-6
    for layer in range(len(eager_cache.k)):  # every real block holds the same K/V as after the eager forward
        real = slice(0, eager_cache.num_blocks)
        assert (graph_cache.k[layer][real] - eager_cache.k[layer][real]).abs().max().item() <= tol * 10


def test_padded_verify_forward_equals_the_eager_one_and_pads_only_write_the_scratch_block(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    eager, eager_cache, graphed, graph_cache, graphs = _run_both(model, "cpu", capture=False)
    _check(eager, eager_cache, graphed, graph_cache, 1e-5)
    # batch 3 -> 4; the tables span the whole 64-position context
    assert list(graphs.graphs) == [(4, K, 64, (0,), False)]
    assert graph_cache.k[0][graph_cache.scratch_block].abs().sum() > 0  # the padding row wrote there


def test_batches_over_the_row_cap_are_left_to_the_eager_forward(tiny_model_dir):
    model = load_model(tiny_model_dir("llama"), progress=False).model
    graphs = VerifyGraphs(model, _cache(model, "cpu"), CONTEXT, max_rows=8, capture=False)
    assert graphs.forward([1] * 9, 3, 3, [TABLES[0], TABLES[1], TABLES[2]], [0, 0, 0], ()) is None  # 4 x 3 rows > 8
    assert not graphs.graphs


def test_verify_graphs_need_a_scratch_block(tiny_model_dir):
    model = load_model(tiny_model_dir("llama"), progress=False).model
    with pytest.raises(ValueError, match="scratch"):
        VerifyGraphs(model, model.new_cache(num_blocks=8, scratch_blocks=0), CONTEXT, capture=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_verify_graph_replays_the_eager_forward_on_the_gpu(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), dtype=torch.float32, device="cuda", progress=False).model
    eager, eager_cache, graphed, graph_cache, graphs = _run_both(model, "cuda", capture=True)
    _check(eager, eager_cache, graphed, graph_cache, 1e-4)
    assert all(g.graph is not None for g in graphs.graphs.values())


def test_capture_ahead_takes_every_decode_and_prefill_shape_within_the_budget_and_the_forward_reuses_them(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    cache, lengths = _prefilled(model, "cpu")
    graphs = VerifyGraphs(model, cache, CONTEXT, capture=False, max_rows=8)
    added = graphs.capture_ahead(max_batch=4, max_k=3, row_budget=6, capture_layers=(0,))
    # verifies: batches 1, 2, 4 x k 1..3, where the smallest batch padded to it fits the
    # budget and the padded rows fit max_rows; prefills: batches 1, 2, 4 x power-of-two
    # widths up to the budget's, within max_rows; the 64-position context is the one bucket
    verifies = {(nb, k, False) for nb in (1, 2, 4) for k in (1, 2, 3) if (nb // 2 + 1) * k <= 6 and nb * k <= 8}
    prefills = {(nb, k, True) for nb in (1, 2, 4) for k in (1, 2, 4, 8) if nb * k <= 8}
    assert added == len(verifies) + len(prefills)
    assert {(key[0], key[1], key[4]) for key in graphs.graphs} == verifies | prefills
    assert all(key[2:4] == (64, (0,)) for key in graphs.graphs)
    slots = [2, 0, 3]
    out = graphs.forward([1] * 3 * 2, 3, 2, [TABLES[s][:5] for s in slots], [lengths[s] for s in slots], (0,))
    assert out is not None and len(graphs.graphs) == added  # n=3 -> the (4, 2) graph
    out = graphs.forward([1] * 3 * 2, 3, 2, [TABLES[1][:1]] * 3, [0, 0, 0], (0,), last_rows=[1, 0, 1])
    assert out is not None and out.logits.shape[:2] == (3, 1) and len(graphs.graphs) == added  # the (4, 2) prefill


def test_a_prefill_graph_gives_each_prompts_last_row_logits(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    eager_cache, graph_cache = _cache(model, "cpu"), _cache(model, "cpu")
    rows = torch.randint(256, (3, 4), generator=torch.Generator().manual_seed(7))
    last = [3, 1, 2]  # prompts of 4, 2 and 3 tokens, padded to 4
    eager = _eager(model, eager_cache, rows, [0, 1, 2], [0, 0, 0], "cpu")
    graphs = VerifyGraphs(model, graph_cache, CONTEXT, capture=False)
    out = graphs.forward(rows.flatten().tolist(), 3, 4, [TABLES[s][:1] for s in range(3)], [0, 0, 0], (), last_rows=last)
    torch.testing.assert_close(out.logits[:, 0], eager.logits[torch.arange(3), torch.tensor(last)], rtol=1e-5, atol=1e-5)


def test_forwards_past_the_shortest_bucket_replay_the_deepest_graphs_captured_ahead(tiny_model_dir):
    """The rest of a prompt whose 300-token prefix the cache holds, and then a verify after
    it, reach the 512-position bucket, which has no graphs: the deepest bucket's graphs
    serve both (their tables padded further) with the eager forward's logits, and nothing
    is captured on live traffic."""
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    c = model.config

    def cache():
        return PagedKVCache(c.num_layers, 96, BLOCK, c.num_kv_heads, c.head_dim, model.dtype, "cpu", scratch_blocks=1)

    gen = torch.Generator().manual_seed(11)
    prefix, tail, verify = (torch.randint(256, (1, n), generator=gen) for n in (300, 3, 2))
    table = list(range(80))
    caches = cache(), cache()

    def eager(rows, start):
        return model(rows, torch.tensor([start], dtype=torch.int32), caches[0], torch.tensor([table], dtype=torch.int32))

    eager(prefix, 0)
    model(prefix, torch.tensor([0], dtype=torch.int32), caches[1], torch.tensor([table], dtype=torch.int32))
    graphs = VerifyGraphs(model, caches[1], 1024, capture=False, max_rows=8)
    added = graphs.capture_ahead(max_batch=2, max_k=2, row_budget=8, capture_layers=())
    assert {key[2] for key in graphs.graphs} == {256, 1024}  # every shape at the shortest and the deepest
    out = graphs.forward(tail[0].tolist() + [0], 1, 4, [table], [300], (), last_rows=[2])
    torch.testing.assert_close(out.logits[0, 0], eager(tail, 300).logits[0, -1], rtol=1e-5, atol=1e-5)
    out = graphs.forward(verify[0].tolist(), 1, 2, [table], [303], ())
    torch.testing.assert_close(out.logits[0], eager(verify, 303).logits[0], rtol=1e-5, atol=1e-5)
    assert len(graphs.graphs) == added
