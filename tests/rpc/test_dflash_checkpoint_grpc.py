"""A DFlash checkpoint named in the EngineConfig reaches a gRPC shard process: the shard
says it loaded that folder, drafts what an in-process drafter built from the same
folder drafts, and an engine over it keeps the greedy output exact."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from slot_blocks import prefill_item
from tandem.config import EngineConfig
from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, save_dflash_checkpoint
from tandem.drafters.factory import RankDrafterInfo, rank_drafter_info
from tandem.engine import Engine
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.rpc.launcher import ProcessLauncher
from tandem.sampling_params import SamplingParams
from tandem.shard.commands import GREEDY, ProposeBatch
from tandem.shard.factory import ShardSpec, build_model_shard
from tandem.shard.local_group import LocalShardGroup

VOCAB, BLOCK = 128, 5  # the tiny Llama of conftest.py: vocab 128, hidden 32, 2 layers
PROMPTS = [[5, 9, 17, 3, 44, 8], [100, 2, 2, 71], [12, 13, 14, 15, 16, 17, 18], [90, 1]]


def write_checkpoint(folder, seed: int) -> str:
    config = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          vocab_size=VOCAB, target_layer_ids=(0, 1), block_size=BLOCK, mask_token_id=VOCAB - 1,
                          num_target_layers=2, rope_theta=10000.0)
    model = DFlashDraftModel(config).init_weights(seed, std=0.3)
    save_dflash_checkpoint(model, str(folder), dtype=torch.float32)
    return str(folder)


def engine_config(model_dir: str, checkpoint: str, **over) -> EngineConfig:
    fields = dict(model=model_dir, drafter="dflash", dflash_checkpoint=checkpoint, max_num_seqs=4, max_model_len=64,
                  row_budget=32, device="cpu", dtype="float32", adaptive=False)
    return EngineConfig(**{**fields, **over})


def drafts_of(group) -> list[list[int]]:
    """Greedy drafts of every prompt after its prefill."""
    items = [prefill_item(slot, p) for slot, p in enumerate(PROMPTS)]
    last = group.prefill(items).next_tokens
    cmd = ProposeBatch(slots=list(range(len(PROMPTS))), last_tokens=last, positions=[len(p) for p in PROMPTS],
                       num_drafts=[BLOCK - 1] * len(PROMPTS), sampling=[GREEDY] * len(PROMPTS))
    return group.propose(cmd).drafts


def local_group(config: EngineConfig) -> LocalShardGroup:
    return LocalShardGroup(build_model_shard(config.shard_spec(), progress=False)[0])


class IdsTokenizer:
    chat_template = None

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return " ".join(str(i) for i in ids)


@pytest.fixture
def grpc_group():
    groups = []

    def start(config: EngineConfig) -> GrpcShardGroup:
        groups.append(GrpcShardGroup(config.shard_spec(), ProcessLauncher(1, threads_per_rank=1), deadline_s=60))
        return groups[-1]

    yield start
    for g in groups:
        g.close()


@pytest.mark.timeout(300)
def test_the_checkpoint_of_the_config_is_what_the_grpc_shard_loads_and_drafts_with(tiny_model_dir, tmp_path, grpc_group):
    ours = write_checkpoint(tmp_path / "ours", seed=1)
    config = engine_config(tiny_model_dir, ours)
    assert config.num_speculative_tokens == BLOCK - 1  # the checkpoint's block size set the default
    group = grpc_group(config)
    assert group.limits.drafter == "dflash"
    assert group.drafter_info == RankDrafterInfo("dflash", ours, BLOCK - 1)

    remote = drafts_of(group)
    assert remote == drafts_of(local_group(config))
    assert all(len(d) == BLOCK - 1 and all(0 <= t < VOCAB for t in d) for d in remote)
    # ... and another checkpoint would have drafted otherwise: the comparison can fail
    other = engine_config(tiny_model_dir, write_checkpoint(tmp_path / "other", seed=2))
    assert drafts_of(local_group(other)) != remote


@pytest.mark.timeout(300)
def test_an_engine_over_the_grpc_shard_drafts_from_the_checkpoint_and_stays_exact(tiny_model_dir, tmp_path, grpc_group):
    config = engine_config(tiny_model_dir, write_checkpoint(tmp_path / "ours", seed=1))
    params = SamplingParams(max_tokens=12)
    plain = replace(config, drafter="none")
    want = Engine(local_group(plain), IdsTokenizer(), (), plain)
    want_ids = [o.token_ids for o in want.generate(PROMPTS, params)]
    engine = Engine(grpc_group(config), IdsTokenizer(), (), config)
    outs = engine.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == want_ids
    assert sum(o.num_draft_tokens for o in outs) > 0


def test_other_ranks_report_no_drafter_and_a_draft_model_reports_its_spec():
    assert rank_drafter_info(ShardSpec(drafter="dflash"), None) == RankDrafterInfo()
    spec = ShardSpec(drafter="draft-model", draft_model="some/draft")
    assert rank_drafter_info(spec, object()) == RankDrafterInfo("draft-model", "some/draft", 0)


def test_the_group_warns_when_the_shards_checkpoint_drafts_fewer_than_configured(caplog):
    group = GrpcShardGroup.__new__(GrpcShardGroup)  # only what _check_drafter reads
    group.spec = ShardSpec(drafter="dflash", num_speculative_tokens=7)
    group.drafter_info = RankDrafterInfo("dflash", "/elsewhere/ckpt", 3)
    with caplog.at_level("WARNING", logger="tandem.rpc.group"):
        group._check_drafter()
    assert "drafts at most 3 tokens; num_speculative_tokens is 7" in caplog.text
