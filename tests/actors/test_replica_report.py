"""What an engine tells the routers in front of it, on a real scheduler actor: its load
after every tick over the output socket, the prefix keys of what it admitted, and a
drain that lets a running stream finish while new requests are refused."""
from __future__ import annotations

import asyncio

import pytest

from polling import until
from tandem.actors.prefix_keys import prefix_keys
from tandem.errors import EngineUnavailableError

TOKENS = 240  # the tiny model writes fast: enough that the stream still runs when the drain starts
LONG = "The library opens at nine and closes at five; members borrow six books. " * 6 + "Count: 1, 2, 3,"


@pytest.fixture(scope="module")
def engine(ray_cluster, tiny_chat_model):
    """The tiny random-weight model: reports count tokens, whatever the model writes."""
    import tandem.actors as ta

    handle = ta.start(model=tiny_chat_model, max_num_seqs=4, max_model_len=512)
    yield handle
    handle.shutdown()


def test_reports_load_and_prefixes_and_a_drain_finishes_what_it_holds(engine):
    async def run():
        reports: list[dict] = []
        handle = engine.multiplexed(on_report=reports.append)
        idle = await handle.areport()
        outs = handle.astream(LONG, max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
        first = await outs.__anext__()
        await until(lambda: any(r["load_tokens"] > 0 for r in reports), 60, "a report of the running stream")
        held = await handle.areport()
        drain = asyncio.ensure_future(handle.adrain(120.0))
        await until(lambda: any(r["draining"] for r in reports), 60, "the report that it drains")
        with pytest.raises(EngineUnavailableError, match="draining"):
            await handle.agenerate("hello", max_tokens=2)
        last = first
        async for last in outs:
            pass
        return idle, held, reports, last, await drain

    idle, held, reports, last, left = asyncio.run(run())
    assert idle["load_tokens"] == 0 and idle["available"] and not idle["draining"]
    running = [r for r in reports if r["running"] == 1]
    assert running and all(r["load_tokens"] > len(LONG) // 8 for r in running)  # the prompt's tokens and more
    assert set(prefix_keys(LONG)) <= held["prefixes"] and len(prefix_keys(LONG)) == 1
    assert last.finished and last.finish_reason == "length" and len(last.token_ids) == TOKENS  # drained, not cut
    assert left == 0 and not reports[-1]["available"]
