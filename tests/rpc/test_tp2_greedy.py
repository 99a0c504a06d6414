"""Two shard processes (tensor parallel 2 over gloo, driven over gRPC) decode greedily
exactly as one in-process rank does, with the scheduler's n-gram drafter and with the
rank-side draft-model drafter, at batch 1 and batch 8.

One TP2 group serves both drafters: it is built with the draft-model drafter on rank 0,
which the n-gram engine simply never asks to propose.
"""
from __future__ import annotations

import pytest
import torch

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.rpc.launcher import ProcessLauncher
from tandem.sampling_params import SamplingParams
from tandem.shard.factory import build_model_shard
from tandem.shard.local_group import LocalShardGroup

pytestmark = pytest.mark.slow

PROMPTS = [  # the first repeats itself, so the n-gram drafter drafts even at batch 1
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):",
    "List the days of the week: Monday, Tuesday,",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5, 6,",
    "The capital of France is",
    "Water boils at",
    "import numpy as np\nimport",
]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0)
CASES = [("ngram", 1), ("ngram", 8), ("draft-model", 1), ("draft-model", 8)]


def config(drafter: str) -> EngineConfig:
    # adaptive=False: a fixed gamma, so both groups see the same batches whatever their speed
    # float32: the exact path (tests/rpc/test_tp2_quantized_greedy.py runs the quantized one)
    return EngineConfig(drafter=drafter, draft_model="smollm2", max_num_seqs=8, max_model_len=128, row_budget=64,
                        num_speculative_tokens=4, adaptive=False, dtype="float32")


def run(group, model, drafter: str, batch: int):
    engine = Engine(group, model.tokenizer, model.eos_token_ids, config(drafter))
    outs = engine.generate(PROMPTS[:batch], PARAMS)
    assert all(o.finish_reason in ("length", "stop") for o in outs), [o.error for o in outs]
    drafted, accepted = sum(o.num_draft_tokens for o in outs), sum(o.num_accepted_tokens for o in outs)
    return [o.token_ids for o in outs], (drafted, accepted)


@pytest.fixture(scope="module")
def one_rank(default_model):
    """Every case on one in-process rank: (drafter, batch) -> (token ids, (drafted, accepted))."""
    shard, _ = build_model_shard(config("draft-model").shard_spec(), loaded=default_model, progress=False)
    group = LocalShardGroup(shard)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each shard rank runs; on a busy machine 2 threads can be far slower
    try:
        return {(d, b): run(group, default_model, d, b) for d, b in CASES}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tp2_group(one_rank):  # after the one-rank runs, so the two ranks get the cores to themselves
    group = GrpcShardGroup(config("draft-model").shard_spec(), ProcessLauncher(2, threads_per_rank=1), deadline_s=60)
    yield group
    group.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("drafter, batch", CASES)
def test_two_grpc_ranks_decode_greedily_token_for_token_like_one_rank(drafter, batch, one_rank, tp2_group, default_model):
    assert tp2_group.limits.world_size == 2
    ids, counts = run(tp2_group, default_model, drafter, batch)
    want, want_counts = one_rank[(drafter, batch)]
    assert ids == want
    assert counts == want_counts and counts[0] > 0, "the same drafts were verified (k > 1 rows) and accepted"


LOGPROB_PARAMS = SamplingParams(max_tokens=12, temperature=0.0, logprobs=5, prompt_logprobs=2)


def logprobs_of(group, model):
    engine = Engine(group, model.tokenizer, model.eos_token_ids, config("draft-model"))
    outs = engine.generate(PROMPTS[:2], LOGPROB_PARAMS)
    return [([(x.token_id, [t for t, _, _ in x.top]) for x in o.logprobs], [x.logprob for x in o.logprobs],
             [x.logprob for x in o.prompt_logprobs[1:]]) for o in outs]


@pytest.mark.timeout(600)
def test_two_grpc_ranks_return_the_logprobs_one_rank_does(tp2_group, default_model):
    shard, _ = build_model_shard(config("draft-model").shard_spec(), loaded=default_model, progress=False)
    want = logprobs_of(LocalShardGroup(shard), default_model)
    got = logprobs_of(tp2_group, default_model)
    for (ids, lps, prompt), (want_ids, want_lps, want_prompt) in zip(got, want):
        assert ids == want_ids
        assert lps == pytest.approx(want_lps, abs=1e-4) and prompt == pytest.approx(want_prompt, abs=1e-4)
