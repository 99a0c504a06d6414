"""Engines on the default model. Engines built here share one in-process rank (the
weights are loaded once); tests use one engine at a time."""
from __future__ import annotations

import pytest

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.shard.factory import ShardSpec, build_model_shard
from tandem.shard.local_group import LocalShardGroup

SLOTS = 20
CONTEXT = 512


@pytest.fixture(scope="session")
def local_group(default_model):
    shard, _ = build_model_shard(
        ShardSpec(num_slots=SLOTS, max_model_len=CONTEXT, row_budget=128, device="cpu", dtype="float32"),
        loaded=default_model,
        progress=False,
    )
    return LocalShardGroup(shard)


@pytest.fixture(scope="session")
def make_engine(local_group, default_model):
    def make(drafter: str = "none", group=None, sink=None, **cfg) -> Engine:
        config = EngineConfig(drafter=drafter, max_num_seqs=SLOTS, max_model_len=CONTEXT, row_budget=128, **cfg)
        return Engine(group or local_group, default_model.tokenizer, default_model.eos_token_ids, config, sink=sink)

    return make


@pytest.fixture(scope="session")
def truncated_draft_dir(default_model, tmp_path_factory):
    """A real draft model sharing the tokenizer: the default model cut to its first 8 layers.
    It drafts badly on purpose, so verification rejects often (partial acceptance)."""
    import json
    import os
    import shutil

    from safetensors.torch import save_file

    src = default_model.path
    out = tmp_path_factory.mktemp("draft8")
    for f in os.listdir(src):
        if not f.endswith(".safetensors") and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out / f)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = 8
    (out / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file

    state = {}
    for f in os.listdir(src):
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(src, f)))
    keep = {k: v.contiguous() for k, v in state.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < 8}
    save_file(keep, str(out / "model.safetensors"))
    return str(out)


def _draft_model_group(default_model, draft_model: str):
    shard, _ = build_model_shard(
        ShardSpec(
            num_slots=SLOTS, max_model_len=CONTEXT, row_budget=128, device="cpu", dtype="float32",
            drafter="draft-model", draft_model=draft_model,
        ),
        loaded=default_model,
        progress=False,
    )
    return LocalShardGroup(shard)


@pytest.fixture(scope="session")
def self_draft_group(default_model):
    """The default model drafting for itself: every draft is accepted (the full-accept path)."""
    return _draft_model_group(default_model, "smollm2")


@pytest.fixture(scope="session")
def weak_draft_group(default_model, truncated_draft_dir):
    """An 8-layer cut of the default model drafting: mostly rejected (the rejection path)."""
    return _draft_model_group(default_model, truncated_draft_dir)
