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
import dataclasses
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator

from tandem.actors.multiplexer import Multiplexer
from tandem.actors.ray_errors import tandem_errors
from tandem.actors.scheduler_actor import SchedulerActor
from tandem.actors.settings import SETTINGS_FIELDS, SchedulerSettings
from tandem.actors.wire import as_received, from_wire
from tandem.config import EngineConfig
from tandem.intake import Request
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
    ready_timeout_s: float = 600.0,
    **options,
) -> "TandemHandle":
    """Start a SchedulerActor (and through it `tensor_parallel` ShardActors in a placement
    group) in the connected Ray cluster; returns once the model is loaded.

    `options` are EngineConfig fields (num_speculative_tokens, max_num_seqs, max_model_len,
    device, dtype, ...) and SchedulerSettings fields (tandem.actors.settings: placement,
    deadlines, the session socket, in_process_target), each with its own default;
    shard_num_gpus not given is 1 when the cluster has GPUs, else 0."""
    import ray

    settings = settings_from(dict(options, model=model, drafter=drafter, shards=tensor_parallel))
    if "shard_num_gpus" not in options:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        settings = dataclasses.replace(settings, shard_num_gpus=gpus)
    actor_options = {"num_cpus": settings.scheduler_num_cpus, "max_concurrency": 4096, "max_restarts": 0}
    if settings.in_process_target and settings.shard_num_gpus:
        actor_options["num_gpus"] = settings.shard_num_gpus  # the rank, and with it the GPU, lives in this actor
    if name is not None:
        actor_options["name"] = name
        if namespace is not None:
            actor_options["namespace"] = namespace
    actor = ray.remote(SchedulerActor).options(**actor_options).remote(settings)
    info = ray.get(actor.ready.remote(), timeout=ready_timeout_s)
    return TandemHandle(actor, info)


def settings_from(options: dict) -> SchedulerSettings:
    """SchedulerSettings from EngineConfig and SchedulerSettings fields given by name."""
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = set(options) - engine_fields - set(SETTINGS_FIELDS)
    if unknown:
        raise TypeError(f"unknown engine options: {', '.join(sorted(unknown))}")
    engine = EngineConfig(**{k: v for k, v in options.items() if k in engine_fields})
    return SchedulerSettings(engine=engine, **{k: v for k, v in options.items() if k in SETTINGS_FIELDS})


def connect(name: str, namespace: str | None = "tandem") -> "TandemHandle":
    """A handle on an engine started elsewhere with start(name=..., namespace=...) (a served
    app's engine_actor_name lives in the namespace "tandem")."""
    import ray

    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:  # a served app of several engine replicas names them name/<replica>: the first
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["namespace"] == namespace and a["name"].startswith(name + "/"))
        if not names:
            raise
        actor = ray.get_actor(names[0], namespace=namespace)
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


