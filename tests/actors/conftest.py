"""ONE engine of two shard actors (tensor parallel 2) for the session, on the session's
Ray cluster (tests/conftest.py).

The engine drafts nothing and its row budget is one row, so every running sequence is
its own verify batch, verified in admission order: a test can tell which batch a lost
rank fails (see test_shard_kill.py)."""
from __future__ import annotations

import pytest

TP2_ENGINE_NAME = "tandem-test-tp2"
TINY_ENGINE_NAME = "tandem-test-tiny"


@pytest.fixture(scope="session")
def tp2(ray_cluster):
    import tandem.actors as ta

    handle = ta.start(
        model="smollm2",
        dtype="float32",  # the exact path: two ranks write one rank's text (quantized ranks quantize their own shares)
        tensor_parallel=2,
        drafter="none",
        num_speculative_tokens=0,
        row_budget=1,
        max_num_seqs=4,
        max_model_len=512,
        rpc_deadline_s=6.0,
        name=TP2_ENGINE_NAME,
    )
    yield handle
    handle.shutdown()


@pytest.fixture(scope="session")
def tiny(ray_cluster, tiny_chat_model):
    """An engine of one shard actor on the tiny random-weight model: the handle API's
    plumbing (streams, sockets, multiplexing) without the real model's compute."""
    import tandem.actors as ta

    handle = ta.start(model=tiny_chat_model, max_num_seqs=8, max_model_len=1024, rpc_deadline_s=6.0,
                      name=TINY_ENGINE_NAME)
    yield handle
    handle.shutdown()


@pytest.fixture(scope="session")
def embedded():
    """The embedded engine (one in-process rank, n-gram drafting): the reference text."""
    from tandem.engine import Engine

    engine = Engine.from_config(progress=False, model="smollm2", max_num_seqs=4, max_model_len=512)
    yield engine
    engine.close()
