"""The scheduler actor and a subscriber on its node, over a Unix socket.

Through a Ray streaming generator, every tick's outputs cost the actor's process an
event-loop wake-up, the generator's machinery and a serialization on one of Ray's
threads, all taking the GIL from the engine's step thread (H200, real SmolLM2, 64
streams: a served tick 6.5-7.9 ms p50 against 5.5-6.0 embedded, with the rank in the
actor), and the item reached the replica 1-4 ms after the yield. Here the step thread
writes the tick's outputs itself: one pickled frame of wire tuples (tandem.actors.wire)
to each subscriber that has outputs in it. The subscriber's submissions travel the
same socket the other way, instead of a Ray call each (~2 ms to reach a busy actor).

Only a subscriber on the actor's node can use it (the socket lies in the actor's
temporary folder, mode 0700); one elsewhere uses Ray (`submit_many`, `subscribe`).

Protocol: the subscriber connects, sends its id and a newline, and waits for b"ok\n";
from then on the actor routes that subscriber's outputs to the socket. Then frames both
ways: a 4-byte length, a kind byte, a pickle. Subscriber -> actor: SUBMIT (batch number,
a list of tandem.intake.Request, as for submit_many). Actor -> subscriber: OUTPUTS (a
list of wire outputs), SUBMITTED (batch number, each request's Admission) and, after
every tick, REPORT (the replica's load: tandem.actors.replica_report). When the socket
closes, the actor aborts the subscriber's requests; when the actor goes away, the
subscriber reads the end of the stream.
"""
from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Awaitable, Callable

from tandem.actors.wire import to_wire_on
from tandem.intake import Admission, Request
from tandem.outputs import RequestOutput

log = logging.getLogger("tandem.actors")

_HEAD = struct.Struct("<IB")  # a frame's length (after the head), its kind
OUTPUTS, SUBMIT, SUBMITTED, REPORT = 0, 1, 2, 3
_SEND_BUFFER = 4 << 20  # a replica that falls behind a few ticks does not make the step thread wait
# A subscriber this far behind has stopped reading (its process hangs): it is cut off, its
# requests aborted, before its backlog takes the engine's memory from every other request.
MAX_PENDING_BYTES = 256 << 20


