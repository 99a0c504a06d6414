"""One rank's Session stream: the scheduler's side of the tick's commands to that rank.

Why a stream: a unary gRPC call pays its setup and, in the Python server, several
thread hand-offs (the call, then its message, then the pool worker); a message on an
open bidirectional stream pays less (measured on the 2-core dev box: ~0.35 ms less a
verify + verdict tick). Replies come in order, one per command.

A verdict or a release whose reply is read later rides on the next command to the rank
(Command.before): one message a tick instead of two (see GrpcShardGroup).

A stream has no per-message deadline, so a Watchdog thread cancels a stream whose reply
is overdue; the waiting caller then sees DEADLINE_EXCEEDED, as a unary call would. A
command may be sent without a deadline of its own (a verdict or a release whose
acknowledgement is read later, see GrpcShardGroup): its reply is then due by the next
deadline of a command sent after it, since replies come in order, or by the deadline
awaiting() sets once the caller waits for it. A stream that failed
(deadline, lost rank, channel closed) stays failed: every later command on it answers at
once with the same status. The group is unhealthy by then and its restart opens fresh
streams.

Session keeps that bookkeeping; GrpcSession carries the messages on the gRPC stream,
tandem.rpc.session_socket.SocketSession on a Unix socket to a rank on the same host.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import grpc

from tandem.rpc.generated import shard_pb2 as pb

_CODES = {c.value[0]: c for c in grpc.StatusCode}
_WATCH_PERIOD_S = 0.1  # how late past its deadline a stream may be cancelled


class StreamBroken(Exception):
    """The transport's way to say the stream ended: the status a unary call would have had."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class Session:
    """One rank's command stream: the replies' deadlines, the failure that ends it. A
    transport subclass carries the messages (_write, _read, _cancel, close)."""

    transport: str  # the carrier's name ("grpc", "socket"), set by the subclass

    def __init__(self, rank: int):
        self.rank = rank
        self._lock = threading.Lock()
        self.deadline: float | None = None  # monotonic; the earliest deadline of a reply to come
        self._due: deque[float | None] = deque()  # one entry per reply to come, in order
        self._timed_out = False
        self.failure: tuple[grpc.StatusCode, str, float] | None = None  # (code, details, when)

    def send(self, command: pb.Command, timeout: float | None, *, riders: int = 0) -> None:
        """Queue a command; timeout None: its reply has no deadline of its own. The
        `riders` commands it carries (command.before) answer first, with no deadline of
        their own: the command's bounds them, since replies come in order."""
        if self.failure is None:
            with self._lock:
                self._due.extend([None] * riders)
                self._due.append(None if timeout is None else time.monotonic() + timeout)
                self._refresh_deadline()
            self._write(command)

    def awaiting(self, timeout: float) -> None:
        """The caller now waits for every reply still to come: a reply sent without a
        deadline gets one, so a rank that stopped answering is cancelled, not waited for."""
        with self._lock:
            due = time.monotonic() + timeout
            self._due = deque(due if d is None else d for d in self._due)
            self._refresh_deadline()

    def _refresh_deadline(self) -> None:  # under self._lock
        self.deadline = next((d for d in self._due if d is not None), None)

    def receive(self) -> tuple[Any, grpc.StatusCode | None, str, float]:
        """(reply, None, "", 0) or (None, status code, details, when it failed)."""
        if self.failure is not None:
            return None, *self.failure
        try:
            reply = self._read()
        except StreamBroken as e:
            return None, *self._fail(e.code, e.details)
        with self._lock:
            if self._due:
                self._due.popleft()
            self._refresh_deadline()
            late = self._timed_out
        if late:  # cancelled just as the reply came: the stream is gone all the same
            return None, *self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "")
        if reply.code:
            return None, _CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.details, time.monotonic()
        return reply, None, "", 0.0

    def _fail(self, code: grpc.StatusCode, details: str) -> tuple[grpc.StatusCode, str, float]:
        with self._lock:
            self.deadline = None
            self._due.clear()
            if self._timed_out:  # our own cancel: the rank did not answer in time
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "no answer before the deadline"
        self.failure = (code, details, time.monotonic())
        return self.failure

    def expire(self, now: float) -> None:
        """Cancel the stream if the awaited reply is overdue (the Watchdog's call)."""
        with self._lock:
            if self.deadline is None or now < self.deadline:
                return
            self._timed_out = True
            self.deadline = None
        self._cancel()

    # ---- the transport --------------------------------------------------------------------

    def _write(self, command: pb.Command) -> None:
        """Send one command; never raises (a broken stream shows in the next _read)."""
        raise NotImplementedError

    def _read(self) -> pb.CommandReply:
        """The next reply, in order; StreamBroken once the stream is gone."""
        raise NotImplementedError

    def _cancel(self) -> None:
        """End the stream now (from another thread): a waiting _read raises StreamBroken."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class GrpcSession(Session):
    """The Session RPC of the rank's gRPC server."""

    transport = "grpc"

    def __init__(self, stub, rank: int):
        super().__init__(rank)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        # the request iterator ends at None (close)
        self._call = stub.Session(iter(self._requests.get, None))

    def _write(self, command: pb.Command) -> None:
        self._requests.put(command)

    def _read(self) -> pb.CommandReply:
        try:
            return next(self._call)
        except grpc.RpcError as e:
            raise StreamBroken(e.code(), e.details() or "") from None
        except StopIteration:
            raise StreamBroken(grpc.StatusCode.UNAVAILABLE, "the session stream ended") from None

    def _cancel(self) -> None:
        self._call.cancel()

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class Watchdog:
    """A thread that expires overdue Session replies every _WATCH_PERIOD_S."""

    def __init__(self):
        self.sessions: list[Session] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-rpc-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_WATCH_PERIOD_S):
            now = time.monotonic()
            for s in list(self.sessions):
                s.expire(now)

    def stop(self) -> None:
        self._stop.set()
