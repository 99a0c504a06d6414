"""On a GPU, over a shard server with `emit` set (as the scheduler actor runs the engine):
each tick's verdict rides on the next verify, and the shard queues that verify's forward
before it answers the verdict. Greedy output must still equal the target's own greedy
output, token for token, with the verify forward in CUDA graphs; with the Session stream
over the rank's session socket (blocking reads, and both sides busy-polling) and over gRPC."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.sampling_params import SamplingParams
from tandem.shard.factory import build_model_shard
from tandem.shard.local_group import LocalShardGroup

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class IdsTokenizer:
    """Enough of a tokenizer for an engine fed token ids."""

    chat_template = None

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return " ".join(str(i) for i in ids)


def prompts(count: int) -> list[list[int]]:
    """Repeating patterns, so n-gram lookup finds drafts."""
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(count):
        motif = torch.randint(0, 127, (3 + i % 4,), generator=g).tolist()
        out.append(motif * (2 + i % 3))
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("carrier, spin_us", [("socket", 0), ("socket", 20_000), ("grpc", 0)],
                         ids=["socket", "socket-polling", "grpc"])
def test_verdicts_riding_on_verifies_keep_greedy_output_exact_on_a_gpu(tiny_model_dir, in_process_launcher, batch, carrier,
                                                                      spin_us):
    config = EngineConfig(model=tiny_model_dir, device="cuda", drafter="ngram", max_num_seqs=8, max_model_len=96,
                          row_budget=64, num_speculative_tokens=4, adaptive=False)
    params = SamplingParams(max_tokens=40)
    plain = EngineConfig(model=tiny_model_dir, device="cuda", drafter="none", num_speculative_tokens=0,
                         max_num_seqs=8, max_model_len=96, row_budget=64)
    shard, _ = build_model_shard(plain.shard_spec(), progress=False)
    reference = Engine(LocalShardGroup(shard), IdsTokenizer(), (), plain).generate(prompts(batch), params)
    group = GrpcShardGroup(config.shard_spec(), in_process_launcher, deadline_s=30, session_socket=carrier == "socket",
                           session_spin_us=spin_us)
    assert group.session_transports == [carrier]
    emitted = []
    engine = Engine(group, IdsTokenizer(), (), config, sink=emitted.extend)
    try:
        ids = [engine.add_request(p, params) for p in prompts(batch)]
        while engine.has_unfinished():
            emitted.extend(engine.step())
    finally:
        engine.group.close()
    final = {o.request_id: o for o in emitted if o.finished}
    assert [final[i].token_ids for i in ids] == [r.token_ids for r in reference]
    assert sum(final[i].num_draft_tokens for i in ids) > 0, "no drafts: the verify path was not exercised"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("batch", [1, 8])
def test_an_in_process_rank_with_a_sink_keeps_greedy_output_exact_on_a_gpu(tiny_model_dir, batch):
    # the tick's outputs are built while the next verify's forward runs (tandem.shard.local_group)
    config = EngineConfig(model=tiny_model_dir, device="cuda", drafter="ngram", max_num_seqs=8, max_model_len=96,
                          row_budget=64, num_speculative_tokens=4, adaptive=False)
    params = SamplingParams(max_tokens=40)
    shard, _ = build_model_shard(config.shard_spec(), progress=False)
    group = LocalShardGroup(shard)
    assert shard.forward_is_async
    plain = dataclasses.replace(config, drafter="none", num_speculative_tokens=0)
    reference = Engine(group, IdsTokenizer(), (), plain).generate(prompts(batch), params)
    emitted, sent = [], [0]

    def sink(outs):
        sent[0] += 1
        emitted.extend(outs)

    engine = Engine(group, IdsTokenizer(), (), config, sink=sink)
    ids = [engine.add_request(p, params) for p in prompts(batch)]
    while engine.has_unfinished():
        emitted.extend(engine.step())
    final = {o.request_id: o for o in emitted if o.finished}
    assert [final[i].token_ids for i in ids] == [r.token_ids for r in reference]
    assert sent[0] > 3, "no held outputs left through the sink"
    assert sum(final[i].num_draft_tokens for i in ids) > 0
