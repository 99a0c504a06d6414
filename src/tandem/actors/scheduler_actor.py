"""SchedulerActor: an async Ray actor that owns the Engine and runs its step loop.

The engine runs on a GrpcShardGroup whose ranks are ShardActors (RayShardLauncher).
A background thread calls engine.step() while there is work and hands the outputs on
(also those the engine emits from inside the next tick, once the ranks have acknowledged
the verdicts: see tandem.release) through OutputRoutes: those of a subscriber connected
to the actor's output socket (tandem.actors.output_channel) it writes there itself; the
others go to the actor's event loop, which puts each into its request's asyncio queue or
its subscriber's: `stream` is a Ray streaming generator over a request's queue, `subscribe`
over a subscriber's, `generate` waits for the last output. Requests join between ticks
(continuous batching).

Recovery is the engine's: a lost rank fails its batch (those requests get an output
with finish_reason "error"), the next tick restarts the group through the launcher and
re-prefills the others. While it recovers, new requests raise EngineUnavailableError.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from tandem.actors import engine_status
from tandem.actors.admissions import Admissions
from tandem.actors.output_routes import OutputRoutes
from tandem.actors.replica_report import ReplicaReporter, wait_drained
from tandem.actors.settings import SchedulerSettings
from tandem.actors.wire import merge, to_wire, to_wire_on
from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.intake import Admission, Request
from tandem.outputs import RequestOutput, Usage

log = logging.getLogger("tandem.actors")

_INLINE_PROMPT_LEN = 4096  # a batch whose prompts total this many characters or token ids at most is added by the step thread


class SchedulerActor:
    """Create with ray.remote(SchedulerActor) (see tandem.actors.handle.start)."""

    def __init__(self, settings: SchedulerSettings):
        self.settings = settings
        self._outputs = OutputRoutes(self.submit_many, self._abort_subscriber)  # the engine's sink
        self.engine, self.launcher = self._build_engine(settings)
        self._reporter = ReplicaReporter(self.engine, self.launcher, self._outputs.channels)  # load, prefixes, draining
        self.model_name = settings.served_model_name or self.engine.model_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tandem-admit")
        self._wake = threading.Event()
        # short submissions are added by the step thread between ticks
        self._admissions = Admissions(self.engine.add_requests, lambda rid: self._pool.submit(self.engine.abort, rid),
                                      self._wake)
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
            return Engine.from_config(s.engine, progress=False, sink=self._outputs.deliver), _NoLauncher()
        launcher = RayShardLauncher(
            s.engine.shards,
            num_gpus=s.shard_num_gpus,
            num_cpus=s.shard_num_cpus,
            torch_threads=s.shard_torch_threads,
            fault_injection=s.fault_injection,
        )
        options = dict(deadline_s=s.rpc_deadline_s, init_deadline_s=s.init_deadline_s,
                       session_socket=s.session_socket, session_spin_us=s.session_spin_us)
        engine = Engine.from_config(s.engine, progress=False, sink=self._outputs.deliver, launcher=launcher,
                                    group_options=options)
        return engine, launcher

    # ---- the step loop ------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._outputs.start(self._loop)
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
                self._outputs.deliver(outs)
            self._reporter.after_tick()
            if self.engine.recovering:
                time.sleep(1.0)  # the restart failed; the next tick tries again

    def _fail_all(self, why: str) -> list[RequestOutput]:
        outs = []
        for rid in self._outputs.live():
            self.engine.abort(rid)
            outs.append(error_output(rid, why))
        return outs

    # ---- requests -----------------------------------------------------------------------

    async def _add(self, request: Request) -> tuple[str, asyncio.Queue]:
        """Start one request with a queue of its own: its id and the queue."""
        (admission,) = await self._add_many([request], None)
        if not admission.taken:
            raise admission.error
        return admission.request_id, self._outputs.queues[admission.request_id]

    async def _add_many(self, requests: list[Request], subscriber: str | None) -> list[Admission]:
        """Start requests, their outputs routed to `subscriber` (None: a queue each): per
        request its Admission. The engine takes them in one call, so they share a prefill
        even when a tick is running (see Engine.add_requests)."""
        self._ensure_started()
        e = self.engine
        if not e.available or self._reporter.draining:
            why = "this engine replica is draining" if self._reporter.draining else "the shard group is recovering"
            return [Admission(error=EngineUnavailableError(f"{why}; retry shortly")) for _ in requests]
        results: list[Admission | None] = [None] * len(requests)
        taken: list[tuple[int, Request]] = []  # (index, what the engine gets: the request with its id)
        ids: set[str] = set()
        for i, r in enumerate(requests):
            try:
                if r.messages is not None and r.prompt is not None:
                    raise InvalidRequestError("messages", "give either a prompt or messages, not both")
                if not r.request_id:  # None or empty: a name of its own
                    r = dataclasses.replace(r, request_id=f"req-{uuid.uuid4().hex}")
                if self._outputs.is_open(r.request_id) or r.request_id in ids:
                    raise InvalidRequestError("request_id", f"{r.request_id!r} is already running")
            except Exception as err:  # noqa: BLE001 - that request's error alone
                results[i] = Admission(error=err)
                continue
            ids.add(r.request_id)
            taken.append((i, r))
        # routes first: a tick on the step thread may have outputs for them before the
        # engine's answer reaches this loop
        for _, r in taken:
            self._outputs.open(r.request_id, subscriber)
        batch = [r for _, r in taken]
        try:
            if sum(_size(r.prompt, r.messages) for r in batch) > _INLINE_PROMPT_LEN:
                # tokenizing (or checking) long prompts takes a while: on a pool thread,
                # not the step thread, whose ticks would wait for it
                added = await self._loop.run_in_executor(self._pool, e.add_requests, batch)
            else:
                added = await self._admissions.submit(batch)
        except BaseException:
            for r in batch:
                self._outputs.close(r.request_id)
            raise
        self._reporter.admitted(batch, added)
        for (i, r), admission in zip(taken, added):
            results[i] = admission
            if not admission.taken:
                self._outputs.close(r.request_id)
            elif not self._outputs.is_open(r.request_id):
                # its caller left while it waited (its subscriber's routes were dropped)
                self._pool.submit(e.abort, r.request_id)
        self._wake.set()
        return results

    async def generate(self, request: Request) -> RequestOutput:
        """Run one request to the end; its final output (finish_reason "error" with `error` set
        when its batch failed)."""
        rid, q = await self._add(request)
        out = None
        try:
            while out is None or not out.finished:
                out = await q.get()
            return out
        finally:
            await self._forget(rid, out is not None and out.finished)

    async def generate_many(self, requests: list[Request]) -> list[RequestOutput]:
        """Run requests admitted together (the n choices of one, see tandem.choices) to the
        end; their final outputs in order. Raises the first refusal, the others aborted."""
        admissions = await self._add_many(requests, None)
        rids = [a.request_id for a in admissions if a.taken]
        failed = next((a.error for a in admissions if not a.taken), None)
        if failed is not None:
            for rid in rids:
                await self._forget(rid, False)
            raise failed
        finals: dict[str, RequestOutput] = {}

        async def run_to_end(rid: str) -> None:
            q, out = self._outputs.queues[rid], None
            try:
                while out is None or not out.finished:
                    out = await q.get()
                finals[rid] = out
            finally:
                await self._forget(rid, out is not None and out.finished)

        await asyncio.gather(*(run_to_end(rid) for rid in rids))
        return [finals[rid] for rid in rids]

    async def tokenize(self, prompt: str | None = None, messages: list[dict] | None = None, **options) -> list[int]:
        """The ids a request of this prompt or conversation generates from (tandem.tokenize_text)."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: self.engine.tokenize(prompt, messages=messages, **options))

    async def detokenize(self, tokens: list[int]) -> str:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.engine.detokenize, tokens)

    async def stream(self, request: Request):
        """Yield the request's outputs as they come (call with num_returns="streaming");
        outputs that piled up since the last yield come merged into one. Before the last,
        they carry deltas only (see tandem.actors.wire)."""
        rid, q = await self._add(request)
        finished, first = False, True
        try:
            while not finished:
                outs = await _drain(q)
                finished = outs[-1].finished
                yield to_wire(merge(outs), first)
                first = False
        finally:
            await self._forget(rid, finished)

    async def submit_many(self, requests: list[Request], subscriber: str = "") -> list[Admission]:
        """Start requests whose outputs go to the subscription `subscriber` (see
        subscribe): per request its Admission, taken or with the error it was refused
        with (InvalidRequestError, EngineUnavailableError, ...). One bad request harms
        none of the others; the rest share a prefill."""
        return await self._add_many(requests, subscriber)

    async def subscribe(self, subscriber: str):
        """One stream for all requests submitted under `subscriber` (call with
        num_returns="streaming"): each item is a list of wire outputs, one per request
        that made progress, merged, in order, as deltas (see tandem.actors.wire). A server
        with many streams pays one Ray item per tick instead of one per request. Closing
        it aborts the subscriber's requests."""
        self._ensure_started()
        q = self._outputs.subscriber_queue(subscriber)
        started: set[str] = set()  # requests that have had an output on this stream
        try:
            while True:
                outs = await _drain(q)
                by_request: dict[str, list[RequestOutput]] = {}
                for out in outs:
                    by_request.setdefault(out.request_id, []).append(out)
                yield [to_wire_on(merge(v), started) for v in by_request.values()]
        finally:
            self._outputs.subscribers.pop(subscriber, None)
            await self._abort_subscriber(subscriber)

    async def _abort_subscriber(self, subscriber: str) -> None:
        """The subscriber went away: stop generating for its requests."""
        rids = self._outputs.drop_subscriber(subscriber)
        if rids:
            await self._loop.run_in_executor(self._pool, lambda: [self.engine.abort(rid) for rid in rids])

    async def output_channel(self) -> dict:
        """Where a subscriber on this node reads its outputs from a socket instead of
        `subscribe` (see tandem.actors.output_channel): this actor's node and the path."""
        import ray

        self._ensure_started()
        return {"node_id": ray.get_runtime_context().get_node_id(), "path": self._outputs.channels.path}

    async def _forget(self, rid: str, finished: bool) -> None:
        self._outputs.queues.pop(rid, None)
        if not finished:  # the caller went away (or was cancelled): stop generating for it
            await self._loop.run_in_executor(self._pool, self.engine.abort, rid)

    async def abort(self, request_id: str) -> bool:
        self._ensure_started()
        return await self._loop.run_in_executor(self._pool, self.engine.abort, request_id)

    # ---- operations ---------------------------------------------------------------------

    async def ready(self) -> dict:
        """Starts the step loop; what clients need to know about the served model."""
        self._ensure_started()
        return engine_status.served_model(self.engine, self.model_name)

    async def health(self) -> dict:
        return engine_status.health(self.engine, self._restarts(), self.ticks, self.step_seconds)

    async def metrics(self) -> bytes:
        """The engine's Prometheus counters, in the text exposition format."""
        return engine_status.metrics(self.engine, self._restarts(), self.ticks, self.step_seconds,
                                     self._reporter.load_tokens)

    async def report(self) -> dict:
        """This replica's load, availability and cached prefixes (tandem.actors.replica_report)."""
        return self._reporter.report()

    async def drain(self, timeout_s: float) -> int:
        """Take no more requests and wait (up to timeout_s) for those held to end; how many are left."""
        self._reporter.draining = True
        self._reporter.changed()
        return await wait_drained(self._outputs.live, self.engine.has_unfinished, timeout_s)

    def _restarts(self) -> int:
        return max(0, self.launcher.generation - 1)

    async def shard_actors(self) -> list:
        """The live ShardActor handles in rank order (operations and fault tests)."""
        return list(self.launcher.actors)

    async def pause(self) -> None:
        """Stop stepping after the tick in progress (returns once it has ended)."""
        self._ensure_started()
        self._paused = True
        await self._loop.run_in_executor(self._pool, _wait_for, self._step_lock)
        # the last tick's outputs wait for no next tick
        self._outputs.deliver(await self._loop.run_in_executor(self._pool, self.engine.flush), on_loop=True)

    async def resume(self) -> None:
        self._paused = False
        self._wake.set()

    async def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            await self._loop.run_in_executor(self._pool, self._thread.join, 30.0)
        self._admissions.fail_waiting(EngineUnavailableError("the server is shutting down"))
        self._outputs.deliver([error_output(rid, "the server is shutting down") for rid in self._outputs.live()],
                              on_loop=True)
        self._outputs.channels.close()
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
            return 0  # not a list of dicts: the engine refuses it at once
    return len(prompt) if isinstance(prompt, (str, list)) else 0


def _wait_for(lock: threading.Lock) -> None:
    with lock:
        pass


def error_output(rid: str, why: str) -> RequestOutput:
    return RequestOutput(
        request_id=rid, prompt=None, prompt_token_ids=[], text="", token_ids=[], delta_text="", delta_token_ids=[],
        finished=True, finish_reason="error", error=why, usage=Usage(0, 0),
    )
