"""The shard server: the ShardControl gRPC service around one ModelShard (one rank).

Init builds the rank from the ShardSpec it carries, through the `build_rank` the server
was started with (the shard process composes it: tandem.shard.factory.build_rank, so this
module loads no model code of its own) and, for world_size > 1, joins the collective group (torch.distributed over tcp://: gloo on the CPU, NCCL on a GPU). The
rendezvous may take up to the Init deadline; every collective after it fails after
`collective_timeout_s`, so a rank whose peer died or hangs gives up and answers.

One command runs at a time (a lock); a command that cannot get the lock before its
deadline is answered UNAVAILABLE. The scheduler sends its tick's commands on a Session
stream (one per rank and group, see grpc_group); each has a unary RPC too. A scheduler on
the same host may open that stream on the rank's session socket instead (named in the
Health reply; tandem.rpc.session_socket): the same messages, the same code. Health never
waits. A malformed command (wrong shape, unknown slot, empty tokens) is refused with
INVALID_ARGUMENT before any state changes, and the server keeps serving; any other
failure is INTERNAL, with the exception's text.

With fault_injection=True the InjectFault RPC arms a fault for the next verify forward
(raise, hang or exit half way through the layers, or a short result): the tests' way to
lose a rank at the worst moment.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Callable, TypeVar

import grpc
import torch

from tandem.errors import ShapeError
from tandem.rpc import codec
from tandem.rpc.generated import shard_pb2 as pb
from tandem.rpc.generated import shard_pb2_grpc as pb_grpc
from tandem.rpc.limits import CHANNEL_OPTIONS
from tandem.rpc.session_socket import SessionSocketServer
from tandem.shard.commands import RankDrafterInfo, Verdict
from tandem.shard.spec import ShardSpec

T = TypeVar("T")

log = logging.getLogger("tandem.rpc.server")

_NO_DEADLINE_WAIT_S = 600.0  # how long a command without a deadline waits for the lock
_HANG_S = 3600.0  # an injected hang lasts this long (or until the process is stopped)


class _Refused(Exception):
    """Abort the RPC with this status (raised inside a command, turned into a status outside)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


# (spec, rank, world size, join: device -> the collective group) -> (the ModelShard, its drafter's info)
BuildRank = Callable[[ShardSpec, int, int, Callable[[torch.device], object]], tuple[object, RankDrafterInfo]]


