"""Kill a shard actor during a streaming request.

How the test knows which batch fails: the tp2 engine's row budget is one row, so every
sequence is its own verify batch and the batches of a tick run in admission order. The
engine is paused between ticks (pause() returns once the tick in progress ended), the
rank is killed, and the engine resumed: the first command of the next tick is the verify
of the first-admitted request A, which meets the lost rank and fails; the engine then
stops the tick, restarts the group and re-prefills B, which was admitted second and so
was never in the failed batch.
"""
from __future__ import annotations

import threading
import time

import pytest

from tandem.errors import EngineUnavailableError

PROMPT_A = "Once upon a time, in a small village,"
PROMPT_B = "The capital of France is"


def _consume(handle, prompt, max_tokens, log: dict, started: threading.Event):
    text, last = "", None
    try:
        for out in handle.stream(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
            text += out.delta_text
            last = out
            if len(out.token_ids) >= 2:
                started.set()
    except Exception as e:  # noqa: BLE001 - recorded for the assertions
        log["exception"] = e
    log.update(text=text, last=last, ended=time.monotonic())
    started.set()


def test_a_killed_shard_fails_only_its_batch_and_the_others_go_on(tp2):
    import ray

    expected_b = tp2.generate(PROMPT_B, max_tokens=24, temperature=0.0, ignore_eos=True).text

    a, b = {}, {}
    a_started, b_started = threading.Event(), threading.Event()
    ta = threading.Thread(target=_consume, args=(tp2, PROMPT_A, 200, a, a_started))
    ta.start()
    assert a_started.wait(120)
    tb = threading.Thread(target=_consume, args=(tp2, PROMPT_B, 24, b, b_started))
    tb.start()
    assert b_started.wait(120)
    assert "ended" not in b, "B must still be running when the rank is lost"

    tp2.pause()
    killed_at = time.monotonic()
    ray.kill(tp2.shard_actors()[1])
    tp2.resume()

    # A: ends with an error, within 10 s, no hang
    ta.join(30)
    assert not ta.is_alive()
    assert a["ended"] - killed_at < 10
    assert a["last"].finished and a["last"].finish_reason == "error"
    assert "rank 1" in a["last"].error

    # while the group restarts, new requests are refused at once
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailableError):
        tp2.generate("Hello", max_tokens=4)
    assert time.monotonic() - t0 < 5

    # B: re-prefilled on the fresh ranks, the same text as without the fault
    tb.join(180)
    assert not tb.is_alive() and "exception" not in b
    assert b["last"].finish_reason == "length"
    assert b["text"] == expected_b

    # new requests succeed after the recovery
    assert tp2.generate(PROMPT_B, max_tokens=24, temperature=0.0, ignore_eos=True).text == expected_b
    health = tp2.health()
    assert health["status"] == "ok" and health["restarts"] >= 1
    assert health["shard_sessions"] == ["socket", "socket"], "the restarted ranks' streams go over their sockets again"
