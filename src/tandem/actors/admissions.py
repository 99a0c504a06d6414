"""Requests handed from the scheduler actor's event loop to its step thread.

The event loop opens each request's route and hands the batch over; the step thread,
between two ticks, prepares and adds every batch that waited (chat templates, one
tokenizer call, Engine.add_requests) and answers each. Adding on the event loop instead
had it take the GIL from the step thread for every submission frame of a burst (0.2-0.8
ms each on an H200 host, 15 frames from 4 ingress replicas), stretching the ticks, and
requests added after a tick had started waited for the one after it: a burst of 64 was
prefilled in three waves where one would do.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from tandem.intake import Admission, Request


class Admissions:
    def __init__(self, take: Callable[[list[Request]], list[Admission]], abort: Callable[[str], object],
                 wake: threading.Event):
        self._take = take  # a batch -> per request its Admission (the step thread: Engine.add_requests)
        self._abort = abort  # stops a request the engine took for a caller that left
        self._wake = wake  # the step thread's
        self._lock = threading.Lock()
        self._waiting: list[tuple[list[Request], asyncio.Future, asyncio.AbstractEventLoop]] = []

    async def submit(self, batch: list[Request]) -> list[Admission]:
        """The event loop: `batch` added at the step thread's next tick boundary; per
        request its Admission."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._waiting.append((batch, future, loop))
        self._wake.set()
        return await future

    def take_waiting(self) -> None:
        """The step thread, between ticks: every waiting batch in one call."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        try:
            results = self._take([r for batch, _, _ in waiting for r in batch])
        except Exception as e:  # noqa: BLE001 - each waiting caller learns of it
            for _, future, loop in waiting:
                loop.call_soon_threadsafe(_fail, future, e)
            return
        at = 0
        for batch, future, loop in waiting:
            part, at = results[at:at + len(batch)], at + len(batch)
            loop.call_soon_threadsafe(self._answer, future, part)

    def fail_waiting(self, error: Exception) -> None:
        """Shutting down: callers still waiting get `error`."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, future, loop in waiting:
            loop.call_soon_threadsafe(_fail, future, error)

    def _answer(self, future: asyncio.Future, admissions: list[Admission]) -> None:
        if future.cancelled():  # its caller left while it waited: what the engine took, it drops
            for a in admissions:
                if a.taken:
                    self._abort(a.request_id)
        else:
            future.set_result(admissions)


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
