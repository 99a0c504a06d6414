"""DFlash checkpoints: a folder with config.json + *.safetensors in the z-lab layout.

config.json holds Qwen3-style keys (hidden_size, num_hidden_layers, ...) and the DFlash
ones (block_size, dflash_config: {target_layer_ids, mask_token_id}); the tensors are
named `layers.N.self_attn.q_proj.weight`, ..., `fc.weight`, `hidden_norm.weight`,
`norm.weight` (a `model.` prefix is accepted too). The embedding and LM head are the
target's and are not stored. tandem's own checkpoints may add `draft_vocab` (int64 token
ids, with config key draft_vocab_size): the drafter then scores only those rows of the head.
"""
from __future__ import annotations

import glob
import json
import os

import torch

from tandem.drafters.dflash.model import DFlashConfig, DFlashDraftModel
from tandem.drafters.registry import SHIPPED_DFLASH as SHIPPED

WEIGHTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


def shipped_checkpoint(target_name: str) -> str:
    """The folder of the weights shipped for `target_name`."""
    if target_name not in SHIPPED:
        raise ValueError(
            f"no DFlash weights ship for target {target_name!r} (only for {', '.join(SHIPPED)}); "
            "pass dflash_checkpoint: a folder made by scripts/train_dflash.py or a z-lab DFlash checkpoint"
        )
    return os.path.join(WEIGHTS_DIR, SHIPPED[target_name])


def load_dflash_checkpoint(folder: str, *, dtype: torch.dtype = torch.float32,
                           device: torch.device | str = "cpu") -> DFlashDraftModel:
    config_path = os.path.join(folder, "config.json")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not os.path.isfile(config_path) or not files:
        raise FileNotFoundError(f"DFlash checkpoint {folder!r} needs config.json and *.safetensors")
    with open(config_path) as f:
        config = DFlashConfig.from_dict(json.load(f))
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(file).items():
            state[name.removeprefix("model.")] = tensor
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"DFlash checkpoint {folder!r}: missing tensors {missing[:8]}, unexpected {unexpected[:8]}")
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim))
    model.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
    return model.eval().requires_grad_(False)


def save_dflash_checkpoint(model: DFlashDraftModel, folder: str, *, dtype: torch.dtype = torch.bfloat16,
                           extra_config: dict | None = None) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    config = model.config.to_dict()
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.update(extra_config or {})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    state = {k: v.detach().to(device="cpu", dtype=dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
