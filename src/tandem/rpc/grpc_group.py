"""GrpcShardGroup: the target on N shard server processes, driven over gRPC.

Every command goes to all ranks at once, each with a deadline, and rank 0's answer is
the group's; propose goes to rank 0 alone, where the rank-side drafter lives. The
tick's commands (prefill, verify, commit, propose, release) travel on one Session
stream per rank (tandem.rpc.session: cheaper than a unary call each); a rank on this
host that offers a session socket gets that stream over the socket instead, the same
messages without gRPC's thread hand-offs (tandem.rpc.session_socket). Start-up, health
and the failed verdict use unary gRPC calls. A verify batch is checked against the shape
rules before anything is sent, and after the forward the verdict words go to every rank.

Verdicts and releases are sent without waiting for their acknowledgements: the
scheduler walks the verdict, and they ride on the next command to every rank (the next
batch's verify, a prefill) in one message, instead of each waiting a round trip; before
a command that goes to rank 0 alone (a propose), or at settle(), they go on their own.
The acknowledgements are read before the next command's reply (replies come in order) or
by settle(), which the engine's OutputRelease calls before it hands out a tick's outputs, so nothing
reaches a client before every rank has its verdict. A verdict some rank did not
acknowledge makes the group unhealthy, and settle() names its batch, which OutputRelease
finishes with an error; a command sent behind it raises ShardError(state_advanced=False):
its sequences were not in that batch and are prefilled again after the restart.

Failures, as the seed's ep_fail_verify_batch: a verify that fails on any rank (an
exception, a lost rank, a passed deadline) or whose rank-0 result is short sends the
all-zero verdict to every rank still reachable (none advances its state), marks the
group unhealthy and raises ShardError(state_advanced=True, unhealthy=True) naming the
cause, so the verify step finishes that batch with an error. Why the whole group and
not just the batch: a rank that raised before a collective leaves its peers stuck in
that collective until the collective timeout, and a lost rank takes the collective
group with it, so no rank's state can be trusted to match the others'. The engine then
restart()s the group (fresh processes, empty KV) and re-prefills the sequences that
were not in the failed batch. Collectives time out (collective_timeout_s, by default
half the RPC deadline) before the RPC deadline passes, so a rank stuck waiting on a
lost peer answers in time to take its zero verdict. (On GPUs a rank stuck in an NCCL
collective may not answer at all: its CUDA sync waits, and NCCL's watchdog may end the
process. The RPC deadline bounds that wait; that rank is then simply unreachable.)

A command every rank refuses with INVALID_ARGUMENT (all ranks check the same things
before touching any state) is a ShapeError and leaves the group healthy; a verdict
that is not acknowledged by every rank, refused or not, makes the group unhealthy.
Not thread-safe: one caller (the engine's tick) drives a group. How commands reach the
ranks and their replies are read: tandem.rpc.fan_out.
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable, NoReturn

import grpc

from tandem.errors import ShapeError, ShardError
from tandem.rpc import codec
from tandem.rpc.generated import shard_pb2 as pb
from tandem.rpc.generated import shard_pb2_grpc as pb_grpc
from tandem.rpc.fan_out import INVALID, FanOut, Owed, Reply
from tandem.rpc.launcher import ShardLauncher
from tandem.rpc.limits import CHANNEL_OPTIONS
from tandem.rpc.session import GrpcSession, Session, Watchdog
from tandem.rpc.session_socket import SocketSession, default_spin_us
from tandem.shard.commands import (
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    RankDrafterInfo,
    ShapeRules,
    ShardLimits,
    Verdict,
    VerifyBatch,
    VerifyResult,
    failed_verdict,
)
from tandem.shard.spec import ShardSpec

log = logging.getLogger("tandem.rpc.group")

class GrpcShardGroup(FanOut):
    limits: ShardLimits
    drafter_info: RankDrafterInfo  # what rank 0's rank-side drafter was built from

    def __init__(
        self,
        spec: ShardSpec,
        launcher: ShardLauncher,
        *,
        deadline_s: float = 30.0,
        init_deadline_s: float = 300.0,
        collective_timeout_s: float | None = None,
        failed_verdict_deadline_s: float | None = None,
        sessions: bool = True,
        session_socket: bool = True,
        session_spin_us: int | None = None,
    ):
        self.spec = spec
        self.use_sessions = sessions  # False: the tick's commands as unary calls (the bench's comparison)
        self.use_session_socket = session_socket  # False: the Session stream over gRPC even on this host
        # how long a socket session busy-polls before it blocks (None: where there are cores to spare)
        self.session_spin_us = default_spin_us() if session_spin_us is None else session_spin_us
        self.launcher = launcher
        self.deadline_s = deadline_s
        self.init_deadline_s = init_deadline_s
        self.collective_timeout_s = collective_timeout_s or deadline_s / 2
        self.failed_verdict_deadline_s = failed_verdict_deadline_s or min(2.0, deadline_s)
        self.addresses: list[str] = []
        self.last_failure: str | None = None
        self._channels: list[grpc.Channel] = []
        self._stubs: list[pb_grpc.ShardControlStub] = []
        self._sessions: list[Session] = []
        self._watchdog: Watchdog | None = None
        self._owed: list[Owed] = []  # sent, replies not read yet; oldest first
        self._riders: list[tuple[pb.Command, Owed]] = []  # not sent yet: they ride on the next command
        self._unacknowledged: list[int] = []  # batches whose verdict some rank did not take
        self._on_acknowledged: Callable[[], None] | None = None  # see ShardGroup.listen_for_acknowledgements
        self._healthy = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # ---- the ShardGroup protocol --------------------------------------------------------

    def prefill(self, items: list[PrefillItem]) -> PrefillResult:
        self._check_healthy()
        # one deadline per forward the prefill needs (each item in chunks of the row budget)
        forwards = sum(math.ceil(len(it.tokens) / self.limits.row_budget) for it in items)
        replies = self._fan_out("Prefill", codec.encode_prefill(items), self.deadline_s * max(1, forwards))
        self._raise_on_failure(replies, f"prefill of slots {[it.slot for it in items]}")
        res = codec.decode_prefill_result(replies[0].value)
        if len(res.next_tokens) != len(items):
            self._lose(f"prefill: rank 0 returned {len(res.next_tokens)} tokens for {len(items)} sequences")
        return res

    def verify(self, cmd: VerifyBatch) -> VerifyResult:
        self._check_healthy()
        self.rules.check(cmd)  # ShapeError naming the rule; nothing has been sent
        # riding chunks add at most a row budget of rows: the time of a second forward
        replies = self._fan_out("Verify", codec.encode_verify(cmd), self.deadline_s * (2 if cmd.prefill else 1))
        failed = [r for r in replies if not r.ok]
        if failed and all(r.code == INVALID for r in replies):
            raise _shape_error(replies[0])  # every rank refused it before its forward
        if failed:
            self._fail_verify(cmd, self._describe(failed, self.deadline_s))
        res = codec.decode_verify_result(replies[0].value)
        rows = cmd.n * cmd.k
        if res.batch_id != cmd.batch_id or len(res.picks) != rows or len(res.accept_probs) != rows:
            self._fail_verify(
                cmd,
                f"rank 0 returned a short result: batch {res.batch_id}, {len(res.picks)} picks and "
                f"{len(res.accept_probs)} accept probabilities for {rows} rows",
            )
        if cmd.prefill and (res.prefill is None or len(res.prefill.next_tokens) != len(cmd.prefill)):
            self._fail_verify(cmd, f"rank 0 returned no picks for the {len(cmd.prefill)} chunks riding on batch {cmd.batch_id}")
        return res

    def commit(self, verdict: Verdict) -> None:
        """Send the verdict to every rank; on the session streams its acknowledgements are
        read later (see settle), over unary calls now."""
        self._check_healthy()
        what = f"verdict of batch {verdict.batch_id}"
        if self._sessions:
            self._send_owed("Commit", codec.encode_verdict(verdict), Owed(what, self._all_ranks(), verdict.batch_id))
            return
        replies = self._fan_out("Commit", codec.encode_verdict(verdict), self.deadline_s)
        failed = [r for r in replies if not r.ok]
        if failed:
            self._lose(f"{what} not acknowledged: {self._describe(failed, self.deadline_s)}")

    def listen_for_acknowledgements(self, listener: Callable[[], None]) -> None:
        self._on_acknowledged = listener

    def owes_acknowledgements(self) -> bool:
        return bool(self._owed or self._riders)

    def settle(self) -> list[int]:
        """Read every acknowledgement still owed; the batches whose verdict some rank did
        not acknowledge (the group is then unhealthy)."""
        self._read_owed()
        lost, self._unacknowledged = self._unacknowledged, []
        return lost

    def propose(self, cmd: ProposeBatch) -> ProposeResult:
        self._check_healthy()
        (reply,) = self._fan_out("Propose", codec.encode_propose(cmd), self.deadline_s, ranks=[0])
        if reply.code == INVALID:
            raise _shape_error(reply)
        if reply.code == grpc.StatusCode.INTERNAL:
            # the drafter raised; the target's state is untouched
            raise ShardError(f"propose failed: {self._describe([reply], self.deadline_s)}", state_advanced=False)
        if not reply.ok:
            self._lose(f"propose failed: {self._describe([reply], self.deadline_s)}")
        return codec.decode_propose_result(reply.value)

    def release(self, slots: list[int]) -> None:
        self._check_healthy()
        if self._sessions:  # acknowledged with the next command's reply
            self._send_owed("Release", codec.encode_release(slots), Owed(f"release of slots {slots}", self._all_ranks()))
            return
        replies = self._fan_out("Release", codec.encode_release(slots), self.deadline_s)
        self._raise_on_failure(replies, f"release of slots {slots}")

    def healthy(self) -> bool:
        return self._healthy

    def restart(self) -> None:
        """Fresh ranks (the launcher stops the old ones), Init, and healthy again."""
        self._healthy = False
        self._close_channels()
        self._start()

    def close(self) -> None:
        self._healthy = False
        self._close_channels()
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self.launcher.stop()

    # ---- start ---------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self.addresses = list(self.launcher.start())
        except Exception as e:
            raise ShardError(f"shard launcher failed: {type(e).__name__}: {e}", unhealthy=True) from e
        self._channels = [grpc.insecure_channel(a, options=CHANNEL_OPTIONS) for a in self.addresses]
        self._stubs = [pb_grpc.ShardControlStub(c) for c in self._channels]
        world = len(self.addresses)
        # The servers already listen; wait_for_ready rides out a slow first connection.
        health = self._fan_out("Health", pb.Empty(), self.init_deadline_s, wait_for_ready=True)
        self._raise_on_start_failure(health, "health check")
        address = ""
        if world > 1:
            (port,) = self._fan_out("CollectivePort", pb.Empty(), self.deadline_s, ranks=[0])
            self._raise_on_start_failure([port], "collective port")
            address = f"tcp://{self.addresses[0].rpartition(':')[0]}:{port.value.port}"
        spec = codec.encode_spec(self.spec)
        requests = [
            pb.InitRequest(
                spec=spec,
                rank=rank,
                world_size=world,
                collective_address=address,
                collective_timeout_s=self.collective_timeout_s,
            )
            for rank in range(world)
        ]
        replies = self._fan_out("Init", requests, self.init_deadline_s)
        self._raise_on_start_failure(replies, "init")
        # Every rank keeps the same layout: the pool is what the smallest rank holds (rank 0
        # also keeps a draft model's KV, and GPUs may have different memory free).
        ranks = [codec.decode_limits(r.value.limits) for r in replies]
        self.limits = replace(ranks[0], num_blocks=min(x.num_blocks for x in ranks),
                              max_model_len=min(x.max_model_len for x in ranks))
        self.drafter_info = codec.decode_drafter_info(replies[0].value.drafter)
        self._check_drafter()
        self.rules = ShapeRules.of(self.limits)
        if self.use_sessions:
            if self._watchdog is None:
                self._watchdog = Watchdog()
            self._sessions = [self._open_session(rank, reply.value) for rank, reply in enumerate(health)]
            self._watchdog.sessions = list(self._sessions)
        self.last_failure = None
        self._healthy = True
        log.info("shard group of %d ranks ready at %s (sessions over %s)", world, ", ".join(self.addresses),
                 ", ".join(self.session_transports) or "none: unary calls")

    @property
    def session_transports(self) -> list[str]:
        """Each rank's Session carrier: "socket" or "grpc"."""
        return [s.transport for s in self._sessions]

    def _open_session(self, rank: int, health: pb.HealthReply) -> Session:
        """Over the rank's session socket where it is reachable from here, else over gRPC."""
        if self.use_session_socket and health.session_socket:
            try:
                return SocketSession.connect(health.session_socket, health.session_token, rank, self.deadline_s,
                                             self.session_spin_us)
            except (OSError, EOFError) as e:  # another host or network namespace
                log.info("rank %d: session over gRPC (its socket cannot be reached from here: %s)", rank, e)
        return GrpcSession(self._stubs[rank], rank)

    def _check_drafter(self) -> None:
        """Rank 0 loaded its drafter from its own file system: say what it loaded, and warn
        when its checkpoint caps the drafts below what the scheduler was configured for."""
        info, gamma = self.drafter_info, self.spec.num_speculative_tokens
        if info.kind != "none":
            log.info("rank 0 drafter: %s from %s", info.kind, info.source)
        if info.max_drafts and gamma > info.max_drafts:
            log.warning("rank 0's %s drafter (%s) drafts at most %d tokens; num_speculative_tokens is %d",
                        info.kind, info.source, info.max_drafts, gamma)

    def _raise_on_start_failure(self, replies: list[Reply], what: str) -> None:
        failed = [r for r in replies if not r.ok]
        if failed:
            raise ShardError(f"shard group {what} failed: {self._describe(failed, self.init_deadline_s)}", unhealthy=True)

    def _close_channels(self) -> None:
        self._owed, self._riders = [], []
        if self._watchdog is not None:
            self._watchdog.sessions = []
        for session in self._sessions:
            session.close()
        self._sessions = []
        for c in self._channels:
            c.close()
        self._channels, self._stubs = [], []

    # ---- failures ------------------------------------------------------------------------

    def _fail_verify(self, cmd: VerifyBatch, cause: str) -> NoReturn:
        """The seed's ep_fail_verify_batch: the all-zero verdict to every reachable rank, then raise.
        Unary calls: a rank whose stream failed (a passed deadline) may still answer one."""
        replies = self._fan_out("Commit", codec.encode_verdict(failed_verdict(cmd.batch_id, cmd.n)),
                                self.failed_verdict_deadline_s, unary=True)
        acked = [r.rank for r in replies if r.ok]
        self._lose(
            f"verify of batch {cmd.batch_id} (n={cmd.n}, k={cmd.k}) failed on the shard group: {cause}; "
            f"the failed verdict reached ranks {acked} of {len(self._stubs)}"
        )

    def _raise_on_failure(self, replies: list[Reply], what: str) -> None:
        failed = [r for r in replies if not r.ok]
        if not failed:
            return
        if all(r.code == INVALID for r in replies):
            raise _shape_error(replies[0])  # refused alike by every rank: nothing changed anywhere
        self._lose(f"{what} failed: {self._describe(failed, self.deadline_s)}")

    def _lose(self, message: str) -> NoReturn:
        """Mark the group unhealthy and raise: a restart must come before it serves again."""
        self._healthy = False
        self.last_failure = message
        log.error("%s", message)
        raise ShardError(message, state_advanced=True, unhealthy=True)

    def _check_healthy(self) -> None:
        if not self._healthy:
            raise ShardError(f"the shard group is unhealthy and needs a restart (last failure: {self.last_failure})",
                             state_advanced=True, unhealthy=True)

    def _describe(self, failed: list[Reply], timeout: float) -> str:
        parts = []
        for r in sorted(failed, key=lambda r: r.at):
            where = f"rank {r.rank} ({self.addresses[r.rank]})"
            if r.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                parts.append(f"{where}: no answer within the {timeout:g} s deadline")
            elif r.code == grpc.StatusCode.UNAVAILABLE:
                parts.append(f"{where}: unreachable ({r.details})")
            else:
                parts.append(f"{where}: {r.code.name}: {r.details}")
        return "; ".join(parts)


def _shape_error(reply: Reply) -> ShapeError:
    rule, _, message = reply.details.partition(": ")
    return ShapeError(rule, message or reply.details)
