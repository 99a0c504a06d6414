"""Two gloo ranks of a sharded model give the logits of the unsharded one.

Tolerance: max |2 ranks - 1 rank| <= REL_TOL * max |1-rank logit| (float32; only the order
of the partial sums differs). Measured: tiny models up to 7e-7 relative, SmolLM2 1.7e-6
(5.7e-5 absolute on logits of magnitude ~33); REL_TOL = 1e-5 leaves a margin of about 6x.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

import tp_worker
from tandem.model.loader import load_model
from tandem.model.tensor_parallel import kv_heads_for_rank, shard_model, split_range

REL_TOL = 1e-5
# Uneven splits over 2 ranks: kv heads 2 + 1, MLP columns 66 + 65, q/k/v bias; o_proj bias
# (added on rank 0 only); and the real default model with its 3 kv heads.
TINY_TP_VARIANTS = ("qwen2-3kv-odd-mlp", "llama-linear-rope-attention-bias")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_logits(tiny_model_dir, smollm2, tmp_path_factory):
    """Runs every model once over 2 spawned gloo ranks; name -> (rank 0 logits, rank 1 logits)."""
    folders = {variant: tiny_model_dir(variant) for variant in TINY_TP_VARIANTS}
    folders["smollm2"] = smollm2.path
    out_dir = tmp_path_factory.mktemp("tp")
    mp.spawn(tp_worker.worker, args=(2, free_port(), folders, str(out_dir)), nprocs=2, join=True)
    return {name: tuple(torch.load(out_dir / f"{name}-rank{rank}.pt") for rank in (0, 1)) for name in folders}


def assert_same_as_one_rank(name: str, one_rank: torch.Tensor, two_rank_logits) -> None:
    rank0, rank1 = two_rank_logits[name]
    assert torch.equal(rank0, rank1), "the replicated head gives every rank the same logits"
    diff, scale = (rank0 - one_rank).abs().max().item(), one_rank.abs().max().item()
    assert diff <= REL_TOL * scale, f"{name}: max diff {diff:.3g} > {REL_TOL} * logit scale {scale:.3g}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", TINY_TP_VARIANTS)
def test_two_ranks_of_a_tiny_model_match_one_rank(variant, tiny_model_dir, two_rank_logits):
    one_rank = tp_worker.run_script(load_model(tiny_model_dir(variant), progress=False).model)
    assert_same_as_one_rank(variant, one_rank, two_rank_logits)


@pytest.mark.timeout(240)
def test_two_ranks_of_smollm2_with_3_kv_heads_match_one_rank(smollm2, two_rank_logits):
    assert_same_as_one_rank("smollm2", tp_worker.run_script(smollm2.model), two_rank_logits)


def test_uneven_splits_give_the_first_ranks_one_more():
    assert [kv_heads_for_rank(3, rank, 2) for rank in (0, 1)] == [range(0, 2), range(2, 3)]
    assert [split_range(131, rank, 2) for rank in (0, 1)] == [range(0, 66), range(66, 131)]
    assert [len(split_range(10, rank, 4)) for rank in range(4)] == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="some rank would get none"):
        kv_heads_for_rank(3, 0, 4)


def test_world_size_1_leaves_the_model_untouched(tiny_model_dir):
    model = load_model(tiny_model_dir("qwen2"), progress=False).model
    before = {name: p.clone() for name, p in model.state_dict().items()}
    shard_model(model, rank=0, world_size=1)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())
