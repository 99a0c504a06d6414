"""The Python API over Ray: start a tandem engine as actors and talk to it.

    import ray, tandem.actors as ta
    ray.init()                                   # or ta.init_local_ray()
    llm = ta.start(model="smollm2", tensor_parallel=2)
    print(llm.generate("The capital of France is", max_tokens=16).text)
    for out in llm.stream("Once upon a time", max_tokens=32):
        print(out.delta_text, end="", flush=True)
    llm.shutdown()

A TandemHandle pickles (it holds an actor handle), so Ray tasks and actors elsewhere
in the program can use it; a named engine (start(name=...)) is found again with
connect(name). Errors come out as tandem's own: InvalidRequestError for bad input,
EngineUnavailableError while the shard group recovers; a request whose batch failed
returns (or ends its stream with) an output whose finish_reason is "error".
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import math
import pickle
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator

from tandem.actors import output_channel
from tandem.actors.scheduler_actor import SchedulerActor, SchedulerSettings, error_output
from tandem.actors.wire import as_received, from_wire, merge
from tandem.config import EngineConfig
from tandem.errors import EngineUnavailableError, InvalidRequestError, TandemError
from tandem.outputs import RequestOutput
from tandem.sampling_params import SamplingParams

_SAMPLING_FIELDS = {f for f in SamplingParams.__dataclass_fields__}


def start(
    model: str | None = None,
    tensor_parallel: int = 1,
    drafter: str = "ngram",
    *,
    name: str | None = None,
    namespace: str | None = "tandem",
    served_model_name: str | None = None,
    scheduler_num_cpus: float = 0.25,
    shard_num_gpus: float | None = None,
    shard_num_cpus: float = 0.5,
    shard_torch_threads: int | None = None,
    rpc_deadline_s: float = 30.0,
    fault_injection: bool = False,
    in_process_target: bool = False,
    session_socket: bool = True,
    session_spin_us: int | None = None,
    ready_timeout_s: float = 600.0,
    **engine_options,
) -> "TandemHandle":
    """Start a SchedulerActor (and through it `tensor_parallel` ShardActors in a placement
    group) in the connected Ray cluster; returns once the model is loaded.

    engine_options are EngineConfig fields (num_speculative_tokens, max_num_seqs,
    max_seq_len, row_budget, draft_model, adaptive, device, dtype, ...). shard_num_gpus is
    what each ShardActor reserves (None: 1 when the cluster has GPUs, else 0).
    in_process_target keeps a single rank inside the scheduler actor (no shard actors, no
    gRPC, no recovery; the actor then reserves shard_num_gpus itself): the control path
    without a process hop, for a single rank whose loss may take the engine with it.
    session_socket=False sends the tick's commands over gRPC even to shard actors on the
    scheduler's node (by default they go over each rank's Unix session socket there).
    session_spin_us: how long the scheduler and each such rank busy-poll that socket for
    the next message before they block (None: 20 ms where a process may use 8 cores or
    more, counting its container's CPU quota, else 0): 0.1-0.2 ms off every tick on an
    H200 host, for a core each kept busy while requests run."""
    import ray

    config = EngineConfig(model=model, drafter=drafter, shards=tensor_parallel, **engine_options)
    if shard_num_gpus is None:
        shard_num_gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    settings = SchedulerSettings(
        engine=config,
        served_model_name=served_model_name,
        rpc_deadline_s=rpc_deadline_s,
        shard_num_gpus=shard_num_gpus,
        shard_num_cpus=shard_num_cpus,
        shard_torch_threads=shard_torch_threads,
        fault_injection=fault_injection,
        in_process_target=in_process_target,
        session_socket=session_socket,
        session_spin_us=session_spin_us,
    )
    options = {"num_cpus": scheduler_num_cpus, "max_concurrency": 4096, "max_restarts": 0}
    if in_process_target and shard_num_gpus:
        options["num_gpus"] = shard_num_gpus  # the rank, and with it the GPU, lives in this actor
    if name is not None:
        options["name"] = name
        if namespace is not None:
            options["namespace"] = namespace
    actor = ray.remote(SchedulerActor).options(**options).remote(settings)
    info = ray.get(actor.ready.remote(), timeout=ready_timeout_s)
    return TandemHandle(actor, info)


def connect(name: str, namespace: str | None = "tandem") -> "TandemHandle":
    """A handle on an engine started elsewhere with start(name=..., namespace=...) (a served
    app's engine_actor_name lives in the namespace "tandem")."""
    import ray

    actor = ray.get_actor(name, namespace=namespace)
    return TandemHandle(actor, ray.get(actor.ready.remote()))


def sampling_params(params: SamplingParams | None = None, **kwargs) -> SamplingParams:
    """SamplingParams from keyword arguments (max_tokens=..., temperature=..., ...)."""
    if params is not None:
        if kwargs:
            raise TypeError("give either params or sampling keyword arguments, not both")
        return params
    unknown = set(kwargs) - _SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling arguments: {sorted(unknown)}")
    return SamplingParams(**kwargs)


def _tandem_error(e: Exception) -> Exception:
    """tandem's error for what a call on the scheduler actor raised: the actor's own
    exception where it is tandem's; EngineUnavailableError once the actor is gone (under
    Serve a new engine replica is on its way: a client should retry, not give up)."""
    import ray

    # (a RayTaskError may also pass for its cause's class: an actor the scheduler called died)
    if isinstance(e, ray.exceptions.RayActorError) and not isinstance(e, ray.exceptions.RayTaskError):
        return EngineUnavailableError(f"the engine's scheduler actor is gone ({type(e).__name__}); "
                                      "a served app starts a new one")
    cause = getattr(e, "cause", None)  # Ray wraps an actor's exception
    return cause if isinstance(cause, TandemError) else e


def _engine_gone(e: Exception) -> bool:
    """Whether a broken output stream says the scheduler actor is gone: its socket reset
    or closed mid-frame, or Ray's stream from it (or the call that opens it) lost the actor."""
    import ray

    if isinstance(e, EngineUnavailableError):
        return True
    return isinstance(e, (OSError, EOFError, ray.exceptions.RayActorError)) and not isinstance(
        e, ray.exceptions.RayTaskError)


class _tandem_errors:
    """`with` or `async with` around calls on the scheduler actor: what they raise comes
    out as _tandem_error makes it."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        import ray

        if isinstance(e, (ray.exceptions.RayTaskError, ray.exceptions.RayActorError)):
            raise _tandem_error(e) from None
        return False

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, e, tb):
        return self.__exit__(kind, e, tb)


class _Multiplexer:
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

    def __init__(self, actor, direct: bool = True):
        self.actor = actor
        self.direct = direct
        self.subscriber = f"sub-{uuid.uuid4().hex}"
        self.queues: dict[str, asyncio.Queue] = {}
        self.pump: asyncio.Task | None = None
        self._subscribed = asyncio.Event()  # submissions wait until outputs have somewhere to go
        self._to_submit: list[tuple[tuple, asyncio.Future]] = []
        self._submitting = False
        self._writer: asyncio.StreamWriter | None = None  # the socket, while the subscription is one
        self._batches = itertools.count()
        self._replies: dict[int, asyncio.Future] = {}  # batch number -> its SUBMITTED reply
        self._waiting_since = 0.0  # perf_counter when the oldest request in _to_submit came

    @property
    def over_socket(self) -> bool:
        return self._writer is not None

    def _ensure_pump(self) -> None:
        if self.pump is None or self.pump.done():
            self._subscribed.clear()
            self.pump = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        why = "the engine's output stream ended"
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
            else:
                gen = self.actor.subscribe.options(num_returns="streaming").remote(self.subscriber)
                self._subscribed.set()  # outputs before the generator runs wait in the actor
                async for ref in gen:
                    self._route(await ref)
        except Exception as e:  # noqa: BLE001 - every waiting request learns of it
            why = f"the engine's output stream failed: {type(e).__name__}: {e}"
            if not _engine_gone(e):
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

        async with _tandem_errors():
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

    async def _submit_batch(self, requests: list[tuple]) -> list:
        """One submission: what each request failed with, or None."""
        writer = self._writer
        if writer is None:
            async with _tandem_errors():
                return await self.actor.submit_many.remote(requests, self.subscriber)
        return await self._write_submission(requests)

    def _write_submission(self, requests: list[tuple]) -> asyncio.Future:
        """Send a submission over the socket now; the future of its SUBMITTED reply.
        Raises (and sends nothing) when a request does not pickle."""
        batch = next(self._batches)
        data = output_channel.frame(output_channel.SUBMIT, (batch, requests))
        reply = self._replies[batch] = asyncio.get_running_loop().create_future()
        self._writer.write(data)
        return reply

    async def _submit_each_alone_if_unpicklable(self, requests: list[tuple]) -> list:
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
        return [bad[i] if i in bad else next(kept) for i in range(len(requests))]

    async def stream(self, prompt, params: SamplingParams, rid: str, messages,
                     deltas_only: bool) -> AsyncIterator[RequestOutput]:
        self._ensure_pump()
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        finished = False
        whole = as_received(deltas_only)
        try:
            await self._submit((prompt, params, rid, messages))
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

    async def _submit(self, request: tuple) -> None:
        """Submit one request (coalesced with others, see the class); raise what it failed with."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if not self._to_submit:
            self._waiting_since = time.perf_counter()
        self._to_submit.append((request, done))
        if not self._submitting:
            self._submitting = True
            loop.create_task(self._send_submissions())
        elif self._writer is not None and time.perf_counter() - self._waiting_since >= _SEND_AFTER_S:
            self._send_waiting_now()
        error = await done
        if error is not None:
            raise error

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
                    errors = await self._submit_each_alone_if_unpicklable([r for r, _ in batch])
                except Exception as e:  # noqa: BLE001 - the call failed: each of its requests learns
                    errors = [e] * len(batch)
                _settle(batch, errors)
        finally:
            self._submitting = False


_SEND_AFTER_S = 0.001  # the longest a request waits behind a submission on its way (socket)


def _settle(batch: list[tuple[tuple, asyncio.Future]], errors: list) -> None:
    """Each submitted request learns what it failed with (None: the engine took it)."""
    for (_, done), error in zip(batch, errors):
        if not done.done():
            done.set_result(error)


def _settle_from_reply(batch: list[tuple[tuple, asyncio.Future]], reply: asyncio.Future) -> None:
    if reply.cancelled():
        _settle(batch, [ConnectionError("the submission was cancelled")] * len(batch))
    elif reply.exception() is not None:
        _settle(batch, [reply.exception()] * len(batch))
    else:
        _settle(batch, reply.result())


class TandemHandle:
    """generate / stream (blocking) and agenerate / astream (asyncio) on one engine.

    `prompt` is a string or a list of token ids; give `messages` instead (OpenAI-style
    chat messages) to use the model's chat template. Sampling is SamplingParams or its
    fields as keyword arguments.

    By default each stream is its own Ray streaming generator. multiplexed() gives a
    handle whose astream()s and agenerate()s share one subscription (per handle and
    event loop): what a server with many concurrent requests should use. On the engine's
    node its outputs come over a Unix socket unless direct=False (then, as elsewhere,
    over a Ray stream).

    Calls raise tandem's errors (tandem.errors): InvalidRequestError for bad input,
    EngineUnavailableError while the shard group recovers and once the scheduler actor
    is gone (a served app then starts a new engine)."""

    def __init__(self, actor, info: dict, multiplex: bool = False, direct: bool = True):
        self.actor = actor
        self.info = info
        self.multiplex = multiplex
        self.direct = direct
        # one subscription per event loop: its pump task and request queues belong to that
        # loop (a second loop, in another thread, must not share them)
        self._muxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _mux(self) -> _Multiplexer:
        loop = asyncio.get_running_loop()
        mux = self._muxes.get(loop)
        if mux is None:
            mux = self._muxes[loop] = _Multiplexer(self.actor, self.direct)
        return mux

    def multiplexed(self, direct: bool = True) -> "TandemHandle":
        return TandemHandle(self.actor, self.info, multiplex=True, direct=direct)

    def __getstate__(self):
        return {"actor": self.actor, "info": self.info, "multiplex": self.multiplex, "direct": self.direct}

    def __setstate__(self, state):
        self.__init__(state["actor"], state["info"], state["multiplex"], state.get("direct", True))

    @property
    def model_name(self) -> str:
        return self.info["model"]

    # ---- blocking ---------------------------------------------------------------------

    def generate(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                 request_id: str | None = None, **sampling) -> RequestOutput:
        import ray

        sp = sampling_params(params, **sampling)
        with _tandem_errors():
            return ray.get(self.actor.generate.remote(prompt, sp, request_id, messages))

    def stream(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
               request_id: str | None = None, deltas_only: bool = False, **sampling) -> Iterator[RequestOutput]:
        """Outputs as they are produced (each with delta_text / delta_token_ids); the last
        has finished=True. Leaving the loop early aborts the request. With deltas_only,
        outputs before the last leave text and token_ids empty (no O(length) copy a token:
        what a consumer that forwards deltas wants)."""
        import ray

        sp = sampling_params(params, **sampling)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        gen = self.actor.stream.options(num_returns="streaming").remote(prompt, sp, rid, messages)
        finished = False
        whole = as_received(deltas_only)
        try:
            with _tandem_errors():
                for ref in gen:
                    out = from_wire(ray.get(ref))
                    finished = out.finished
                    yield whole(out)
        finally:
            if not finished:
                self.actor.abort.remote(rid)

    def chat(self, messages: list[dict], params: SamplingParams | None = None, **sampling) -> RequestOutput:
        return self.generate(None, params, messages=messages, **sampling)

    # ---- asyncio ------------------------------------------------------------------------

    async def agenerate(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                        request_id: str | None = None, **sampling) -> RequestOutput:
        sp = sampling_params(params, **sampling)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if self.multiplex:
            # the shared subscription: a burst of requests goes in few submissions and is
            # prefilled together, as streams are; the last output is whole
            out = None
            async for out in self._mux().stream(prompt, sp, rid, messages, True):
                pass
            return out
        ref = self.actor.generate.remote(prompt, sp, rid, messages)
        try:
            async with _tandem_errors():
                return await ref
        except BaseException:
            self.actor.abort.remote(rid)  # cancelled (client gone) or failed: free its slot
            raise

    async def astream(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                      request_id: str | None = None, deltas_only: bool = False,
                      **sampling) -> AsyncIterator[RequestOutput]:
        """stream() for asyncio."""
        sp = sampling_params(params, **sampling)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if self.multiplex:
            async for out in self._mux().stream(prompt, sp, rid, messages, deltas_only):
                yield out
            return
        gen = self.actor.stream.options(num_returns="streaming").remote(prompt, sp, rid, messages)
        finished = False
        whole = as_received(deltas_only)
        try:
            async with _tandem_errors():
                async for ref in gen:
                    out = from_wire(await ref)
                    finished = out.finished
                    yield whole(out)
        finally:
            if not finished:
                self.actor.abort.remote(rid)

    # ---- operations ---------------------------------------------------------------------

    def health(self) -> dict:
        import ray

        return ray.get(self.actor.health.remote())

    async def ahealth(self) -> dict:
        async with _tandem_errors():
            return await self.actor.health.remote()

    async def ametrics(self) -> bytes:
        async with _tandem_errors():
            return await self.actor.metrics.remote()

    def metrics_text(self) -> str:
        import ray

        return ray.get(self.actor.metrics.remote()).decode()

    def shard_actors(self) -> list:
        import ray

        return ray.get(self.actor.shard_actors.remote())

    def pause(self) -> None:
        """Stop stepping after the current tick (fault tests, draining)."""
        import ray

        ray.get(self.actor.pause.remote())

    def resume(self) -> None:
        import ray

        ray.get(self.actor.resume.remote())

    def shutdown(self) -> None:
        """Stop the engine and its shard actors."""
        import ray

        try:
            ray.get(self.actor.shutdown.remote(), timeout=60)
        finally:
            ray.kill(self.actor)


_REQUEST_FIELDS = ("prompt", "params", "request_id", "messages")  # a submitted request's tuple


def _unpicklable(request: tuple) -> InvalidRequestError | None:
    """The error for a request whose field cannot cross to the engine, or None."""
    for name, value in zip(_REQUEST_FIELDS, request):
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - whatever pickling raises, the field is the cause
            return InvalidRequestError(name, f"cannot be sent to the engine ({type(e).__name__}: {e})")
    return None