def _request(prompt, params: SamplingParams | None, messages: list[dict] | None, request_id: str | None,
             sampling: dict) -> Request:
    """What a handle call sends: its sampling from params or keyword arguments, and an id
    (its own, else a new one) by which its outputs are routed and it is aborted."""
    return Request(prompt, sampling_params(params, **sampling), request_id or f"req-{uuid.uuid4().hex}", messages)


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

    def __init__(self, actor, info: dict, multiplex: bool = False, direct: bool = True, on_report=None):
        self.actor = actor
        self.info = info
        self.multiplex = multiplex
        self.direct = direct
        self.on_report = on_report  # the multiplexed subscription's replica reports go here
        # one subscription per event loop: its pump task and request queues belong to that
        # loop (a second loop, in another thread, must not share them)
        self._muxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _mux(self) -> Multiplexer:
        loop = asyncio.get_running_loop()
        mux = self._muxes.get(loop)
        if mux is None:
            mux = self._muxes[loop] = Multiplexer(self.actor, self.direct, self.on_report)
        return mux

    def multiplexed(self, direct: bool = True, on_report=None) -> "TandemHandle":
        """A handle over one shared subscription; `on_report` gets the engine's reports of
        its load after every tick (tandem.actors.replica_report) where the outputs come
        over its socket."""
        return TandemHandle(self.actor, self.info, multiplex=True, direct=direct, on_report=on_report)

    @property
    def outputs_over_socket(self) -> bool:
        """Whether this event loop's shared subscription reads the engine's socket (same node), not Ray."""
        return self._mux().over_socket

    def subscribe_now(self):
        """Open this event loop's shared subscription before any request; its pump task."""
        return self._mux().connect()

    def __getstate__(self):
        return {"actor": self.actor, "info": self.info, "multiplex": self.multiplex, "direct": self.direct}

    def __setstate__(self, state):
        self.__init__(state["actor"], state["info"], state["multiplex"], state.get("direct", True))

    @property
    def model_name(self) -> str:
        return self.info["model"]

    @property
    def max_model_len(self) -> int:
        return self.info["max_model_len"]

    # ---- blocking ---------------------------------------------------------------------

    def generate(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                 request_id: str | None = None, **sampling) -> RequestOutput:
        import ray

        request = _request(prompt, params, messages, request_id, sampling)
        with tandem_errors():
            return ray.get(self.actor.generate.remote(request))

    def stream(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
               request_id: str | None = None, deltas_only: bool = False, **sampling) -> Iterator[RequestOutput]:
        """Outputs as they are produced (each with delta_text / delta_token_ids); the last
        has finished=True. Leaving the loop early aborts the request. With deltas_only,
        outputs before the last leave text and token_ids empty (no O(length) copy a token:
        what a consumer that forwards deltas wants)."""
        import ray

        request = _request(prompt, params, messages, request_id, sampling)
        gen = self.actor.stream.options(num_returns="streaming").remote(request)
        finished = False
        whole = as_received(deltas_only)
        try:
            with tandem_errors():
                for ref in gen:
                    out = from_wire(ray.get(ref))
                    finished = out.finished
                    yield whole(out)
        finally:
            if not finished:
                self.actor.abort.remote(request.request_id)

    def chat(self, messages: list[dict], params: SamplingParams | None = None, **sampling) -> RequestOutput:
        return self.generate(None, params, messages=messages, **sampling)

    # ---- asyncio ------------------------------------------------------------------------

    async def agenerate(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                        request_id: str | None = None, **sampling) -> RequestOutput:
        request = _request(prompt, params, messages, request_id, sampling)
        if self.multiplex:
            # the shared subscription: a burst of requests goes in few submissions and is
            # prefilled together, as streams are; the last output is whole
            out = None
            async for out in self._mux().stream(request, True):
                pass
            return out
        ref = self.actor.generate.remote(request)
        try:
            async with tandem_errors():
                return await ref
        except BaseException:
            self.actor.abort.remote(request.request_id)  # cancelled (client gone) or failed: free its slot
            raise

    async def astream(self, prompt=None, params: SamplingParams | None = None, *, messages: list[dict] | None = None,
                      request_id: str | None = None, deltas_only: bool = False,
                      **sampling) -> AsyncIterator[RequestOutput]:
        """stream() for asyncio."""
        request = _request(prompt, params, messages, request_id, sampling)
        if self.multiplex:
            async for out in self._mux().stream(request, deltas_only):
                yield out
            return
        gen = self.actor.stream.options(num_returns="streaming").remote(request)
        finished = False
        whole = as_received(deltas_only)
        try:
            async with tandem_errors():
                async for ref in gen:
                    out = from_wire(await ref)
                    finished = out.finished
                    yield whole(out)
        finally:
            if not finished:
                self.actor.abort.remote(request.request_id)

    # ---- several requests admitted together (n choices: tandem.choices.choice_requests) ----

    def generate_many(self, requests: list[Request]) -> list[RequestOutput]:
        """Run requests that the engine admits together to the end; their final outputs
        in order. The first refusal raises (the others are aborted)."""
        import ray

        with tandem_errors():
            return ray.get(self.actor.generate_many.remote(list(requests)))

    async def agenerate_many(self, requests: list[Request]) -> list[RequestOutput]:
        if not self.multiplex:
            async with tandem_errors():
                return await self.actor.generate_many.remote(list(requests))
        finals: dict[str, RequestOutput] = {}
        async for out in self._mux().stream_many(list(requests), True):
            if out.finished:
                finals[out.request_id] = out
        return [finals[r.request_id] for r in requests]

    async def astream_many(self, requests: list[Request], deltas_only: bool = False) -> AsyncIterator[RequestOutput]:
        """The outputs of requests admitted together, each naming its request (request_id),
        interleaved as they come; ends once all have finished. Always over this event
        loop's shared subscription (see multiplexed())."""
        async for out in self._mux().stream_many(list(requests), deltas_only):
            yield out

    # ---- tokenizer (what /tokenize and /detokenize serve) --------------------------------

    def tokenize(self, prompt: str | None = None, *, messages: list[dict] | None = None, **options) -> list[int]:
        """The ids a request of `prompt` (or of `messages`, through the chat template)
        generates from; options: tools, add_generation_prompt, add_special_tokens."""
        import ray

        with tandem_errors():
            return ray.get(self.actor.tokenize.remote(prompt, messages, **options))

    async def atokenize(self, prompt: str | None = None, *, messages: list[dict] | None = None, **options) -> list[int]:
        async with tandem_errors():
            return await self.actor.tokenize.remote(prompt, messages, **options)

    def detokenize(self, tokens: list[int]) -> str:
        import ray

        with tandem_errors():
            return ray.get(self.actor.detokenize.remote(list(tokens)))

    async def adetokenize(self, tokens: list[int]) -> str:
        async with tandem_errors():
            return await self.actor.detokenize.remote(list(tokens))

    # ---- operations ---------------------------------------------------------------------

    def health(self) -> dict:
        import ray

        return ray.get(self.actor.health.remote())

    async def ahealth(self) -> dict:
        async with tandem_errors():
            return await self.actor.health.remote()

    async def areport(self) -> dict:
        """The engine's load, availability and cached prefix keys (tandem.actors.replica_report)."""
        async with tandem_errors():
            return await self.actor.report.remote()

    async def adrain(self, timeout_s: float) -> int:
        """Take no more requests; wait up to timeout_s for the held ones to end; how many are left."""
        async with tandem_errors():
            return await self.actor.drain.remote(timeout_s)

    async def ametrics(self) -> bytes:
        async with tandem_errors():
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

