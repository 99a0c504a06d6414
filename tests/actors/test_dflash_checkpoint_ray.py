"""A DFlash checkpoint named by a relative path reaches a shard actor (whose cwd is not
the driver's): the config makes it absolute, Init carries it, the actor loads it."""
from __future__ import annotations

import os

import pytest
import torch

from slot_blocks import prefill_item
from tandem.config import EngineConfig
from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, save_dflash_checkpoint
from tandem.drafters.factory import RankDrafterInfo
from tandem.shard.commands import GREEDY, ProposeBatch
from tandem.shard.factory import build_model_shard
from tandem.shard.local_group import LocalShardGroup

PROMPT = [5, 9, 17, 3, 44, 8]


def tiny_llama(folder) -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return str(folder)


def tiny_dflash(folder) -> str:
    config = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          vocab_size=128, target_layer_ids=(0, 1), block_size=5, mask_token_id=127, num_target_layers=2)
    save_dflash_checkpoint(DFlashDraftModel(config).init_weights(1, std=0.3), str(folder), dtype=torch.float32)
    return str(folder)


def drafts_of(group) -> list[int]:
    last = group.prefill([prefill_item(0, PROMPT)]).next_tokens
    return group.propose(ProposeBatch(slots=[0], last_tokens=last, positions=[len(PROMPT)], num_drafts=[4],
                                      sampling=[GREEDY])).drafts[0]


def ray_cwd() -> str:
    """Where a Ray worker runs: not where the test chdir'd to."""
    import ray

    return ray.get(ray.remote(lambda: os.getcwd()).remote())


@pytest.mark.timeout(300)
def test_a_relative_checkpoint_reaches_the_shard_actor(ray_cluster, tmp_path, monkeypatch):
    from tandem.actors.launcher import RayShardLauncher
    from tandem.rpc.grpc_group import GrpcShardGroup

    model = tiny_llama(tmp_path / "tiny-llama")
    folder = tiny_dflash(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    config = EngineConfig(model=model, drafter="dflash", dflash_checkpoint="ckpt", max_num_seqs=2, max_model_len=64,
                          row_budget=32, device="cpu", dtype="float32")
    group = GrpcShardGroup(config.shard_spec(), RayShardLauncher(1, torch_threads=1), deadline_s=60)
    try:
        assert group.drafter_info == RankDrafterInfo("dflash", folder, 4)
        assert os.getcwd() != ray_cwd()  # so a relative "ckpt" would not have been found there
        assert drafts_of(group) == drafts_of(LocalShardGroup(build_model_shard(config.shard_spec(), progress=False)[0]))
    finally:
        group.close()
