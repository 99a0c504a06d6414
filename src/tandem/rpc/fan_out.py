"""How GrpcShardGroup talks to its ranks: every command to the ranks at once, on their
Session streams (a tick's commands, with the riders owed before them) or as unary calls,
and the replies read in order. FanOut is GrpcShardGroup's base; the state it uses (stubs,
sessions, what is owed) is the group's (see tandem.rpc.grpc_group).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.errors import ShardError
from tandem.rpc.generated import shard_pb2 as pb

log = logging.getLogger("tandem.rpc.group")

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@dataclass
class Reply:
    """One rank's answer to one RPC: its message, or the status it failed with."""

    rank: int
    value: Any = None
    code: grpc.StatusCode | None = None
    details: str = ""
    at: float = 0.0  # when it failed (monotonic), to name the first failure first

    @property
    def ok(self) -> bool:
        return self.code is None


@dataclass
class Owed:
    """A command sent on the session streams whose replies have not been read yet."""

    what: str  # names it in a failure
    ranks: list[int]
    batch_id: int | None = None  # a verdict's batch


# the tick's commands, which go on the Session streams: method -> Command field
SESSION_FIELDS = {"Prefill": "prefill", "Verify": "verify", "Commit": "commit", "Propose": "propose", "Release": "release"}


class FanOut:
    def _fan_out(self, method: str, request, timeout: float, *, ranks: list[int] | None = None,
                 wait_for_ready: bool = False, unary: bool = False) -> list[Reply]:
        """Send `request` (or requests[rank]) to the ranks at once; every rank's reply, in rank order.

        A tick's command goes on the ranks' Session streams (unless `unary`); any other
        is a unary call: the other ranks get futures, the first is called blocking from
        this thread, which saves a thread hop on the path the scheduler waits for."""
        ranks = list(range(len(self._stubs))) if ranks is None else ranks
        if not unary and method in SESSION_FIELDS and self._sessions:
            return self._over_sessions(method, request, timeout, ranks)
        done_at: dict[int, float] = {}

        def payload(rank: int):
            return request[rank] if isinstance(request, list) else request

        calls: dict[int, grpc.Future | Reply] = {}
        for rank in ranks[1:]:
            try:
                call = getattr(self._stubs[rank], method).future(payload(rank), timeout=timeout, wait_for_ready=wait_for_ready)
            except ValueError as e:  # a closed channel: the rank cannot be reached
                calls[rank] = Reply(rank, code=grpc.StatusCode.UNAVAILABLE, details=str(e), at=time.monotonic())
                continue
            call.add_done_callback(lambda _, rank=rank: done_at.setdefault(rank, time.monotonic()))
            calls[rank] = call
        first = ranks[0]
        try:
            calls[first] = Reply(first, value=getattr(self._stubs[first], method)(
                payload(first), timeout=timeout, wait_for_ready=wait_for_ready))
        except grpc.RpcError as e:
            calls[first] = Reply(first, code=e.code(), details=e.details() or "", at=time.monotonic())
        except ValueError as e:
            calls[first] = Reply(first, code=grpc.StatusCode.UNAVAILABLE, details=str(e), at=time.monotonic())
        replies = []
        for rank in ranks:
            call = calls[rank]
            if isinstance(call, Reply):
                replies.append(call)
                continue
            try:
                replies.append(Reply(rank, value=call.result()))
            except grpc.RpcError as e:
                replies.append(Reply(rank, code=e.code(), details=e.details() or "", at=done_at.get(rank, time.monotonic())))
        return replies

    def _over_sessions(self, method: str, request, timeout: float, ranks: list[int]) -> list[Reply]:
        field = SESSION_FIELDS[method]
        riders: list[tuple[pb.Command, Owed]] = []
        if ranks == self._all_ranks():
            riders, self._riders = self._riders, []
        else:
            self._send_riders()  # every rank must see them, in order
        before = [cmd for cmd, _ in riders]
        shared = None if isinstance(request, list) else pb.Command(timeout_s=timeout, before=before, **{field: request})
        for rank in ranks:
            cmd = shared or pb.Command(timeout_s=timeout, before=before, **{field: request[rank]})
            self._sessions[rank].send(cmd, timeout, riders=len(before))
        self._owed += [owed for _, owed in riders]
        lost_before = self._read_owed()  # the replies of earlier commands come first
        replies = [self._receive(rank) for rank in ranks]
        if lost_before:
            raise ShardError(f"{method.lower()} not run: the shard group was lost before it ({self.last_failure})",
                             state_advanced=False, unhealthy=True)
        return replies

    def _receive(self, rank: int) -> Reply:
        reply, code, details, at = self._sessions[rank].receive()
        if code is None:
            return Reply(rank, value=getattr(reply, reply.WhichOneof("reply")))
        return Reply(rank, code=code, details=details, at=at)

    def _all_ranks(self) -> list[int]:
        return list(range(len(self._stubs)))

    def _send_owed(self, method: str, request, owed: Owed) -> None:
        """A command whose replies are read later (by _read_owed): it rides on the next one."""
        self._riders.append((pb.Command(timeout_s=self.deadline_s, **{SESSION_FIELDS[method]: request}), owed))

    def _send_riders(self) -> None:
        """Send the riders waiting for a command on their own, one message each."""
        riders, self._riders = self._riders, []
        for cmd, owed in riders:
            for rank in owed.ranks:
                self._sessions[rank].send(cmd, None)
            self._owed.append(owed)

    def _read_owed(self) -> bool:
        """Read the replies of the commands sent without waiting, oldest first; whether one
        failed (the group is then unhealthy; a verdict's batch is kept for settle)."""
        self._send_riders()
        owed, self._owed = self._owed, []
        for rank in sorted({rank for o in owed for rank in o.ranks}):
            self._sessions[rank].awaiting(self.deadline_s)  # waited for now: a hung rank times out
        lost = False
        for o in owed:
            replies = [self._receive(rank) for rank in o.ranks]
            failed = [r for r in replies if not r.ok]
            if not failed:
                continue
            if o.batch_id is None and all(r.code == INVALID for r in replies):
                log.error("%s refused by every rank: %s", o.what, replies[0].details)  # nothing changed anywhere
                continue
            if o.batch_id is not None:
                self._unacknowledged.append(o.batch_id)
            lost = True
            self._healthy = False
            self.last_failure = f"{o.what} not acknowledged: {self._describe(failed, self.deadline_s)}"
            log.error("%s", self.last_failure)
        if owed and not lost and not self._unacknowledged and self._on_acknowledged is not None:
            try:
                self._on_acknowledged()
            except Exception:  # noqa: BLE001 - the caller's command still has its reply to read
                log.exception("the acknowledgement listener failed")
        return lost
