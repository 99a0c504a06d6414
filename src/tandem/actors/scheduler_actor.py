"""SchedulerActor: an async Ray actor that owns the Engine and runs its step loop.

The engine runs on a GrpcShardGroup whose ranks are ShardActors (RayShardLauncher).
A background thread calls engine.step() while there is work and hands the outputs on
(also those the engine emits from inside the next tick, once the ranks have acknowledged
the verdicts: see tandem.release). Those of a subscriber connected to the actor's output
socket (tandem.actors.output_channel) it writes there itself; the others go to the
actor's event loop, which puts each into its request's asyncio queue or its
subscriber's: `stream` is a Ray streaming generator over a request's queue, `subscribe`
over a subscriber's, `generate` waits for the last output. Requests join between ticks
(continuous batching).

Recovery is the engine's: a lost rank fails its batch (those requests get an output
with finish_reason "error"), the next tick restarts the group through the launcher and
re-prefills the others. While it recovers, new requests raise EngineUnavailableError.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tandem.actors.admissions import Admissions
from tandem.actors.output_channel import OutputChannels
from tandem.actors.wire import merge, to_wire, to_wire_on
from tandem.config import EngineConfig
from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.intake import Request
from tandem.outputs import RequestOutput, Usage
from tandem.sampling_params import SamplingParams

log = logging.getLogger("tandem.actors")

_INLINE_PROMPT_LEN = 4096  # a batch whose prompts total this many characters or token ids at most is added by the step thread


@dataclass(frozen=True)
class SchedulerSettings:
    """What a SchedulerActor is built from: the engine config and how its ranks are placed."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = None  # the model id clients use; default: the model's name
    rpc_deadline_s: float = 30.0  # deadline of each shard RPC
    init_deadline_s: float = 300.0  # deadline of a rank's Init (model load)
    shard_num_gpus: float = 0.0
    shard_num_cpus: float = 0.5
    shard_torch_threads: int | None = None  # None: the node's cores / ranks on CPU
    fault_injection: bool = False  # let tests make a rank fail on purpose
    in_process_target: bool = False  # one rank inside this actor (LocalShardGroup), no shard actors
    session_socket: bool = True  # the tick's commands to ranks on this host over their session socket
    session_spin_us: int | None = None  # busy-poll of those sockets; None: where there are cores to spare


