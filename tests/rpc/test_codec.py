"""The codec maps every command and result onto shard.proto and back unchanged, and the
committed stubs are what protoc makes of the proto."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.drafters.factory import RankDrafterInfo
from tandem.errors import ShapeError
from tandem.rpc import codec
from tandem.rpc.generated import shard_pb2 as pb
from tandem.shard.commands import (
    GREEDY,
    DraftGrammar,
    LogitRules,
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    RowLogprobs,
    SamplingSpec,
    ShardLimits,
    Verdict,
    VerifyBatch,
    VerifyResult,
    failed_verdict,
)
from tandem.shard.factory import ShardSpec

SAMPLED = SamplingSpec(temperature=0.7, top_p=0.9, top_k=50, seed=(1 << 63) - 5)
RULED = SamplingSpec(min_p=0.05, rules=LogitRules(prompt_len=17, presence_penalty=-0.5, frequency_penalty=1.25,
                                                  repetition_penalty=1.1, logit_bias=((3, -100.0), (49151, 2.5)),
                                                  min_tokens=4, min_tokens_ids=(2, 49152)))


def through_the_wire(msg):
    """Serialize and parse again, as a message crossing gRPC would be."""
    return type(msg).FromString(msg.SerializeToString())


@pytest.mark.parametrize(
    "value, encode, decode",
    [
        (ShardSpec(), codec.encode_spec, codec.decode_spec),
        (ShardSpec(model="some/model", dtype="bfloat16", device="cuda:1", num_slots=3, max_model_len=99, row_budget=17,
                   drafter="draft-model", draft_model="smollm2", num_speculative_tokens=6), codec.encode_spec, codec.decode_spec),
        (ShardSpec(drafter="dflash", dflash_checkpoint="/ckpt/dflash-smollm2", num_speculative_tokens=7),
         codec.encode_spec, codec.decode_spec),
        (ShardSpec(max_model_len=None, block_size=32, kv_cache_memory_gb=0.1, gpu_memory_utilization=0.85),
         codec.encode_spec, codec.decode_spec),
        (ShardSpec(max_model_len=4096, block_size=1, kv_cache_memory_gb=24.0, gpu_memory_utilization=0.5),
         codec.encode_spec, codec.decode_spec),
        (RankDrafterInfo("dflash", "/ckpt/dflash-smollm2", 7), codec.encode_drafter_info, codec.decode_drafter_info),
        (RankDrafterInfo(), codec.encode_drafter_info, codec.decode_drafter_info),
        (ShardLimits(num_slots=8, max_model_len=256, row_budget=64, vocab_size=49152, world_size=2, drafter="dflash",
                     propose_batch_max=16, num_blocks=(1 << 20) + 3, block_size=32), codec.encode_limits, codec.decode_limits),
        ([PrefillItem(3, [1, 2, 3], blocks=[7]), PrefillItem(0, [49151], SAMPLED, blocks=[0])],
         codec.encode_prefill, codec.decode_prefill),
        ([PrefillItem(1, list(range(40)), blocks=[9, 2, (1 << 20) + 1], cached_len=32), PrefillItem(2, [5, 6], blocks=[4, 3], grammar_mask=b"\x01\x00\x00\x80")],
         codec.encode_prefill, codec.decode_prefill),
        (PrefillResult(next_tokens=[5, 0, 49151]), codec.encode_prefill_result, codec.decode_prefill_result),
        ([PrefillItem(2, [5, 6], RULED, blocks=[4])], codec.encode_prefill, codec.decode_prefill),
        # logprobs: asked with top 0 and top 20, a prompt scored with the token after its chunk, or not
        ([PrefillItem(2, [5, 6], replace(SAMPLED, logprobs=0), blocks=[4], prompt_logprobs=20, next_token=0),
          PrefillItem(1, [7], replace(GREEDY, logprobs=20), blocks=[3], prompt_logprobs=0, next_token=49151),
          PrefillItem(0, [8], blocks=[2])], codec.encode_prefill, codec.decode_prefill),
        (PrefillResult(next_tokens=[5, 6], logprobs=[RowLogprobs([-0.5], [5, 9], [-0.5, -1.5]), RowLogprobs()],
                       prompt_logprobs=[RowLogprobs(), RowLogprobs([-0.25, -2.0])]),
         codec.encode_prefill_result, codec.decode_prefill_result),
        (VerifyResult(batch_id=9, picks=[7, 8, 9, 10], accept_probs=[1.0, 0.0, 0.5, 0.25],
                      logprobs=[RowLogprobs([-1.0, -0.5], [7, 1, 8, 2], [-1.0, -2.0, -0.5, -3.0], [-1.0]), RowLogprobs()]),
         codec.encode_verify_result, codec.decode_verify_result),
        (VerifyBatch(batch_id=3, n=2, k=2, slots=[0, 1], start_pos=[4, 4], tokens=[1, 2, 3, 4],
                     sampling=[GREEDY, replace(SAMPLED, rules=LogitRules(prompt_len=3))], block_tables=[[0], [1]]),
         codec.encode_verify, codec.decode_verify),
        (VerifyBatch(batch_id=(1 << 40) + 7, n=2, k=3, slots=[4, 1], start_pos=[10, 0], tokens=[1, 2, 3, 4, 5, 6],
                     sampling=[GREEDY, SAMPLED], block_tables=[[8], [3]]), codec.encode_verify, codec.decode_verify),
        (VerifyBatch(batch_id=3, n=2, k=1, slots=[0, 1], start_pos=[5, 6], tokens=[1, 2], sampling=[GREEDY, SAMPLED],
                     block_tables=[[1], [2]], grammar_masks=[b"", bytes(range(8))]), codec.encode_verify, codec.decode_verify),
        (VerifyBatch(batch_id=2, n=3, k=2, slots=[0, 2, 1], start_pos=[40, 14, 0], tokens=[1, 2, 3, 4, 5, 6],
                     sampling=[GREEDY] * 3, block_tables=[[5, 1, 9], [2, 0], [(1 << 20) + 2]]),
         codec.encode_verify, codec.decode_verify),
        (VerifyResult(batch_id=9, picks=[7, 8, 9, 10], accept_probs=[1.0, 0.0, 0.5, 0.25]),
         codec.encode_verify_result, codec.decode_verify_result),
        # prompt chunks riding on a verify, and their picks coming back with its result
        (VerifyBatch(batch_id=4, n=1, k=2, slots=[0], start_pos=[6], tokens=[1, 2], sampling=[GREEDY], block_tables=[[0]],
                     prefill=[PrefillItem(2, list(range(40)), SAMPLED, blocks=[3, 4, 5], cached_len=32),
                              PrefillItem(1, [5, 6], blocks=[7], grammar_mask=b"\x01\x00\x00\x80")]),
         codec.encode_verify, codec.decode_verify),
        (VerifyResult(batch_id=4, picks=[7, 8], accept_probs=[1.0, 0.0], prefill=PrefillResult(next_tokens=[9, 49151])),
         codec.encode_verify_result, codec.decode_verify_result),
        (VerifyResult(batch_id=4, picks=[], accept_probs=[], prefill=PrefillResult(next_tokens=[])),
         codec.encode_verify_result, codec.decode_verify_result),
        (Verdict(batch_id=9, words=[1, 4, 2]), codec.encode_verdict, codec.decode_verdict),
        (ProposeBatch(slots=[2, 0], last_tokens=[11, 12], positions=[30, 4], num_drafts=[4, 0], sampling=[SAMPLED, GREEDY]),
         codec.encode_propose, codec.decode_propose),
        (ProposeBatch(slots=[2, 0], last_tokens=[11, 12], positions=[30, 4], num_drafts=[4, 2], sampling=[SAMPLED, GREEDY],
                      grammars=[None, DraftGrammar("json", '{"type": "object"}', 17)]),
         codec.encode_propose, codec.decode_propose),
        (ProposeResult(drafts=[[1, 2, 3], [], [4]]), codec.encode_propose_result, codec.decode_propose_result),
        ([5, 0, 2], codec.encode_release, codec.decode_release),
    ],
    ids=lambda v: type(v).__name__ if not callable(v) else "",
)
def test_every_message_survives_a_round_trip_unchanged(value, encode, decode):
    assert decode(through_the_wire(encode(value))) == value


def test_logprobs_whose_top_lists_do_not_fit_their_rows_are_refused():
    bad = pb.RowLogprobs(chosen=[-1.0, -2.0], top_ids=[1, 2, 3], top_logprobs=[-1.0, -2.0, -3.0])
    with pytest.raises(ShapeError, match="logprobs"):
        codec.decode_row_logprobs(through_the_wire(bad))


def test_sampling_floats_travel_exactly_and_the_seed_modulo_2_64():
    odd = SamplingSpec(temperature=0.123456789012345, top_p=0.987654321, top_k=3, seed=-1)
    back = codec.decode_sampling(through_the_wire(codec.encode_sampling(odd)))
    assert (back.temperature, back.top_p, back.top_k) == (odd.temperature, odd.top_p, odd.top_k)
    assert back.seed == (1 << 64) - 1  # what the counter-based sampler makes of -1 anyway


def test_the_failed_verdict_is_n_zero_words_and_reads_back_as_failed():
    msg = through_the_wire(codec.encode_verdict(failed_verdict(42, 3)))
    assert (msg.batch_id, list(msg.words)) == (42, [0, 0, 0])
    back = codec.decode_verdict(msg)
    assert back.failed and back == Verdict(42, [0, 0, 0])
    assert not codec.decode_verdict(through_the_wire(codec.encode_verdict(Verdict(42, [0, 1, 0])))).failed


def test_token_lists_are_packed_so_a_verify_of_8_by_5_stays_small():
    cmd = VerifyBatch(batch_id=123456, n=8, k=5, slots=list(range(8)), start_pos=[500] * 8,
                      tokens=[49000 + i for i in range(40)], sampling=[SamplingSpec(seed=(1 << 62) + i) for i in range(8)])
    assert len(codec.encode_verify(cmd).SerializeToString()) < 260
    # the block tables are packed too: 8 tables of 32 blocks each add about 2 bytes a block
    tables = [list(range(s * 32, s * 32 + 32)) for s in range(8)]
    assert len(codec.encode_verify(replace(cmd, block_tables=tables)).SerializeToString()) < 260 + 2 * 256 + 16
    res = VerifyResult(batch_id=123456, picks=[49000] * 40, accept_probs=[1.0] * 40)
    assert len(codec.encode_verify_result(res).SerializeToString()) < 300


def test_an_all_greedy_verify_sends_no_sampling_specs_and_reads_back_as_n_greedy_ones():
    greedy = VerifyBatch(batch_id=1, n=3, k=2, slots=[0, 1, 2], start_pos=[4, 4, 4], tokens=[1] * 6, sampling=[GREEDY] * 3,
                         block_tables=[[0], [1], [2]])
    msg = through_the_wire(codec.encode_verify(greedy))
    assert len(msg.sampling) == 0
    assert codec.decode_verify(msg) == greedy
    mixed = VerifyBatch(batch_id=1, n=2, k=1, slots=[0, 1], start_pos=[4, 4], tokens=[1, 2], sampling=[GREEDY, SAMPLED],
                        block_tables=[[0], [1]])
    assert len(through_the_wire(codec.encode_verify(mixed)).sampling) == 2
    # a greedy sequence with logit rules is no plain greedy one: its spec travels
    ruled = replace(greedy, sampling=[GREEDY, RULED, GREEDY])
    assert codec.decode_verify(through_the_wire(codec.encode_verify(ruled))) == ruled


def test_verify_block_tables_keep_their_order_and_counts_that_do_not_cover_the_blocks_are_refused():
    cmd = VerifyBatch(batch_id=3, n=2, k=1, slots=[0, 1], start_pos=[20, 3], tokens=[1, 2], sampling=[GREEDY] * 2,
                      block_tables=[[6, 2], [4]])
    msg = through_the_wire(codec.encode_verify(cmd))
    assert (list(msg.blocks), list(msg.block_counts)) == ([6, 2, 4], [2, 1])
    for blocks, counts in [([6, 2, 4], [2, 2]), ([6, 2, 4], [2]), ([6, 2], [3, -1])]:
        del msg.blocks[:], msg.block_counts[:]
        msg.blocks.extend(blocks)
        msg.block_counts.extend(counts)
        with pytest.raises(ShapeError) as info:
            codec.decode_verify(msg)
        assert info.value.rule == "verify block tables", (blocks, counts)


def test_a_prefix_cache_hit_travels_as_its_cached_length_and_none_as_zero():
    msg = through_the_wire(codec.encode_prefill([PrefillItem(0, [1] * 20, blocks=[3, 4], cached_len=16),
                                                 PrefillItem(1, [2] * 5, blocks=[5])]))
    assert [(list(it.blocks), it.cached_len) for it in msg.items] == [([3, 4], 16), ([5], 0)]


def test_a_propose_result_whose_counts_do_not_cover_its_tokens_is_refused():
    with pytest.raises(ValueError, match="counts"):
        codec.decode_propose_result(pb.ProposeResult(tokens=[1, 2, 3], counts=[1, 1]))


def test_the_committed_stubs_are_what_the_proto_generates():
    pytest.importorskip("grpc_tools")
    from tandem.rpc import regen

    assert regen.main(["--check"]) == 0


def test_an_unset_checkpoint_stays_unset_and_an_old_reply_reads_as_no_drafter():
    assert not codec.encode_spec(ShardSpec(drafter="dflash")).HasField("dflash_checkpoint")
    # an unset context and KV budget stay unset: the rank works them out from the model and its memory
    unset = through_the_wire(codec.encode_spec(ShardSpec(max_model_len=None, kv_cache_memory_gb=None)))
    assert not unset.HasField("max_model_len") and not unset.HasField("kv_cache_memory_gb")
    back = codec.decode_spec(unset)
    assert back.max_model_len is None and back.kv_cache_memory_gb is None
    assert codec.decode_drafter_info(pb.InitReply().drafter) == RankDrafterInfo()
