"""A scheduler actor that dies mid-stream: a multiplexed handle's streams (on its socket
and on a Ray stream alike) end with an error output soon after, never hang, and a new
request fails at once, with EngineUnavailableError, instead of waiting."""
from __future__ import annotations

import asyncio
import time

import pytest

from tandem.errors import EngineUnavailableError


@pytest.mark.slow
@pytest.mark.parametrize("direct", [True, False], ids=["socket", "ray-stream"])
def test_streams_of_a_lost_scheduler_actor_end_with_an_error(ray_cluster, tiny_chat_model, direct):
    import ray

    import tandem.actors as ta

    # the tiny random-weight model: what is lost is the actor, not what the model writes
    handle = ta.start(model=tiny_chat_model, drafter="none", in_process_target=True, max_num_seqs=2, max_model_len=512)
    mux = handle.multiplexed(direct)

    async def run():
        stream = mux.astream("Count to one hundred: 1, 2, 3,", max_tokens=480, temperature=0.0, ignore_eos=True)
        first = await stream.__anext__()
        over_socket = mux._mux().over_socket
        ray.kill(handle.actor)
        t0 = time.monotonic()
        rest = await asyncio.wait_for(_drain(stream), timeout=30)
        took = time.monotonic() - t0
        try:
            await asyncio.wait_for(mux.agenerate("Hello", max_tokens=2), timeout=30)
            later = None
        except Exception as e:  # noqa: BLE001 - what a request to the lost actor raises
            later = e
        return first, over_socket, rest, took, later

    first, over_socket, rest, took, later = asyncio.run(run())
    assert over_socket is direct
    assert not first.finished
    assert rest and rest[-1].finished and rest[-1].finish_reason == "error", rest[-1:]
    assert "stream" in rest[-1].error, rest[-1].error
    assert took < 10, took
    # tandem's own error, which a served app answers with 503 and Retry-After
    assert isinstance(later, EngineUnavailableError) and "gone" in str(later), repr(later)


async def _drain(stream) -> list:
    return [out async for out in stream]