class SchedulerActor:
    """Create with ray.remote(SchedulerActor) (see tandem.actors.handle.start)."""

    def __init__(self, settings: SchedulerSettings):
        self.settings = settings
        self.engine, self.launcher = self._build_engine(settings)
        self.model_name = settings.served_model_name or self.engine.model_name
        self._queues: dict[str, asyncio.Queue] = {}  # request id -> its own stream's queue
        self._subscribers: dict[str, asyncio.Queue] = {}  # subscriber id -> the queue of all its requests
        self._routes: dict[str, str] = {}  # request id -> subscriber id
        self._channels = OutputChannels(self.submit_many, self._abort_subscriber)  # subscribers on this node, over a socket
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tandem-admit")
        self._wake = threading.Event()
        # short submissions are added by the step thread between ticks
        self._admissions = Admissions(self._take, lambda rid: self._pool.submit(self.engine.abort, rid), self._wake)
        self._step_lock = threading.Lock()  # held for each tick; pause() takes it to wait for a tick to end
        self._paused = False
        self._stopped = False
        self.ticks = 0
        self.step_seconds = 0.0  # time spent inside engine.step()

    def _build_engine(self, s: SchedulerSettings):
        """The engine through Engine.from_config, as everywhere: its ranks are shard actors,
        or one rank in this actor; a tick's outputs go without waiting for the next tick's end."""
        from tandem.actors.launcher import RayShardLauncher
        from tandem.engine import Engine

        if s.in_process_target:
            if s.engine.shards != 1:
                raise ValueError("an in-process target has one rank (tensor_parallel 1)")
            if s.shard_torch_threads:
                import torch

                torch.set_num_threads(s.shard_torch_threads)
            return Engine.from_config(s.engine, progress=False, sink=self._deliver), _NoLauncher()
        launcher = RayShardLauncher(
            s.engine.shards,
            num_gpus=s.shard_num_gpus,
            num_cpus=s.shard_num_cpus,
            torch_threads=s.shard_torch_threads,
            fault_injection=s.fault_injection,
        )
        options = dict(deadline_s=s.rpc_deadline_s, init_deadline_s=s.init_deadline_s,
                       session_socket=s.session_socket, session_spin_us=s.session_spin_us)
        engine = Engine.from_config(s.engine, progress=False, sink=self._deliver, launcher=launcher, group_options=options)
        return engine, launcher

    # ---- the step loop ------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._channels.start(self._loop)
            self._thread = threading.Thread(target=self._run, name="tandem-step-loop", daemon=True)
            self._thread.start()

    def _has_work(self) -> bool:
        return self.engine.has_unfinished() or not self.engine.available

    def _run(self) -> None:
        while not self._stopped:
            self._admissions.take_waiting()  # also while paused: a submission never waits for resume()
            if self._paused or not self._has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            with self._step_lock:
                if self._paused:
                    continue
                t0 = time.perf_counter()
                try:
                    outs = self.engine.step()
                except Exception as e:  # noqa: BLE001 - a broken tick must not leave clients hanging
                    log.exception("engine step failed")
                    outs = self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                self.ticks += 1
                self.step_seconds += time.perf_counter() - t0
            if outs:
                self._deliver(outs)
            if self.engine.recovering:
                time.sleep(1.0)  # the restart failed; the next tick tries again

    def _deliver(self, outs: list[RequestOutput], *, on_loop: bool = False) -> None:
        """The outputs of socket subscribers straight to their sockets, the rest to the
        event loop (_dispatch): at once when called on it, else handed over. The engine's
        sink too, from inside a tick (the step thread)."""
        rest = self._channels.send(outs, self._routes)
        if rest and on_loop:
            self._dispatch(rest)
        elif rest:
            self._loop.call_soon_threadsafe(self._dispatch, rest)

    def _fail_all(self, why: str) -> list[RequestOutput]:
        outs = []
        for rid in [*self._queues, *self._routes]:
            self.engine.abort(rid)
            outs.append(error_output(rid, why))
        return outs

    def _dispatch(self, outs: list[RequestOutput]) -> None:
        """The event loop: each output to its request's queue or its subscriber's."""
        for out in outs:
            rid = out.request_id
            q = self._queues.get(rid)
            if q is None and rid in self._routes:
                q = self._subscribers.setdefault(self._routes[rid], asyncio.Queue())
                if out.finished:
                    del self._routes[rid]
            if q is not None:
                q.put_nowait(out)

    # ---- requests -----------------------------------------------------------------------

    async def _add(self, prompt, params: SamplingParams | None, request_id: str | None, messages: list[dict] | None,
                   subscriber: str | None = None) -> tuple[str, asyncio.Queue | None]:
        """Start one request: its id and, without a subscriber, its own queue."""
        (result,) = await self._add_many([(prompt, params, request_id, messages)], subscriber)
        if isinstance(result, Exception):
            raise result
        return result

    async def _add_many(self, requests: list[tuple], subscriber: str | None) -> list:
        """Start requests, each (prompt, params, request_id, messages): per request (its
        id, its queue or None) or the error it failed with. The engine takes them in one
        call, so they share a prefill even when a tick is running (see Engine.add_requests)."""
        self._ensure_started()
        e = self.engine
        if not e.available:
            return [EngineUnavailableError("the shard group is recovering; retry shortly") for _ in requests]
        results: list = [None] * len(requests)
        taken: list[tuple[int, str, tuple]] = []  # (index, request id, what the engine gets)
        ids: set[str] = set()
        for i, (prompt, params, request_id, messages) in enumerate(requests):
            try:
                if messages is not None and prompt is not None:
                    raise InvalidRequestError("messages", "give either a prompt or messages, not both")
                rid = request_id or f"req-{uuid.uuid4().hex}"
                if rid in self._queues or rid in self._routes or rid in ids:
                    raise InvalidRequestError("request_id", f"{rid!r} is already running")
            except Exception as err:  # noqa: BLE001 - that request's error alone
                results[i] = err
                continue
            ids.add(rid)
            taken.append((i, rid, (prompt, params, rid, messages)))
        # routes first: a tick on the step thread may have outputs for them before the
        # engine's answer reaches this loop
        for i, rid, _ in taken:
            results[i] = (rid, self._open(rid, subscriber))
        batch = [t[2] for t in taken]
        try:
            if sum(_size(p, m) for p, _, _, m in batch) > _INLINE_PROMPT_LEN:
                # tokenizing (or checking) long prompts takes a while: on a pool thread,
                # not the step thread, whose ticks would wait for it
                added = await self._loop.run_in_executor(self._pool, self._take, batch)
            else:
                added = await self._admissions.submit(batch)
        except BaseException:
            for _, rid, _ in taken:
                self._close(rid)
            raise
        for (i, rid, _), result in zip(taken, added):
            if isinstance(result, Exception):
                self._close(rid)
                results[i] = result
            elif rid not in self._queues and rid not in self._routes:
                # its caller left while it waited (its subscriber's routes were dropped)
                self._pool.submit(e.abort, rid)
        self._wake.set()
        return results

    def _take(self, batch: list[tuple]) -> list:
        """Add requests, each (prompt, params, request_id, messages), to the engine: per
        request its id or the error it was refused with."""
        admissions = self.engine.add_requests([Request(*r) for r in batch])
        return [a.request_id if a.taken else a.error for a in admissions]

    def _open(self, rid: str, subscriber: str | None) -> asyncio.Queue | None:
        """Where the request's outputs go: its own queue, or its subscriber's stream."""
        if subscriber is not None:
            self._routes[rid] = subscriber
            return None
        q = self._queues[rid] = asyncio.Queue()
        return q

    def _close(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self._routes.pop(rid, None)

    async def generate(self, prompt=None, params: SamplingParams | None = None, request_id: str | None = None,
                       messages: list[dict] | None = None) -> RequestOutput:
        """Run one request to the end; its final output (finish_reason "error" with `error` set
        when its batch failed)."""
        rid, q = await self._add(prompt, params, request_id, messages)
        out = None
        try:
            while out is None or not out.finished:
                out = await q.get()
            return out
        finally:
            await self._forget(rid, out is not None and out.finished)

    async def stream(self, prompt=None, params: SamplingParams | None = None, request_id: str | None = None,
                     messages: list[dict] | None = None):
        """Yield the request's outputs as they come (call with num_returns="streaming");
        outputs that piled up since the last yield come merged into one. Before the last,
        they carry deltas only (see tandem.actors.wire)."""
        rid, q = await self._add(prompt, params, request_id, messages)
        finished, first = False, True
        try:
            while not finished:
                outs = await _drain(q)
                finished = outs[-1].finished
                yield to_wire(merge(outs), first)
                first = False
        finally:
            await self._forget(rid, finished)

    async def submit_many(self, requests: list[tuple], subscriber: str = "") -> list[Exception | None]:
        """Start requests, each (prompt, params, request_id, messages), whose outputs go to
        the subscription `subscriber` (see subscribe): what each failed with
        (InvalidRequestError, EngineUnavailableError, ...), or None once the engine has
        taken it. One bad request harms none of the others; the rest share a prefill."""
        results = await self._add_many(requests, subscriber)
        return [r if isinstance(r, Exception) else None for r in results]

    async def subscribe(self, subscriber: str):
        """One stream for all requests submitted under `subscriber` (call with
        num_returns="streaming"): each item is a list of wire outputs, one per request
        that made progress, merged, in order, as deltas (see tandem.actors.wire). A server
        with many streams pays one Ray item per tick instead of one per request. Closing
        it aborts the subscriber's requests."""
        self._ensure_started()
        q = self._subscribers.setdefault(subscriber, asyncio.Queue())
        started: set[str] = set()  # requests that have had an output on this stream
        try:
            while True:
                outs = await _drain(q)
                by_request: dict[str, list[RequestOutput]] = {}
                for out in outs:
                    by_request.setdefault(out.request_id, []).append(out)
                yield [to_wire_on(merge(v), started) for v in by_request.values()]
        finally:
            self._subscribers.pop(subscriber, None)
            await self._abort_subscriber(subscriber)

    async def _abort_subscriber(self, subscriber: str) -> None:
        """The subscriber went away: stop generating for its requests. Their routes go
        first, all at once, so no later output of theirs is queued for nobody."""
        rids = [r for r, sid in list(self._routes.items()) if sid == subscriber]
        for rid in rids:
            self._routes.pop(rid, None)
        if rids:
            await self._loop.run_in_executor(self._pool, lambda: [self.engine.abort(rid) for rid in rids])

    async def output_channel(self) -> dict:
        """Where a subscriber on this node reads its outputs from a socket instead of
        `subscribe` (see tandem.actors.output_channel): this actor's node and the path."""
        import ray

        self._ensure_started()
        return {"node_id": ray.get_runtime_context().get_node_id(), "path": self._channels.path}

    async def _forget(self, rid: str, finished: bool) -> None:
        self._queues.pop(rid, None)
        if not finished:  # the caller went away (or was cancelled): stop generating for it
            await self._loop.run_in_executor(self._pool, self.engine.abort, rid)

    async def abort(self, request_id: str) -> bool:
        self._ensure_started()
        return await self._loop.run_in_executor(self._pool, self.engine.abort, request_id)

    # ---- operations ---------------------------------------------------------------------

    async def ready(self) -> dict:
        """Starts the step loop; what clients need to know about the served model."""
        self._ensure_started()
        lim = self.engine.group.limits
        return {
            "model": self.model_name,
            "max_seq_len": lim.max_seq_len,
            "vocab_size": lim.vocab_size,
            "tensor_parallel_size": lim.world_size,
            "has_chat_template": bool(getattr(self.engine.tokenizer, "chat_template", None)),
        }

    async def health(self) -> dict:
        e = self.engine
        recovering = not e.available
        return {
            "status": "recovering" if recovering else "ok",
            "recovering": recovering,
            "running": len(e.scheduler.running),
            "waiting": len(e.scheduler.waiting),
            "restarts": max(0, self.launcher.generation - 1),
            "ticks": self.ticks,
            "step_seconds": self.step_seconds,
            # each rank's command stream: "socket" (same node), "grpc", or none in process
            "shard_sessions": list(getattr(e.group, "session_transports", [])),
        }

    async def metrics(self) -> bytes:
        """The engine's Prometheus counters, in the text exposition format."""
        from prometheus_client import generate_latest

        return generate_latest(self.engine.metrics.registry) + self._own_metrics()

    def _own_metrics(self) -> bytes:
        e = self.engine
        lines = [
            "# HELP tandem:num_requests_running Sequences holding a KV slot.",
            "# TYPE tandem:num_requests_running gauge",
            f"tandem:num_requests_running {len(e.scheduler.running)}",
            "# HELP tandem:num_requests_waiting Sequences waiting for a KV slot.",
            "# TYPE tandem:num_requests_waiting gauge",
            f"tandem:num_requests_waiting {len(e.scheduler.waiting)}",
            "# HELP tandem:shard_group_restarts Restarts of the shard group after a lost rank.",
            "# TYPE tandem:shard_group_restarts counter",
            f"tandem:shard_group_restarts_total {max(0, self.launcher.generation - 1)}",
            "# HELP tandem:engine_ticks Engine steps run by the scheduler actor.",
            "# TYPE tandem:engine_ticks counter",
            f"tandem:engine_ticks_total {self.ticks}",
            "# HELP tandem:engine_step_seconds Seconds spent inside engine steps.",
            "# TYPE tandem:engine_step_seconds counter",
            f"tandem:engine_step_seconds_total {self.step_seconds}",
            "",
        ]
        return "\n".join(lines).encode()

    async def shard_actors(self) -> list:
        """The live ShardActor handles in rank order (operations and fault tests)."""
        return list(self.launcher.actors)

    async def pause(self) -> None:
        """Stop stepping after the tick in progress (returns once it has ended)."""
        self._ensure_started()
        self._paused = True
        await self._loop.run_in_executor(self._pool, _wait_for, self._step_lock)
        # the last tick's outputs wait for no next tick
        self._deliver(await self._loop.run_in_executor(self._pool, self.engine.flush), on_loop=True)

    async def resume(self) -> None:
        self._paused = False
        self._wake.set()

    async def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            await self._loop.run_in_executor(self._pool, self._thread.join, 30.0)
        self._admissions.fail_waiting(EngineUnavailableError("the server is shutting down"))
        self._deliver([error_output(rid, "the server is shutting down") for rid in [*self._queues, *self._routes]], on_loop=True)
        self._channels.close()
        self.engine.close()
        self.launcher.stop()


class _NoLauncher:
    """The launcher of an in-process target: no actors, never restarted."""

    actors: list = []
    generation = 1

    def stop(self) -> None:
        pass


async def _drain(q: asyncio.Queue) -> list:
    """The next item, and every item that piled up behind it."""
    items = [await q.get()]
    while not q.empty():
        items.append(q.get_nowait())
    return items


def _size(prompt, messages) -> int:
    """About how long a request's prompt is, in characters or token ids, before its chat
    template is applied."""
    if messages is not None:
        try:
            return sum(len(str(m.get("content") or "")) for m in messages)
        except (TypeError, AttributeError):
            return 0  # not a list of dicts: _take refuses it at once
    return len(prompt) if isinstance(prompt, (str, list)) else 0


def _wait_for(lock: threading.Lock) -> None:
    with lock:
        pass


def error_output(rid: str, why: str) -> RequestOutput:
    return RequestOutput(
        request_id=rid, prompt=None, prompt_token_ids=[], text="", token_ids=[], delta_text="", delta_token_ids=[],
        finished=True, finish_reason="error", error=why, usage=Usage(0, 0),
    )
