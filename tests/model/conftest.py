"""Shared fixtures of the model-layer tests (helpers live in tiny_models.py)."""

from __future__ import annotations

import os

import pytest

from tiny_models import make_tiny_hf_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: variant -> a folder with config.json + model.safetensors (no tokenizer)."""
    made: dict[str, str] = {}

    def get(variant: str) -> str:
        if variant not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{variant}")
            make_tiny_hf_model(variant).save_pretrained(folder)
            made[variant] = str(folder)
        return made[variant]
    return get


@pytest.fixture(scope="session")
def smollm2(default_model):
    """The real default model (SmolLM2-135M-Instruct) in float32: tests/conftest.py's one
    session-wide load. The first run ever builds its cache (about 20 s)."""
    assert default_model.name == "smollm2"
    return default_model
