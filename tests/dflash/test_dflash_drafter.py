"""The DFlash drafter on a tiny random target, against a direct forward of the paper's maths.

The reference below recomputes a block from scratch the way the dflash package does it
(context and block keys concatenated, one rope over positions 0..P+B-1, no mask); the
drafter instead keeps context keys per slot, adds committed rows lazily, trims rejected
ones and pads a batch: after any history of verdicts its drafts must be the reference's.
"""
from __future__ import annotations

import pytest
import torch

from dflash_tiny import SLOTS, VOCAB, random_dflash, random_prompts, tiny_shard
from slot_blocks import BLOCK, pool_blocks, prefill_item, verify_batch
from tandem.model.kv_cache import fixed_tables
from tandem.shard.commands import GREEDY, ProposeBatch, SamplingSpec, Verdict
from tandem.verify.accept import accepted_prefix


def reference_drafts(draft, target, history: list[int], last: int) -> tuple[list[int], torch.Tensor]:
    """The block [last, mask...] at position P = len(history), from the target's rows of
    the history, computed in one plain pass; returns (drafts, logits [B-1, V])."""
    c = draft.config
    P, B = len(history), c.block_size
    with torch.no_grad():
        tables = fixed_tables(1, P + 1, BLOCK)
        out = target(torch.tensor([history]), torch.tensor([0], dtype=torch.int32), target.new_cache(tables.shape[1]),
                     tables, capture_layers=c.target_layer_ids)
        feats = torch.cat([out.hidden[i][0] for i in c.target_layer_ids], dim=-1)  # [P, nL*H]
        ctx = draft.hidden_norm(draft.fc(feats))  # [P, H]
        x = target.embed(torch.tensor([last] + [c.mask_token_id] * (B - 1)))  # [B, H]
        pos = torch.arange(P + B).float()
        freqs = pos[:, None] * draft.inv_freq[None]
        cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]

        def rope(t, cs, sn):
            half = t.shape[-1] // 2
            return t * cs + torch.cat([-t[..., half:], t[..., :half]], -1) * sn

        for layer in draft.layers:
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_norm(a.q_proj(h).view(B, c.num_heads, c.head_dim))
            k = a.k_norm(torch.cat([a.k_proj(ctx), a.k_proj(h)]).view(P + B, c.num_kv_heads, c.head_dim))
            v = torch.cat([a.v_proj(ctx), a.v_proj(h)]).view(P + B, c.num_kv_heads, c.head_dim)
            q, k = rope(q, cos[P:], sin[P:]), rope(k, cos, sin)
            g = c.num_heads // c.num_kv_heads
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / c.head_dim**0.5, dim=-1)
            x = x + a.o_proj(torch.einsum("hqk,khd->qhd", att, v).reshape(B, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = target.lm_head(draft.norm(x)[1:]).float()
    return logits.argmax(-1).tolist(), logits


def propose(shard, slots, last, num_drafts, sampling=None):
    cmd = ProposeBatch(slots=slots, last_tokens=[last[s] for s in slots], positions=[shard.lengths[s] for s in slots],
                       num_drafts=[num_drafts] * len(slots), sampling=sampling or [GREEDY] * len(slots))
    return shard.propose(cmd).drafts


def run_rounds(shard, prompts, rounds: int, num_drafts: int, forced_seed: int | None = None):
    """Prefill, then `rounds` of propose / verify / verdict for every slot at once: the
    greedy verdict, or with `forced_seed` a random accepted count (the rank commits what
    it is told; the drafter must keep exactly the committed rows either way).
    Returns each slot's committed history and its last (not yet committed) token."""
    g = torch.Generator().manual_seed(forced_seed or 0)
    slots = list(range(len(prompts)))
    res = shard.prefill([prefill_item(s, p) for s, p in zip(slots, prompts)])
    last = dict(zip(slots, res.next_tokens))
    history = {s: list(p) for s, p in zip(slots, prompts)}
    for r in range(rounds):
        drafts = propose(shard, slots, last, num_drafts)
        k = num_drafts + 1
        cmd = verify_batch(r + 1, len(slots), k, slots, [len(history[s]) for s in slots],
                           [t for s, d in zip(slots, drafts) for t in [last[s], *d]])
        picks = shard.verify(cmd).picks
        words = []
        for i, s in enumerate(slots):
            a = accepted_prefix(drafts[i], picks[i * k : (i + 1) * k])
            if forced_seed is not None:
                a = int(torch.randint(0, num_drafts + 1, (1,), generator=g))
            words.append(a + 1)
            history[s] += [last[s], *drafts[i][:a]]
            last[s] = picks[i * k + a]
        shard.commit(Verdict(batch_id=r + 1, words=words))
    return history, last


def test_a_fresh_prefill_drafts_what_the_direct_forward_drafts(target, draft):
    shard = tiny_shard(target, draft)
    prompts = random_prompts(3, seed=1)
    history, last = run_rounds(shard, prompts, rounds=0, num_drafts=5)
    for s, p in enumerate(prompts):
        want, _ = reference_drafts(draft, target, p, last[s])
        assert propose(shard, [s], last, 5)[0] == want


def test_after_verdicts_the_drafts_equal_the_direct_forward_over_the_committed_history(target):
    # Verdicts from none to all drafts accepted, so the drafter both keeps and trims rows.
    draft = random_dflash(seed=3)
    shard = tiny_shard(target, draft)
    prompts = random_prompts(5, seed=2)
    history, last = run_rounds(shard, prompts, rounds=6, num_drafts=5, forced_seed=11)
    for s in history:
        want, _ = reference_drafts(draft, target, history[s], last[s])
        assert propose(shard, [s], last, 5)[0] == want, f"slot {s} after {len(history[s])} tokens"


def test_the_batched_propose_gives_the_same_drafts_as_one_sequence_at_a_time(target, draft):
    shard = tiny_shard(target, draft)
    prompts = random_prompts(7, seed=4, low=2, high=60)
    _, last = run_rounds(shard, prompts, rounds=3, num_drafts=4, forced_seed=12)
    slots = list(range(len(prompts)))
    batched = propose(shard, slots, last, 5)
    alone = [propose(shard, [s], last, 5)[0] for s in slots]
    assert batched == alone
    # a different grouping and order, as the per-sequence fallback and chunking make them
    assert propose(shard, slots[::-2], last, 5) == [alone[s] for s in slots[::-2]]


def test_drafts_are_capped_by_the_block_and_by_what_was_asked(target, draft):
    shard = tiny_shard(target, draft)
    _, last = run_rounds(shard, random_prompts(2, seed=5), rounds=0, num_drafts=1)
    block = draft.config.block_size
    assert [len(d) for d in propose(shard, [0, 1], last, 2)] == [2, 2]
    assert [len(d) for d in propose(shard, [0, 1], last, 16)] == [block - 1] * 2
    full = propose(shard, [0], last, block - 1)[0]
    assert propose(shard, [0], last, 3)[0] == full[:3], "fewer drafts are a prefix of the full block's"


def test_sampled_drafts_come_with_their_q_rows_and_are_seeded(target, draft):
    shard = tiny_shard(target, draft)
    _, last = run_rounds(shard, random_prompts(2, seed=6), rounds=1, num_drafts=3)
    spec = SamplingSpec(temperature=0.9, top_p=0.95, seed=7)
    d1 = propose(shard, [0, 1], last, 4, [spec, GREEDY])
    q, _ = shard._drafts[0][1], shard._drafts[1][1]
    assert shard._drafts[1][1] is None, "a greedy sequence has no q"
    assert q.shape == (4, VOCAB) and torch.allclose(q.sum(-1), torch.ones(4), atol=1e-5)
    assert all(q[j, t] > 0 for j, t in enumerate(d1[0]))
    assert propose(shard, [0, 1], last, 4, [spec, GREEDY]) == d1, "the same seed draws the same drafts"


def test_a_re_prefill_and_a_release_forget_the_slot(target, draft):
    shard = tiny_shard(target, draft)
    prompts = random_prompts(2, seed=8)
    history, last = run_rounds(shard, prompts, rounds=2, num_drafts=4, forced_seed=13)
    shard.release([0])
    assert shard.drafter.length[0] == 0 and 0 not in shard.drafter.pending
    # a recovery re-prefills the slot with its whole history: the drafter starts over from it
    res = shard.prefill([prefill_item(1, history[1])])
    assert res.next_tokens == [last[1]]
    want, _ = reference_drafts(shard.drafter.model, target, history[1], last[1])
    assert propose(shard, [1], last, 5)[0] == want


def test_a_propose_for_a_slot_out_of_step_with_the_target_is_refused(target, draft):
    shard = tiny_shard(target, draft)
    run_rounds(shard, random_prompts(1, seed=9), rounds=0, num_drafts=1)
    with pytest.raises(RuntimeError, match="slot 0 holds target rows"):
        shard.drafter.propose([0], [[1, 2]], [3], [2], [GREEDY])


@pytest.mark.parametrize("slots", [[0], list(range(SLOTS))])
def test_a_drafter_of_a_different_width_than_the_target_is_refused(target, slots):
    from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, DFlashDrafter

    bad = DFlashConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16, intermediate_size=32,
                       vocab_size=VOCAB, target_layer_ids=(1,), block_size=4, mask_token_id=0)
    with pytest.raises(ValueError, match="hidden_size"):
        DFlashDrafter(DFlashDraftModel(bad), target, num_slots=len(slots), num_blocks=8, block_size=16, max_seq_len=32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_in_bf16_the_batched_propose_matches_one_at_a_time(target, draft):
    import copy

    gpu_target = copy.deepcopy(target).to("cuda", torch.bfloat16)
    gpu_draft = copy.deepcopy(draft).to("cuda", torch.bfloat16)
    from dflash_tiny import CONTEXT, ROW_BUDGET
    from tandem.drafters.dflash import DFlashDrafter
    from tandem.shard.model_shard import ModelShard

    cache = gpu_target.new_cache(pool_blocks(SLOTS), BLOCK)
    drafter = DFlashDrafter(gpu_draft, gpu_target, num_slots=SLOTS, num_blocks=pool_blocks(SLOTS), block_size=BLOCK,
                            max_seq_len=CONTEXT)
    shard = ModelShard(gpu_target, cache, num_slots=SLOTS, max_model_len=CONTEXT, row_budget=ROW_BUDGET, vocab_size=VOCAB,
                       drafter=drafter)
    prompts = random_prompts(6, seed=14)
    _, last = run_rounds(shard, prompts, rounds=3, num_drafts=5, forced_seed=15)
    slots = list(range(len(prompts)))
    batched = propose(shard, slots, last, 5)
    assert all(len(d) == 5 and all(0 <= t < VOCAB for t in d) for d in batched)
    alone = [propose(shard, [s], last, 5)[0] for s in slots]
    same = sum(a == b for a, b in zip(batched, alone))
    assert same >= len(slots) - 1, f"bf16 batched vs single drafts agree on only {same}/{len(slots)}"


# ---- the padded shapes of the CUDA-graph path ---------------------------------------------


@pytest.mark.parametrize("batch", [1, 3, SLOTS])
def test_the_padded_graph_shapes_draft_what_the_exact_shapes_draft(target, draft, batch):
    # On the CPU the graph path runs its padded static shapes without capture: the batch
    # padded to a power of two, the context to a bucket, flushes padded with scratch rows.
    eager, padded = tiny_shard(target, draft), tiny_shard(target, draft, cuda_graphs=True)
    assert padded.drafter.graphs is not None and eager.drafter.graphs is None
    prompts = random_prompts(batch, seed=30 + batch, low=2, high=70)
    h1, last1 = run_rounds(eager, prompts, rounds=4, num_drafts=5, forced_seed=31)
    h2, last2 = run_rounds(padded, prompts, rounds=4, num_drafts=5, forced_seed=31)
    assert (h1, last1) == (h2, last2)
    slots = list(range(batch))
    assert propose(padded, slots, last2, 5) == propose(eager, slots, last1, 5)
    assert padded.drafter.graphs, "no padded runner was used"
    # the scratch block took the padding rows; no real slot past its length was written
    for s in slots:
        n, table = padded.drafter.written[s], padded.drafter.tables[s]
        for k1, k2 in zip(eager.drafter.ctx_k, padded.drafter.ctx_k):
            rows1 = k1[table].transpose(0, 1).flatten(1, 2)  # [hkv, positions of the table, d]
            rows2 = k2[table].transpose(0, 1).flatten(1, 2)
            assert torch.allclose(rows1[:, :n], rows2[:, :n], atol=1e-5)  # flushes grouped differently round differently
            assert not rows2[:, n:].any(), f"slot {s} written past its {n} rows"


def test_the_block_launched_at_commit_drafts_what_a_fresh_propose_drafts_for_any_subset(target, draft, monkeypatch):
    # With graphs the block forward runs at commit, from the bonus tokens; a propose for
    # some of those slots, in any order, reads its rows instead of running again.
    prompts = random_prompts(4, seed=50, low=2, high=40)
    for subset in ([2, 0, 3], [1], [0, 1, 2, 3]):
        eager, padded = tiny_shard(target, draft), tiny_shard(target, draft, cuda_graphs=True)
        h1, last1 = run_rounds(eager, prompts, rounds=3, num_drafts=5, forced_seed=51)
        h2, last2 = run_rounds(padded, prompts, rounds=3, num_drafts=5, forced_seed=51)
        assert padded.drafter._ready is not None, "no block was launched at the last commit"
        calls = []
        block = padded.drafter._block
        monkeypatch.setattr(padded.drafter, "_block", lambda *a: calls.append(a) or block(*a))
        assert propose(padded, subset, last2, 5) == propose(eager, subset, last1, 5)
        assert calls == [], "the propose ran the block again"
    # any change of a slot's state drops the launched block
    run_rounds(padded, prompts, rounds=1, num_drafts=5, forced_seed=52)
    assert padded.drafter._ready is not None
    padded.release([1])
    assert padded.drafter._ready is None


def test_a_block_that_fails_at_commit_leaves_the_verdict_and_the_propose_runs_it(target, draft, monkeypatch):
    eager, padded = tiny_shard(target, draft), tiny_shard(target, draft, cuda_graphs=True)
    prompts = random_prompts(3, seed=60, low=2, high=30)
    h1, last1 = run_rounds(eager, prompts, rounds=2, num_drafts=5, forced_seed=61)
    block = padded.drafter._block
    calls = []

    def flaky(*a):  # the first round's propose runs the block, then its commit does: that one fails
        calls.append(a)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return block(*a)

    monkeypatch.setattr(padded.drafter, "_block", flaky)
    h2, last2 = run_rounds(padded, prompts, rounds=2, num_drafts=5, forced_seed=61)
    assert len(calls) >= 3 and (h1, last1) == (h2, last2)  # the second propose ran the block itself
    slots = [0, 1, 2]
    assert propose(padded, slots, last2, 5) == propose(eager, slots, last1, 5)


def _gpu_copy(target, draft, dtype):
    import copy

    return copy.deepcopy(target).to("cuda", dtype), copy.deepcopy(draft).to("cuda", dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_captured_graphs_draft_what_eager_drafts(target, draft):
    gt, gd = _gpu_copy(target, draft, torch.float32)
    eager, graphed = tiny_shard(gt, gd, cuda_graphs=False), tiny_shard(gt, gd, cuda_graphs=True)
    prompts = random_prompts(SLOTS, seed=40, low=2, high=90)
    h1, last1 = run_rounds(eager, prompts, rounds=5, num_drafts=5, forced_seed=41)
    h2, last2 = run_rounds(graphed, prompts, rounds=5, num_drafts=5, forced_seed=41)
    assert (h1, last1) == (h2, last2)
    assert any(g.graph is not None for g in graphed.drafter.graphs.values()), "nothing was captured"
    for slots in (list(range(SLOTS)), [3], [5, 1, 2]):
        a, b = propose(eager, slots, last1, 5), propose(graphed, slots, last2, 5)
        same = sum(x == y for x, y in zip(a, b))
        assert same >= len(slots) - (len(slots) > 1), f"graphs vs eager: {same}/{len(slots)} blocks agree"
