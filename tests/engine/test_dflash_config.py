"""EngineConfig and `tandem generate` for the DFlash drafter: the checkpoint folder is
checked (errors name dflash_checkpoint) and made absolute, and num_speculative_tokens
defaults to the checkpoint's block_size - 1 and may not exceed it."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace

import pytest

from tandem import cli_generate
from tandem.config import EngineConfig
from tandem.errors import InvalidRequestError

SHIPPED_BLOCK_SIZE = 8  # the weights shipped for the default model


def refused(field: str, **fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        EngineConfig(**fields)
    assert info.value.field == field, info.value
    return info.value


def test_the_default_draft_count_is_the_checkpoints_block_size_minus_one(block4):
    assert EngineConfig(drafter="dflash").num_speculative_tokens == SHIPPED_BLOCK_SIZE - 1
    assert EngineConfig(drafter="dflash", dflash_checkpoint=block4).num_speculative_tokens == 3
    assert EngineConfig(drafter="ngram").num_speculative_tokens == 4
    assert EngineConfig(drafter="dflash", dflash_checkpoint=block4).shard_spec().num_speculative_tokens == 3


def test_an_explicit_draft_count_is_kept_up_to_block_size_minus_one_and_refused_above(block4):
    assert EngineConfig(drafter="dflash", dflash_checkpoint=block4, num_speculative_tokens=2).num_speculative_tokens == 2
    err = refused("num_speculative_tokens", drafter="dflash", dflash_checkpoint=block4, num_speculative_tokens=4)
    assert "block_size - 1 = 3" in str(err)
    refused("num_speculative_tokens", drafter="dflash", num_speculative_tokens=SHIPPED_BLOCK_SIZE)


def test_replace_picks_the_default_again_for_a_new_drafter_but_keeps_an_explicit_count(block4):
    ngram = EngineConfig(drafter="ngram")
    assert replace(ngram, drafter="dflash").num_speculative_tokens == SHIPPED_BLOCK_SIZE - 1
    assert replace(ngram, drafter="dflash", dflash_checkpoint=block4).num_speculative_tokens == 3
    assert replace(EngineConfig(drafter="dflash"), drafter="ngram").num_speculative_tokens == 4
    assert replace(EngineConfig(num_speculative_tokens=2), drafter="dflash").num_speculative_tokens == 2


def test_a_missing_folder_or_one_that_is_no_dflash_checkpoint_is_refused_by_name(tmp_path):
    assert "is not a folder" in str(refused("dflash_checkpoint", drafter="dflash", dflash_checkpoint=str(tmp_path / "nope")))
    assert "config.json" in str(refused("dflash_checkpoint", drafter="dflash", dflash_checkpoint=str(tmp_path)))
    llama = tmp_path / "llama"  # a model folder, not a drafter: no target_layer_ids
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "intermediate_size": 64, "vocab_size": 128}))
    (llama / "model.safetensors").write_bytes(b"")
    assert "target_layer_ids" in str(refused("dflash_checkpoint", drafter="dflash", dflash_checkpoint=str(llama)))
    (llama / "config.json").write_text("{not json")
    refused("dflash_checkpoint", drafter="dflash", dflash_checkpoint=str(llama))


def test_a_model_without_shipped_weights_needs_a_checkpoint():
    err = refused("dflash_checkpoint", drafter="dflash", model="qwen2.5-coder-0.5b")
    assert "qwen2.5-coder-0.5b" in str(err)


def test_the_shard_spec_carries_the_checkpoint_as_an_absolute_folder_only_for_dflash(block4, monkeypatch):
    monkeypatch.chdir(os.path.dirname(block4))
    relative = os.path.basename(block4)
    spec = EngineConfig(drafter="dflash", dflash_checkpoint=relative).shard_spec()
    assert spec.dflash_checkpoint == block4 and os.path.isabs(spec.dflash_checkpoint)
    assert EngineConfig(drafter="none", dflash_checkpoint=relative).shard_spec().dflash_checkpoint is None


# ---- tandem generate ------------------------------------------------------------------------

def generate_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_generate.add_arguments(parser)
    return parser.parse_args(["hi", *argv])


def test_generate_passes_the_checkpoint_and_leaves_the_draft_count_to_the_config(block4, monkeypatch):
    from tandem.engine import Engine

    seen = {}

    def from_config(**fields):
        seen["config"] = EngineConfig(**fields)
        raise ValueError("stop here")  # reported like any config error: no model is loaded

    monkeypatch.setattr(Engine, "from_config", staticmethod(from_config))
    assert cli_generate.run(generate_args("--drafter", "dflash", "--dflash-checkpoint", block4)) == 2
    config = seen["config"]
    assert (config.dflash_checkpoint, config.num_speculative_tokens) == (block4, 3)


@pytest.mark.parametrize("argv, field", [
    (("--drafter", "dflash", "--dflash-checkpoint", "no/such/folder"), "dflash_checkpoint"),
    (("--drafter", "ngram", "--dflash-checkpoint", "."), "dflash_checkpoint"),
    (("--drafter", "dflash", "--num-speculative-tokens", "8"), "num_speculative_tokens"),
])
def test_generate_refuses_a_bad_dflash_setting_naming_it(argv, field, capsys):
    assert cli_generate.run(generate_args(*argv)) == 2
    assert f"tandem generate: {field}:" in capsys.readouterr().err


def test_the_default_drafter_is_dflash_where_weights_ship_or_are_given_and_ngram_elsewhere(block4):
    default = EngineConfig()
    assert default.drafter == "dflash" and default.num_speculative_tokens == SHIPPED_BLOCK_SIZE - 1
    assert EngineConfig(model="qwen2.5-coder-0.5b").drafter == "ngram"
    assert EngineConfig(model="qwen2.5-coder-0.5b", dflash_checkpoint=block4).drafter == "dflash"
    # a default is chosen again for a new model; one the user gave is kept
    other = replace(default, model="qwen2.5-coder-0.5b")
    assert other.drafter == "ngram" and other.num_speculative_tokens == 4
    assert replace(EngineConfig(drafter="dflash"), model="smollm2").drafter == "dflash"
    assert replace(EngineConfig(drafter="none"), model="qwen2.5-coder-0.5b").drafter == "none"
