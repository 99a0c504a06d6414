"""One subscription of the scheduler actor shared by many requests of one event loop (see
Multiplexer): what TandemHandle.multiplexed() streams and generates through."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import math
import pickle
import time
import uuid
from collections.abc import AsyncIterator

from tandem.actors import output_channel
from tandem.actors.ray_errors import engine_gone, tandem_errors
from tandem.actors.scheduler_actor import error_output
from tandem.actors.wire import as_received, from_wire, merge
from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.intake import Admission, Request
from tandem.outputs import RequestOutput


class Multiplexer:
    """Many astream()s and agenerate()s of one event loop over ONE subscription of the
    actor: one message per engine tick instead of one per request (what a busy server
    wants). On the actor's node, the messages, and the submissions the other way, travel
    a Unix socket whose actor end the engine's step thread writes
    (tandem.actors.output_channel); elsewhere, or with direct=False, the messages are the
    items of a Ray streaming generator (`subscribe`) and submissions Ray calls.

    Submissions coalesce: a request goes at once when no submission is on its way, else
    with every request that arrived meanwhile in one submission when the one on its way
    returns. A burst of 64 then costs the actor a few calls instead of 64 queued one
    after another, and a lone request waits for nothing. Over the socket, what has waited
    _SEND_AFTER_S goes at once even so: while the event loop takes a burst in (~0.15 ms a
    request: 64 in ~10 ms), the engine prefills the first ones instead of waiting for all."""

    def __init__(self, actor, direct: bool = True, on_report=None):
        self.actor = actor
        self.direct = direct
        self.on_report = on_report  # called with each REPORT frame's payload (the replica's load)
        self.subscriber = f"sub-{uuid.uuid4().hex}"
        self.queues: dict[str, asyncio.Queue] = {}
        self.pump: asyncio.Task | None = None
        self._subscribed = asyncio.Event()  # submissions wait until outputs have somewhere to go
        self._to_submit: list[tuple[Request, asyncio.Future]] = []  # each settled with its Admission
        self._submitting = False
        self._writer: asyncio.StreamWriter | None = None  # the socket, while the subscription is one
        self._batches = itertools.count()
        self._replies: dict[int, asyncio.Future] = {}  # batch number -> its SUBMITTED reply
        self._waiting_since = 0.0  # perf_counter when the oldest request in _to_submit came

    @property
    def over_socket(self) -> bool:
        return self._writer is not None

    def connect(self) -> asyncio.Task:
        """Subscribe now, before any request (a router wants the replica's reports); the pump task."""
        self._ensure_pump()
        return self.pump

    def _ensure_pump(self) -> None:
        if self.pump is None or self.pump.done():
            self._subscribed.clear()
            self.pump = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        why = "the engine's output stream ended (its scheduler actor stopped or was lost)"
        # what a submission still waiting for its reply fails with: the actor's end of the
        # stream closed (it died or stopped) first, so a client may retry (503) once a
        # served app has started a new engine (what the engine took of it, its stream's
        # end aborts)
        lost: type[Exception] = EngineUnavailableError
        try:
            channel = await self._open_channel() if self.direct else None
            if channel is not None:
                reader, self._writer = channel
                self._subscribed.set()
                async for kind, payload in output_channel.frames(reader):
                    if kind == output_channel.OUTPUTS:
                        self._route(payload)
                    elif kind == output_channel.SUBMITTED:
                        batch, errors = payload
                        reply = self._replies.pop(batch, None)
                        if reply is not None and not reply.done():
                            reply.set_result(errors)
                    elif kind == output_channel.REPORT and self.on_report is not None:
                        self.on_report(payload)
            else:
                gen = self.actor.subscribe.options(num_returns="streaming").remote(self.subscriber)
                self._subscribed.set()  # outputs before the generator runs wait in the actor
                async for ref in gen:
                    self._route(await ref)
        except Exception as e:  # noqa: BLE001 - every waiting request learns of it
            if engine_gone(e):  # (a socket reset when the actor died: the same end as a close)
                why = f"the engine's output stream ended (its scheduler actor was lost: {type(e).__name__}: {e})"
            else:
                why = f"the engine's output stream failed: {type(e).__name__}: {e}"
                lost = ConnectionError
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            for reply in self._replies.values():
                if not reply.done():
                    reply.set_exception(lost(why))
            self._replies.clear()
            self._subscribed.set()
        for rid, q in list(self.queues.items()):
            q.put_nowait(error_output(rid, why))

    async def _open_channel(self):
        """The actor's socket when it is on this node, else None (Ray)."""
        import ray

        async with tandem_errors():
            info = await self.actor.output_channel.remote()
        if info["path"] is None or info["node_id"] != ray.get_runtime_context().get_node_id():
            return None
        try:
            return await output_channel.connect(info["path"], self.subscriber)
        except OSError:  # another filesystem (a container boundary): Ray works anywhere
            return None

    def _route(self, item: list[tuple]) -> None:
        for wire in item:
            q = self.queues.get(wire[0])  # the request id
            if q is not None:
                q.put_nowait(from_wire(wire))

    async def _submit_batch(self, requests: list[Request]) -> list[Admission]:
        """One submission: each request's Admission."""
        writer = self._writer
        if writer is None:
            async with tandem_errors():
                return await self.actor.submit_many.remote(requests, self.subscriber)
        return await self._write_submission(requests)

    def _write_submission(self, requests: list[Request]) -> asyncio.Future:
        """Send a submission over the socket now; the future of its SUBMITTED reply.
        Raises (and sends nothing) when a request does not pickle."""
        batch = next(self._batches)
        data = output_channel.frame(output_channel.SUBMIT, (batch, requests))
        reply = self._replies[batch] = asyncio.get_running_loop().create_future()
        self._writer.write(data)
        return reply

    async def _submit_each_alone_if_unpicklable(self, requests: list[Request]) -> list[Admission]:
        """_submit_batch, except that a request that does not pickle fails alone, with an
        error naming its field, instead of failing every request it came with."""
        try:
            return await self._submit_batch(requests)
        except (pickle.PicklingError, TypeError, AttributeError):
            bad = {i: e for i, r in enumerate(requests) if (e := _unpicklable(r)) is not None}
            if not bad:
                raise
        kept = iter(await self._submit_batch([r for i, r in enumerate(requests) if i not in bad])
                    if len(bad) < len(requests) else ())
        return [Admission(error=bad[i]) if i in bad else next(kept) for i in range(len(requests))]

    async def stream(self, request: Request, deltas_only: bool) -> AsyncIterator[RequestOutput]:
        """The request's outputs (it has its id: outputs are routed by it)."""
        rid = request.request_id
        self._ensure_pump()
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        finished = False
        whole = as_received(deltas_only)
        try:
            await self._submit(request)
            while not finished:
                # what piled up while the consumer was busy goes as one: a server that
                # falls behind writes fewer, larger chunks instead of falling further behind
                outs = [await q.get()]
                while not q.empty():
                    outs.append(q.get_nowait())
                out = merge(outs)
                finished = out.finished
                yield whole(out)
        finally:
            self.queues.pop(rid, None)
            if not finished:
                self.actor.abort.remote(rid)

    async def stream_many(self, requests: list[Request], deltas_only: bool) -> AsyncIterator[RequestOutput]:
        """The outputs of requests that go in one submission (so the engine admits them
        together: the n choices of one request), each naming its request, as they come;
        ends once all have finished. A refusal of any raises, and the rest are aborted."""
        self._ensure_pump()
        q: asyncio.Queue = asyncio.Queue()
        left = {r.request_id: as_received(deltas_only) for r in requests}
        for rid in left:
            self.queues[rid] = q
        try:
            admissions = await asyncio.gather(*self._enqueue(requests))
            refused = next((a.error for a in admissions if not a.taken), None)
            if refused is not None:
                raise refused
            while left:
                outs = [await q.get()]
                while not q.empty():
                    outs.append(q.get_nowait())
                by_request: dict[str, list[RequestOutput]] = {}
                for out in outs:
                    by_request.setdefault(out.request_id, []).append(out)
                for rid, piled in by_request.items():
                    out = merge(piled)
                    whole = left.pop(rid) if out.finished else left[rid]
                    yield whole(out)
        finally:
            for r in requests:
                self.queues.pop(r.request_id, None)
            for rid in left:
                self.actor.abort.remote(rid)

    async def _submit(self, request: Request) -> None:
        """Submit one request (coalesced with others, see the class); raise what it failed with."""
        (done,) = self._enqueue([request])
        admission = await done
        if not admission.taken:
            raise admission.error

    def _enqueue(self, requests: list[Request]) -> list[asyncio.Future]:
        """Queue requests for the next submission, all in the same one; each one's future Admission."""
        loop = asyncio.get_running_loop()
        dones = [loop.create_future() for _ in requests]
        if not self._to_submit:
            self._waiting_since = time.perf_counter()
        self._to_submit.extend(zip(requests, dones))
        if not self._submitting:
            self._submitting = True
            loop.create_task(self._send_submissions())
        elif self._writer is not None and time.perf_counter() - self._waiting_since >= _SEND_AFTER_S:
            self._send_waiting_now()
        return dones

    def _send_waiting_now(self) -> None:
        """Send what waits behind the submission on its way, without waiting for its reply
        (over the socket: SUBMIT frames need no turn, their replies say which they answer)."""
        batch, self._to_submit = [(r, d) for r, d in self._to_submit if not d.cancelled()], []
        if not batch:
            return
        try:
            reply = self._write_submission([r for r, _ in batch])
        except (pickle.PicklingError, TypeError, AttributeError):
            self._to_submit[:0] = batch  # left to the coalescing loop, which finds the one that does not pickle
            self._waiting_since = math.inf
            return
        reply.add_done_callback(functools.partial(_settle_from_reply, batch))

    async def _send_submissions(self) -> None:
        try:
            await self._subscribed.wait()
            while self._to_submit:
                # a waiter cancelled meanwhile (its client left) is not sent at all
                batch, self._to_submit = [(r, d) for r, d in self._to_submit if not d.cancelled()], []
                if not batch:
                    continue
                try:
                    admissions = await self._submit_each_alone_if_unpicklable([r for r, _ in batch])
                except Exception as e:  # noqa: BLE001 - the call failed: each of its requests learns
                    admissions = [Admission(error=e)] * len(batch)
                _settle(batch, admissions)
        finally:
            self._submitting = False


_SEND_AFTER_S = 0.001  # the longest a request waits behind a submission on its way (socket)


def _settle(batch: list[tuple[Request, asyncio.Future]], admissions: list[Admission]) -> None:
    """Each submitted request learns its Admission."""
    for (_, done), admission in zip(batch, admissions):
        if not done.done():
            done.set_result(admission)


def _settle_from_reply(batch: list[tuple[Request, asyncio.Future]], reply: asyncio.Future) -> None:
    if reply.cancelled():
        _settle(batch, [Admission(error=ConnectionError("the submission was cancelled"))] * len(batch))
    elif reply.exception() is not None:
        _settle(batch, [Admission(error=reply.exception())] * len(batch))
    else:
        _settle(batch, reply.result())


def _unpicklable(request: Request) -> InvalidRequestError | None:
    """The error for a request whose field cannot cross to the engine, or None."""
    for field in dataclasses.fields(request):
        name, value = field.name, getattr(request, field.name)
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, the field is the cause
            return InvalidRequestError(name, f"cannot be sent to the engine ({type(e).__name__}: {e})")
    return None
