"""Admissions without Ray: batches handed over while the step thread is busy are added
together at its next boundary, each caller gets its own answers, a failure reaches every
waiting caller, and what was taken for a caller that left is aborted."""
from __future__ import annotations

import asyncio
import threading

import pytest

from polling import until
from tandem.actors.admissions import Admissions
from tandem.intake import Admission, Request


class _StepThread:
    """Takes the waiting batches whenever told to, as the actor's step loop does between ticks."""

    def __init__(self, admissions: Admissions, wake: threading.Event):
        self.admissions, self.wake = admissions, wake
        self.go = threading.Event()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            self.go.wait()
            self.go.clear()
            self.admissions.take_waiting()


def _engine(calls: list, refuse: str = "", fail: bool = False):
    def take(batch):
        calls.append([r.request_id for r in batch])
        if fail:
            raise RuntimeError("tokenizer down")
        return [Admission(error=ValueError(f"refused {r.request_id}")) if r.request_id == refuse
                else Admission(r.request_id) for r in batch]

    return take


def test_batches_that_wait_for_a_tick_are_added_in_one_call_each_caller_gets_its_own_answers():
    calls, wake = [], threading.Event()
    admissions = Admissions(_engine(calls, refuse="b2"), lambda rid: None, wake)
    step = _StepThread(admissions, wake)

    async def run():
        # the step thread is "in a tick" until told to take: three submissions pile up
        waiting = [asyncio.ensure_future(admissions.submit([Request(None, None, f"{k}{i}") for i in range(n)]))
                   for k, n in (("a", 2), ("b", 3), ("c", 1))]
        await until(lambda: len(admissions._waiting) == 3, 30, "three submissions waiting")
        assert wake.is_set() and admissions._waiting
        step.go.set()
        return await asyncio.gather(*waiting)

    a, b, c = asyncio.run(run())
    step.stop = True
    step.go.set()
    assert calls == [["a0", "a1", "b0", "b1", "b2", "c0"]]  # one call, in the order handed over
    assert a == [Admission("a0"), Admission("a1")] and c == [Admission("c0")]
    assert b[:2] == [Admission("b0"), Admission("b1")] and isinstance(b[2].error, ValueError) and "b2" in str(b[2].error)
    assert not admissions._waiting


def test_a_take_that_fails_fails_every_waiting_caller():
    wake = threading.Event()
    admissions = Admissions(_engine([], fail=True), lambda rid: None, wake)
    step = _StepThread(admissions, wake)

    async def run():
        waiting = [asyncio.ensure_future(admissions.submit([Request(None, None, rid)])) for rid in ("x", "y")]
        await until(lambda: len(admissions._waiting) == 2, 30, "two submissions waiting")
        step.go.set()
        return await asyncio.gather(*waiting, return_exceptions=True)

    results = asyncio.run(run())
    step.stop = True
    step.go.set()
    assert [str(r) for r in results] == ["tokenizer down", "tokenizer down"]


def test_what_was_taken_for_a_caller_that_left_is_aborted():
    calls, aborted, wake = [], [], threading.Event()
    admissions = Admissions(_engine(calls, refuse="r1"), aborted.append, wake)
    step = _StepThread(admissions, wake)

    async def run():
        left = asyncio.ensure_future(admissions.submit([Request(None, None, "r0"), Request(None, None, "r1")]))
        stays = asyncio.ensure_future(admissions.submit([Request(None, None, "r2")]))
        await until(lambda: len(admissions._waiting) == 2, 30, "two submissions waiting")
        left.cancel()
        await asyncio.sleep(0)
        step.go.set()
        answer = await stays
        await until(lambda: aborted, 30, "an abort of what was taken for the caller that left")
        return answer

    assert asyncio.run(run()) == [Admission("r2")]
    step.stop = True
    step.go.set()
    assert aborted == ["r0"]  # r1 was refused: nothing to abort


def test_shutting_down_fails_the_callers_still_waiting():
    admissions = Admissions(_engine([]), lambda rid: None, threading.Event())

    async def run():
        waiting = asyncio.ensure_future(admissions.submit([Request(None, None, "r")]))
        await until(lambda: admissions._waiting, 30, "a submission waiting")
        admissions.fail_waiting(RuntimeError("shutting down"))
        with pytest.raises(RuntimeError, match="shutting down"):
            await waiting
        assert not admissions._waiting

    asyncio.run(run())


def test_a_chat_requests_size_counts_its_messages_so_a_long_one_is_not_added_on_the_step_thread():
    from tandem.actors.scheduler_actor import _INLINE_PROMPT_LEN, _size

    assert _size("abc", None) == 3 and _size([5, 6], None) == 2
    long_chat = [{"role": "system", "content": "x" * _INLINE_PROMPT_LEN}, {"role": "user", "content": "hi"}]
    assert _size(None, long_chat) > _INLINE_PROMPT_LEN
    assert _size(None, [{"role": "user", "content": None}]) == 0
    assert _size(None, "not a list of messages") == 0  # refused later, by the chat template