class ShardServicer(pb_grpc.ShardControlServicer):
    def __init__(self, build_rank: BuildRank, *, fault_injection: bool = False):
        self.build_rank = build_rank
        self.shard = None  # the ModelShard, once Init built it
        self.rank = 0
        self.world_size = 1
        self.fault_injection = fault_injection
        self._fault = pb.FaultRequest.NONE
        self._lock = threading.Lock()
        self._verdicts = 0
        self._failed_verdicts = 0
        self._last_verdict: Verdict | None = None
        self.session_socket: SessionSocketServer | None = None  # set by start_shard_server
        # Tick command -> (message -> reply message, its field in a Session reply), for the
        # unary RPCs and the Session stream alike. Decoding runs inside the command, so a
        # message the codec refuses fails that command, not the stream.
        self._handlers: dict[str, tuple[Callable, str]] = {
            "prefill": (lambda m: codec.encode_prefill_result(self.shard.prefill(codec.decode_prefill(m))), "prefill"),
            "verify": (self._verify, "verify"),
            "commit": (lambda m: self._commit(codec.decode_verdict(m)), "done"),
            "propose": (lambda m: codec.encode_propose_result(self.shard.propose(codec.decode_propose(m))), "propose"),
            "release": (lambda m: self._release(codec.decode_release(m)), "done"),
        }

    # ---- RPCs ---------------------------------------------------------------------------

    def Init(self, request, context):
        return self._command(context, "init", lambda: self._init(request), need_shard=False)

    def CollectivePort(self, request, context):
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return pb.CollectivePortReply(port=s.getsockname()[1])

    def Prefill(self, request, context):
        return self._unary(context, "prefill", request)

    def Verify(self, request, context):
        return self._unary(context, "verify", request)

    def Commit(self, request, context):
        return self._unary(context, "commit", request)

    def Propose(self, request, context):
        return self._unary(context, "propose", request)

    def Release(self, request, context):
        return self._unary(context, "release", request)

    def Session(self, request_iterator, context):
        for cmd in request_iterator:
            yield from self._session_replies(cmd)

    def Health(self, request, context):
        shard, last = self.shard, self._last_verdict
        pending = shard.pending if shard is not None else None
        return pb.HealthReply(
            ready=shard is not None,
            rank=self.rank,
            world_size=self.world_size,
            pid=os.getpid(),
            busy=self._lock.locked(),
            pending_batch_id=pending.cmd.batch_id if pending is not None else 0,
            last_verdict_batch_id=last.batch_id if last is not None else 0,
            last_verdict_failed=last.failed if last is not None else False,
            verdicts=self._verdicts,
            failed_verdicts=self._failed_verdicts,
            session_socket=self.session_socket.name if self.session_socket is not None else "",
            session_token=self.session_socket.token if self.session_socket is not None else b"",
        )

    def InjectFault(self, request, context):
        if not self.fault_injection:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "fault injection is off (start the shard with --fault-injection)")
        self._fault = request.mode
        log.warning("rank %d: fault %s armed for the next verify", self.rank, pb.FaultRequest.Mode.Name(request.mode))
        return pb.Empty()

    # ---- commands -----------------------------------------------------------------------

    def _command(self, context, what: str, run: Callable, *, need_shard: bool = True):
        """Run one command under the lock; map its failure onto a gRPC status."""
        remaining = context.time_remaining()
        result, code, message = self._execute(what, run, remaining, need_shard=need_shard)
        if code is None:
            return result
        context.abort(code, message)

    def _execute(self, what: str, run: Callable, remaining: float | None, *, need_shard: bool = True):
        """(result, None, "") or (None, status code, why): one command under the lock."""
        if not self._lock.acquire(timeout=_lock_wait(remaining)):
            return self._busy(what)
        try:
            return self._run_locked(what, run, need_shard=need_shard)
        finally:
            self._lock.release()

    def _busy(self, what: str):
        return None, grpc.StatusCode.UNAVAILABLE, f"rank {self.rank}: busy with an earlier command past the {what} deadline"

    def _run_locked(self, what: str, run: Callable, *, need_shard: bool = True):
        """_execute's work, the lock already held."""
        try:
            if need_shard and self.shard is None:
                raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{what} before Init")
            return run(), None, ""
        except _Refused as e:
            return None, e.code, str(e)
        except ShapeError as e:
            return None, grpc.StatusCode.INVALID_ARGUMENT, str(e)
        except Exception as e:  # noqa: BLE001 - the caller gets every failure, with its cause
            log.exception("rank %d: %s failed", self.rank, what)
            return None, grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}"

    def _unary(self, context, kind: str, request):
        run, _ = self._handlers[kind]
        return self._command(context, kind, lambda: run(request))

    def _session_replies(self, cmd: pb.Command):
        """A Session command's replies: its riders' (each run first, in order), then its
        own. A verify whose forward the device queues (a GPU) is queued before the riders'
        replies are sent: the sends, and the scheduler's reading of them, overlap it."""
        riders = [self._session_command(rider, rider=True) for rider in cmd.before]
        if riders and cmd.WhichOneof("command") == "verify" and self.shard is not None and self.shard.forward_is_async:
            yield from self._verify_behind_riders(cmd, riders)
            return
        yield from riders
        yield self._session_command(cmd)

    def _verify_behind_riders(self, cmd: pb.Command, riders: list[pb.CommandReply]):
        if not self._lock.acquire(timeout=_lock_wait(cmd.timeout_s or None)):
            yield from riders
            yield _reply("verify", *self._busy("verify"))
            return
        try:  # the lock is held from the launch to the read-back, across the riders' sends
            finish, code, message = self._run_locked("verify", lambda: self._verify_begin(cmd.verify))
            yield from riders
            result = None
            if code is None:
                result, code, message = self._run_locked("verify", finish)
            yield _reply("verify", result, code, message)
        finally:
            self._lock.release()

    def _session_command(self, cmd: pb.Command, *, rider: bool = False) -> pb.CommandReply:
        """One command of a Session stream: the same work as its unary RPC, the failure
        status in the reply instead of ending the call (the stream stays open)."""
        kind = cmd.WhichOneof("command")
        if kind is None:
            return pb.CommandReply(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], details="command: none given")
        if rider and cmd.before:
            return pb.CommandReply(code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                   details="command.before: a rider carries no riders of its own")
        run, field = self._handlers[kind]
        return _reply(field, *self._execute(kind, lambda: run(getattr(cmd, kind)), cmd.timeout_s or None))

    def _init(self, request) -> pb.InitReply:
        if self.shard is not None:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"rank {self.rank} is already initialised")
        spec, rank, world = codec.decode_spec(request.spec), request.rank, request.world_size
        if world < 1 or not 0 <= rank < world:
            raise ShapeError("0<=rank<world_size", f"rank {rank} of world size {world}")
        shard, drafter = on_a_thread_of_its_own(
            lambda: self.build_rank(spec, rank, world, lambda device: _join_collective_group(request, device)))
        self.rank, self.world_size = rank, world
        self.shard = shard
        return pb.InitReply(limits=codec.encode_limits(shard.limits), drafter=codec.encode_drafter_info(drafter))

    def _verify(self, cmd) -> pb.VerifyResult:
        return self._verify_begin(cmd)()

    def _verify_begin(self, cmd) -> Callable[[], pb.VerifyResult]:
        """Queue the forward of a VerifyBatch message; the call returned gives its reply."""
        with self._armed_fault():
            finish = self.shard.verify_begin(codec.decode_verify(cmd))

        def result() -> pb.VerifyResult:
            res = finish()
            if self._take_fault(pb.FaultRequest.SHORT_RESULT):
                res = replace(res, picks=res.picks[:-1])
            return codec.encode_verify_result(res)

        return result

    def _commit(self, verdict: Verdict) -> pb.Empty:
        pending = self.shard.pending
        if verdict.failed and (pending is None or pending.cmd.batch_id != verdict.batch_id):
            pass  # this rank's forward failed and kept nothing: nothing to drop
        else:
            self.shard.commit(verdict)
        self._verdicts += 1
        self._failed_verdicts += verdict.failed
        self._last_verdict = verdict
        return pb.Empty()

    def _release(self, slots: list[int]) -> pb.Empty:
        self.shard.release(slots)
        return pb.Empty()

    # ---- fault injection ----------------------------------------------------------------

    def _take_fault(self, mode: int) -> bool:
        if self._fault != mode:
            return False
        self._fault = pb.FaultRequest.NONE
        return True

    @contextmanager
    def _armed_fault(self):
        """An armed raise/hang/exit fires in the middle layer of the next verify forward."""
        if self._fault not in (pb.FaultRequest.RAISE, pb.FaultRequest.HANG, pb.FaultRequest.EXIT):
            yield
            return
        layers = self.shard.model.model.layers
        handle = layers[len(layers) // 2].register_forward_pre_hook(lambda module, args: self._fire())
        try:
            yield
        finally:
            handle.remove()

    def _fire(self) -> None:
        mode, self._fault = self._fault, pb.FaultRequest.NONE
        where = f"injected fault on rank {self.rank} half way through the verify forward"
        log.warning("%s: %s", where, pb.FaultRequest.Mode.Name(mode))
        if mode == pb.FaultRequest.EXIT:
            os._exit(17)
        if mode == pb.FaultRequest.HANG:
            time.sleep(_HANG_S)  # until the process is stopped
            raise RuntimeError(f"{where}: hung for {_HANG_S:.0f} s")
        raise RuntimeError(f"{where}: raise")


def _lock_wait(remaining: float | None) -> float:
    """How long a command with `remaining` seconds to its deadline may wait for the lock."""
    return _NO_DEADLINE_WAIT_S if remaining is None else max(0.0, remaining - 0.05)


def _reply(field: str, result, code: grpc.StatusCode | None, message: str) -> pb.CommandReply:
    """A Session reply: the result in its field, or the failure status."""
    if code is not None:
        return pb.CommandReply(code=code.value[0], details=message)
    return pb.CommandReply(**{field: result})


def _join_collective_group(request, device: torch.device):
    """Rendezvous at rank 0's address (may take up to the Init deadline), then a group of
    all ranks whose collectives time out after collective_timeout_s."""
    import torch.distributed as dist

    backend = request.backend or ("nccl" if device.type == "cuda" else "gloo")
    collective_timeout = timedelta(seconds=request.collective_timeout_s or 60.0)
    if dist.is_initialized():
        raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, "this process already joined a collective group")
    dist.init_process_group(
        backend,
        init_method=request.collective_address,
        rank=request.rank,
        world_size=request.world_size,
        timeout=max(collective_timeout, timedelta(minutes=5)),
    )
    return dist.new_group(ranks=list(range(request.world_size)), timeout=collective_timeout, backend=backend)


