"""Waiting on a condition instead of a fixed sleep: poll it until a deadline, and say
what was awaited when the deadline passes (a loaded machine is slow, never wrong)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.05) -> T:
    """condition()'s first truthy value, polled every `every_s` for up to `timeout_s`;
    AssertionError naming `what` (and the last value seen) once the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last seen: {value!r})")
        time.sleep(every_s)


async def until(condition: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.005) -> T:
    """wait_for on an event loop: the loop runs other tasks between polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last seen: {value!r})")
        await asyncio.sleep(every_s)
