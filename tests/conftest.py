"""Fixtures shared by every test folder: the default model, loaded once per session."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def default_model():
    """The default model (SmolLM2-135M-Instruct from its PyPI package), float32 on the CPU."""
    from tandem.model.loader import load_model

    return load_model(None, progress=False)