class ShardServer:
    """A rank's gRPC server and its session socket: stop() ends both."""

    def __init__(self, server: grpc.Server, session_socket: SessionSocketServer, servicer: ShardServicer):
        self.grpc = server
        self.session_socket = session_socket
        self.servicer = servicer  # its rank, once Init built it

    def stop(self, grace: float | None):
        """As grpc.Server.stop (its event is returned); the socket's streams end at once."""
        self.session_socket.close()
        return self.grpc.stop(grace)


def on_a_thread_of_its_own(fn: Callable[[], T]) -> T:
    """fn() on a new thread that ends with it. libgomp gives each thread that enters a
    parallel region a team of its own, which lives as long as that thread: a rank built on
    a gRPC pool thread (which lives on) left its team beside the one the forward thread
    makes, the process then had more OpenMP threads than cores, and libgomp stopped
    spinning between parallel regions: a 1-row CPU forward of the default model took 24.9
    ms in the shard process against 16.0 in process (bench/verify_legs.py)."""
    out: list = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            out.append((False, e))

    t = threading.Thread(target=run, name="shard-build")
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


def start_shard_server(build_rank: BuildRank, bind: str = "127.0.0.1:0", *,
                       fault_injection: bool = False) -> tuple[ShardServer, str]:
    """Start a shard server on `bind` (port 0 = any free port) and its session socket,
    whose Init builds its rank with `build_rank`; returns it and its address (bind's host
    with the bound port: a caller that bound 0.0.0.0 substitutes its own IP)."""
    servicer = ShardServicer(build_rank, fault_injection=fault_injection)
    servicer.session_socket = SessionSocketServer(servicer._session_replies)  # the Session RPC's own code
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="shard-rpc"),
        options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_ShardControlServicer_to_server(servicer, server)
    port = server.add_insecure_port(bind)
    if port == 0:
        servicer.session_socket.close()
        raise OSError(f"shard server: cannot bind {bind}")
    server.start()
    host = bind.rpartition(":")[0]
    return ShardServer(server, servicer.session_socket, servicer), f"{host}:{port}"