class _Subscriber:
    """One connected subscriber: its socket, and what the step thread and the event loop
    both write, in order."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop):
        self.sock = sock
        self.loop = loop
        self.lock = threading.Lock()
        self.pending = bytearray()  # what the socket did not take yet (flushed by the loop)
        self.started: set[str] = set()  # requests that have had an output on this socket
        self.closed = False

    def send(self, outs: list[RequestOutput]) -> None:
        """Any thread: one OUTPUTS frame of these outputs."""
        with self.lock:
            if self.closed:
                return
            self._write(frame(OUTPUTS, [to_wire_on(out, self.started) for out in outs]))

    def reply(self, batch: int, admissions: list[Admission]) -> None:
        with self.lock:
            self._write(frame(SUBMITTED, (batch, [_picklable(a) for a in admissions])))

    def push(self, data: bytes) -> None:
        """Any thread: a frame made already."""
        with self.lock:
            self._write(data)

    def _write(self, data: bytes) -> None:
        """Under the lock. Never blocks: what the socket cannot take now waits in
        `pending`, in order, and the event loop sends it when it can."""
        if self.closed:
            return
        if self.pending:
            self.pending += data
            if len(self.pending) > MAX_PENDING_BYTES:
                log.error("an output subscriber has not read %d bytes: cutting it off", len(self.pending))
                self.closed = True
                self.pending.clear()
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # its reader on the event loop sees the end
                except OSError:  # already gone: its reader sees that too
                    pass
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.closed = True
            return
        if sent < len(data):
            self.pending += data[sent:]
            self.loop.call_soon_threadsafe(self._watch)

    def _watch(self) -> None:
        """The event loop: flush once the socket is writable (unless it closed meanwhile)."""
        with self.lock:
            if not self.closed:
                self.loop.add_writer(self.sock.fileno(), self._flush)

    def shut(self) -> None:
        """The event loop: write nothing more (the socket is about to close)."""
        with self.lock:
            self.closed = True
            self.pending.clear()
            self.loop.remove_writer(self.sock.fileno())  # a no-op when none is watched

    def _flush(self) -> None:
        """The event loop, when the socket is writable again."""
        with self.lock:
            if not self.closed:
                try:
                    del self.pending[:self.sock.send(self.pending)]
                except BlockingIOError:
                    return
                except OSError:
                    self.closed = True
            if self.closed or not self.pending:
                self.pending.clear()
                self.loop.remove_writer(self.sock.fileno())


class OutputChannels:
    """The actor's side: a listening Unix socket and the subscribers connected to it."""

    def __init__(self, on_submit: Callable[[list[Request], str], Awaitable[list[Admission]]],
                 on_closed: Callable[[str], Awaitable[None]]):
        self._on_submit = on_submit  # awaited with a SUBMIT frame's requests and the subscriber: per request its Admission
        self._on_closed = on_closed  # awaited with a subscriber whose socket closed
        self._subscribers: dict[str, _Subscriber] = {}
        self._folder: str | None = None
        self._server: socket.socket | None = None

    @property
    def path(self) -> str | None:
        return None if self._folder is None else os.path.join(self._folder, "outputs.sock")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen; where that fails (no Unix sockets, no writable temporary folder) `path`
        stays None and subscribers use the Ray subscription."""
        try:
            self._folder = tempfile.mkdtemp(prefix="tandem-outputs-")  # mode 0700: this user only
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(self.path)
            self._server.listen(64)
            self._server.setblocking(False)
        except (AttributeError, OSError) as e:
            log.warning("no output socket (%s): subscribers get outputs over Ray", e)
            self.close()
            self._folder = self._server = None
            return
        loop.create_task(self._accept(loop))

    def close(self) -> None:
        """The event loop: stop listening and close every subscriber's socket (the engine
        is stopping: nothing to abort)."""
        subscribers, self._subscribers = self._subscribers, {}
        for sub in subscribers.values():
            sub.shut()
            sub.sock.close()
        if self._server is not None:
            self._server.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def has(self, subscriber: str) -> bool:
        return subscriber in self._subscribers

    def send(self, outs: list[RequestOutput], routes: dict[str, str]) -> list[RequestOutput]:
        """Write each output routed to a connected subscriber to its socket (any thread);
        the others are returned. A finished request's route is dropped."""
        if not self._subscribers:
            return outs
        rest: list[RequestOutput] = []
        by_subscriber: dict[str, list[RequestOutput]] = {}
        for out in outs:
            sid = routes.get(out.request_id)
            if sid is not None and sid in self._subscribers:
                by_subscriber.setdefault(sid, []).append(out)
                if out.finished:
                    routes.pop(out.request_id, None)
            else:
                rest.append(out)
        for sid, group in by_subscriber.items():
            sub = self._subscribers.get(sid)
            if sub is not None:  # else closed meanwhile: its requests are being aborted
                sub.send(group)
        return rest

    def broadcast(self, kind: int, payload) -> None:
        """Any thread: one frame to every connected subscriber."""
        if self._subscribers:
            data = frame(kind, payload)
            for sub in list(self._subscribers.values()):
                sub.push(data)

    async def _submit(self, sub: "_Subscriber", sid: str, batch: int, requests: list[Request]) -> None:
        try:
            admissions = await self._on_submit(requests, sid)
        except Exception as e:  # noqa: BLE001 - this batch's requests fail, the channel goes on
            log.exception("submission of %s failed", sid)
            admissions = [Admission(error=e)] * len(requests)
        sub.reply(batch, admissions)

    async def _accept(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                sock, _ = await loop.sock_accept(self._server)
            except OSError:  # closed
                return
            loop.create_task(self._serve(loop, sock))

    async def _serve(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        sid = None
        try:
            hello = b""
            while not hello.endswith(b"\n"):
                data = await loop.sock_recv(sock, 256)
                if not data or len(hello) > 256:
                    return
                hello += data
            sid = hello[:-1].decode()
            sock.setblocking(False)  # the step thread's sends must never wait
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
            sub = self._subscribers[sid] = _Subscriber(sock, loop)
            await loop.sock_sendall(sock, b"ok\n")
            buf = bytearray()
            submitting: set[asyncio.Task] = set()  # held here: the loop keeps only weak references
            while data := await loop.sock_recv(sock, 1 << 16):
                buf += data
                for kind, body in _take_frames(buf):
                    if kind == SUBMIT:
                        # a task each: a submission waits for the engine's next tick boundary,
                        # the frames behind it must not. Tasks start in order, so a batch's
                        # routes still open before the next batch's.
                        task = loop.create_task(self._submit(sub, sid, *body))
                        submitting.add(task)
                        task.add_done_callback(submitting.discard)
        except OSError as e:
            log.debug("output channel of %s: %s", sid, e)
        except Exception:  # noqa: BLE001 - a frame it could not take ends this channel alone
            log.exception("output channel of %s failed", sid)
        finally:
            sub = self._subscribers.pop(sid, None) if sid is not None else None
            if sub is not None:
                sub.shut()
                await self._on_closed(sid)
            sock.close()


def frame(kind: int, payload) -> bytes:
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(body), kind) + body


def _take_frames(buf: bytearray) -> list[tuple[int, object]]:
    """The whole frames at the front of buf (removed from it), unpickled."""
    out = []
    while len(buf) >= _HEAD.size:
        size, kind = _HEAD.unpack_from(buf)
        if len(buf) < _HEAD.size + size:
            break
        out.append((kind, pickle.loads(buf[_HEAD.size:_HEAD.size + size])))
        del buf[:_HEAD.size + size]
    return out


def _picklable(admission: Admission) -> Admission:
    """The admission itself when its error survives a pickle round trip (tandem's own do),
    else with a RuntimeError of that error's text."""
    error = admission.error
    if error is None:
        return admission
    try:
        pickle.loads(pickle.dumps(error))
        return admission
    except Exception:  # noqa: BLE001 - any failure to pickle
        return Admission(admission.request_id, RuntimeError(f"{type(error).__name__}: {error}"))


# ---- the subscriber's side ---------------------------------------------------------------


async def connect(path: str, subscriber: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect as `subscriber`; returns once the actor routes its outputs here. Closing
    the writer ends the channel (and aborts the subscriber's requests)."""
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 24)
    writer.write(subscriber.encode() + b"\n")
    await writer.drain()
    if await reader.readline() != b"ok\n":
        writer.close()
        raise ConnectionError("the scheduler actor refused the output channel")
    return reader, writer


async def frames(reader: asyncio.StreamReader):
    """Each frame the actor sends, as (kind, payload), until it closes the channel."""
    while True:
        try:
            head = await reader.readexactly(_HEAD.size)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise
            return
        size, kind = _HEAD.unpack(head)
        yield kind, pickle.loads(await reader.readexactly(size))
