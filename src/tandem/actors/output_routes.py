"""Where the scheduler actor sends each request's outputs: a subscriber's socket on this
node (tandem.actors.output_channel), written by whichever thread has the outputs; else,
on the actor's event loop, the request's own queue (generate, stream) or its
subscriber's (subscribe)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tandem.actors.output_channel import OutputChannels
from tandem.intake import Admission, Request
from tandem.outputs import RequestOutput


class OutputRoutes:
    def __init__(self, on_submit: Callable[[list[Request], str], Awaitable[list[Admission]]],
                 on_closed: Callable[[str], Awaitable[None]]):
        self.queues: dict[str, asyncio.Queue] = {}  # request id -> its own stream's queue
        self.subscribers: dict[str, asyncio.Queue] = {}  # subscriber id -> the queue of all its requests
        self.routes: dict[str, str] = {}  # request id -> subscriber id
        self.channels = OutputChannels(on_submit, on_closed)  # subscribers on this node, over a socket
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.channels.start(loop)

    def open(self, rid: str, subscriber: str | None) -> None:
        """Where the request's outputs go: its own queue, or its subscriber's stream."""
        if subscriber is not None:
            self.routes[rid] = subscriber
        else:
            self.queues[rid] = asyncio.Queue()

    def close(self, rid: str) -> None:
        self.queues.pop(rid, None)
        self.routes.pop(rid, None)

    def is_open(self, rid: str) -> bool:
        return rid in self.queues or rid in self.routes

    def live(self) -> list[str]:
        """Every request whose outputs still have somewhere to go."""
        return [*self.queues, *self.routes]

    def subscriber_queue(self, subscriber: str) -> asyncio.Queue:
        return self.subscribers.setdefault(subscriber, asyncio.Queue())

    def drop_subscriber(self, subscriber: str) -> list[str]:
        """The subscriber went away: its routes, all at once, so no later output of theirs
        is queued for nobody; its requests' ids."""
        rids = [r for r, sid in list(self.routes.items()) if sid == subscriber]
        for rid in rids:
            self.routes.pop(rid, None)
        return rids

    def deliver(self, outs: list[RequestOutput], *, on_loop: bool = False) -> None:
        """Any thread (the engine's sink too, from inside a tick): the outputs of socket
        subscribers straight to their sockets, the rest to the event loop (_dispatch): at
        once when called on it, else handed over."""
        rest = self.channels.send(outs, self.routes)
        if rest and on_loop:
            self._dispatch(rest)
        elif rest:
            self._loop.call_soon_threadsafe(self._dispatch, rest)

    def _dispatch(self, outs: list[RequestOutput]) -> None:
        """The event loop: each output to its request's queue or its subscriber's."""
        for out in outs:
            rid = out.request_id
            q = self.queues.get(rid)
            if q is None and rid in self.routes:
                q = self.subscriber_queue(self.routes[rid])
                if out.finished:
                    del self.routes[rid]
            if q is not None:
                q.put_nowait(out)
