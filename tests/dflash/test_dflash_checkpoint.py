"""DFlash checkpoint folders: the z-lab layout loads (config keys, tensor names), what
does not fit is refused by name, and save -> load keeps the drafts."""
from __future__ import annotations

import json
import types
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from dflash_tiny import TARGET, VOCAB, random_dflash, random_prompts, tiny_shard
from slot_blocks import prefill_item
from tandem.drafters.dflash import build_dflash_drafter, load_dflash_checkpoint, save_dflash_checkpoint
from tandem.shard.commands import GREEDY, ProposeBatch
from tandem.shard.spec import ShardSpec

LAYERS = 2
HEADS, KV_HEADS, HEAD_DIM, INTER = 4, 2, 12, 64


def zlab_config(**over) -> dict:
    """What a z-lab DFlash config.json looks like (Qwen3 keys + dflash_config), for the tiny target."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 5,
        "bos_token_id": 1,
        "dflash_config": {"mask_token_id": VOCAB - 2, "target_layer_ids": [1, 3]},
        "dtype": "bfloat16",
        "eos_token_id": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": TARGET.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "layer_types": ["full_attention"] * LAYERS,
        "max_position_embeddings": 40960,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "num_target_layers": TARGET.num_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }
    cfg.update(over)
    return cfg


def zlab_tensors(prefix: str = "", seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    H, q, kv = TARGET.hidden_size, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

    def w(*shape):
        return (torch.randn(shape, generator=g) * 0.2).to(torch.bfloat16)

    t = {"fc.weight": w(H, 2 * H), "hidden_norm.weight": 1 + w(H), "norm.weight": 1 + w(H)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t.update({
            p + "self_attn.q_proj.weight": w(q, H), p + "self_attn.k_proj.weight": w(kv, H),
            p + "self_attn.v_proj.weight": w(kv, H), p + "self_attn.o_proj.weight": w(H, q),
            p + "self_attn.q_norm.weight": 1 + w(HEAD_DIM), p + "self_attn.k_norm.weight": 1 + w(HEAD_DIM),
            p + "mlp.gate_proj.weight": w(INTER, H), p + "mlp.up_proj.weight": w(INTER, H),
            p + "mlp.down_proj.weight": w(H, INTER),
            p + "input_layernorm.weight": 1 + w(H), p + "post_attention_layernorm.weight": 1 + w(H),
        })
    return {prefix + k: v for k, v in t.items()}


def write_checkpoint(folder, config: dict, tensors: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return str(folder)


def fake_loaded(target, name="tiny"):
    return types.SimpleNamespace(model=target, name=name, config=TARGET, tokenizer=None, eos_token_ids=())


@pytest.mark.parametrize("prefix", ["", "model."])
def test_a_zlab_layout_checkpoint_loads_with_its_config_keys_and_tensors(tmp_path, prefix):
    tensors = zlab_tensors(prefix)
    folder = write_checkpoint(tmp_path / "zlab", zlab_config(), tensors)
    model = load_dflash_checkpoint(folder, dtype=torch.float32)
    c = model.config
    assert (c.block_size, c.mask_token_id, c.target_layer_ids) == (5, VOCAB - 2, (1, 3))
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta) == (LAYERS, HEADS, KV_HEADS, HEAD_DIM, 1e6)
    state = model.state_dict()
    for name, t in tensors.items():
        assert torch.equal(state[name.removeprefix("model.")], t.float()), name


def test_a_zlab_checkpoint_drafts_in_the_engine_through_the_shard_spec(tmp_path, target):
    folder = write_checkpoint(tmp_path / "zlab", zlab_config(), zlab_tensors())
    spec = ShardSpec(dflash_checkpoint=folder, num_slots=4, max_model_len=128)
    drafter = build_dflash_drafter(spec, fake_loaded(target), device="cpu", dtype=torch.float32, num_blocks=64)
    assert drafter.capture_layers == (1, 3) and drafter.block_size == 5
    shard = tiny_shard(target, None)
    shard.drafter, shard.capture = drafter, drafter.capture_layers
    prompt = random_prompts(1, seed=3)[0]
    last = shard.prefill([prefill_item(2, prompt)]).next_tokens[0]
    drafts = shard.propose(ProposeBatch(slots=[2], last_tokens=[last], positions=[len(prompt)], num_drafts=[8],
                                        sampling=[GREEDY])).drafts[0]
    assert len(drafts) == 4 and all(0 <= t < VOCAB for t in drafts)


def test_the_dflash_keys_may_sit_at_the_top_level(tmp_path):
    cfg = zlab_config(target_layer_ids=[0, 2], mask_token_id=3)
    del cfg["dflash_config"]
    model = load_dflash_checkpoint(write_checkpoint(tmp_path / "top", cfg, zlab_tensors()))
    assert model.config.target_layer_ids == (0, 2) and model.config.mask_token_id == 3


@pytest.mark.parametrize("change, message", [
    (lambda c, t: t.pop("layers.1.mlp.up_proj.weight"), "missing tensors .*layers.1.mlp.up_proj.weight"),
    (lambda c, t: t.update({"lm_head.weight": t["fc.weight"].clone()}), "unexpected .*lm_head.weight"),
    (lambda c, t: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
    (lambda c, t: c.update(layer_types=["sliding_attention"] * LAYERS), "full-attention"),
    (lambda c, t: c.update(architectures=["DFlash2DraftModel"]), "DFlash2"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_by_name(tmp_path, change, message):
    cfg, tensors = zlab_config(), zlab_tensors()
    change(cfg, tensors)
    with pytest.raises(ValueError, match=message):
        load_dflash_checkpoint(write_checkpoint(tmp_path / "bad", cfg, tensors))


def test_a_checkpoint_for_another_target_is_refused(tmp_path, target):
    folder = write_checkpoint(tmp_path / "other", zlab_config(num_target_layers=36), zlab_tensors())
    spec = ShardSpec(dflash_checkpoint=folder, num_slots=2, max_model_len=64)
    with pytest.raises(ValueError, match="36-layer target"):
        build_dflash_drafter(spec, fake_loaded(target), device="cpu", dtype=torch.float32, num_blocks=64)


def test_no_shipped_weights_for_an_unknown_target_says_what_to_pass(target):
    spec = ShardSpec(dflash_checkpoint=None, num_slots=2, max_model_len=64)
    with pytest.raises(ValueError, match="dflash_checkpoint"):
        build_dflash_drafter(spec, fake_loaded(target, name="tiny"), device="cpu", dtype=torch.float32, num_blocks=64)


def test_save_then_load_keeps_the_drafts(tmp_path, target):
    draft = random_dflash(seed=5)
    save_dflash_checkpoint(draft, str(tmp_path / "ours"), dtype=torch.float32, extra_config={"tandem": {"target_model": "tiny"}})
    again = load_dflash_checkpoint(str(tmp_path / "ours"))
    assert replace(again.config, extra={}) == draft.config and again.config.extra == {"tandem": {"target_model": "tiny"}}
    prompt = random_prompts(1, seed=6)[0]
    drafts = []
    for d in (draft, again):
        shard = tiny_shard(target, d)
        last = shard.prefill([prefill_item(0, prompt)]).next_tokens[0]
        drafts.append(shard.propose(ProposeBatch(slots=[0], last_tokens=[last], positions=[len(prompt)],
                                                 num_drafts=[8], sampling=[GREEDY])).drafts[0])
    assert drafts[0] == drafts[1]


def test_a_draft_vocabulary_limits_the_drafts_and_survives_save_and_load(tmp_path, target):
    from tandem.drafters.dflash import DFlashDraftModel
    from dflash_tiny import tiny_dflash_config

    config = replace(tiny_dflash_config(), draft_vocab_size=20)
    draft = DFlashDraftModel(config).init_weights(7, std=0.3).eval()
    draft.draft_vocab.copy_(torch.arange(40, 80, 2))
    save_dflash_checkpoint(draft, str(tmp_path / "dv"))
    again = load_dflash_checkpoint(str(tmp_path / "dv"))
    assert again.draft_vocab.dtype == torch.long and torch.equal(again.draft_vocab, draft.draft_vocab)
    shard = tiny_shard(target, again)
    prompts = random_prompts(3, seed=8)
    res = shard.prefill([prefill_item(s, p) for s, p in enumerate(prompts)])
    from tandem.shard.commands import SamplingSpec

    spec = SamplingSpec(temperature=1.0, seed=3)
    drafts = shard.propose(ProposeBatch(slots=[0, 1, 2], last_tokens=res.next_tokens, positions=[len(p) for p in prompts],
                                        num_drafts=[4] * 3, sampling=[GREEDY, spec, GREEDY])).drafts
    allowed = set(range(40, 80, 2))
    assert all(t in allowed for d in drafts for t in d)
    q = shard._drafts[1][1]
    assert q.shape == (4, VOCAB) and torch.allclose(q.sum(-1), torch.ones(4)) and q[:, 41].sum() == 0
