"""The Ray Serve application: FastAPI ingress replicas in front of one engine.

build_app(args) is the builder that `import_path: tandem.serve:build_app` names in a
Serve YAML config (serve run, KubeRay's serveConfigV2). It binds two deployments:
- tandem-engine, one replica that starts the engine (tandem.actors.start) when it is
  constructed, so the engine's actors live as long as that replica;
- tandem-openai, the HTTP ingress: `ingress_replicas` replicas, each with its own
  subscription to that engine (taken again from tandem-engine when the engine is lost:
  FollowedEngine). More than one takes a burst's HTTP on several processes at once
  (Serve's HAProxy mode puts them behind one port).
Both replicas reserve no CPU (num_cpus: 0); the engine's actors reserve what
TandemServeArgs says.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

import ray
from ray import serve

from tandem.errors import EngineUnavailableError
from tandem.serve.args import TandemServeArgs

log = logging.getLogger("tandem.serve")

ENGINE_NAMESPACE = "tandem"  # where a named scheduler actor (engine_actor_name) lives
INGRESS_DEPLOYMENT = "tandem-openai"
ENGINE_DEPLOYMENT = "tandem-engine"


class TandemEngine:
    """Owns the engine: its SchedulerActor and, through it, the shard actors."""

    def __init__(self, args: dict):
        from tandem.actors.handle import start

        a = TandemServeArgs.model_validate(args)
        self.handle = start(tensor_parallel=a.tensor_parallel_size, name=a.engine_actor_name, namespace=ENGINE_NAMESPACE,
                            **a.engine_options(), **a.settings_options())
        log.info("engine up: %s", self.handle.model_name)

    async def engine_handle(self):
        """The engine's TandemHandle, for an ingress replica. A dead engine hands out
        nothing: the asking replica (starting, or following a lost engine) asks again, by
        when this replica has failed its health check and a new engine is coming up."""
        await self.handle.ahealth()
        return self.handle

    async def check_health(self) -> None:
        """Serve's health check: raises when the scheduler actor is gone, so Serve replaces
        this replica and with it the engine. A recovering engine is healthy."""
        await self.handle.ahealth()

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                handle.shutdown()
            except Exception as e:  # noqa: BLE001 - the actors die with this replica anyway
                log.debug("engine shutdown: %s", e)


class FollowedEngine:
    """What an ingress replica serves: the engine's multiplexed handle, taken again from
    the engine deployment once its scheduler actor is gone (Serve then replaces the engine
    replica, whose health check fails). Meanwhile this replica stays up and answers 503
    with Retry-After itself: were it to fail its health check too, Serve would restart
    it, and until a replica is back HAProxy and Serve's proxy answer in plain text or hold
    the request."""

    def __init__(self, engine, handle):
        self.engine = engine  # the engine deployment's DeploymentHandle
        self.handle = handle.multiplexed()
        self._following: asyncio.Task | None = None

    @property
    def model_name(self) -> str:
        return self.handle.model_name

    @property
    def max_model_len(self) -> int:
        return self.handle.max_model_len

    async def agenerate(self, *args, **kwargs):
        async with self._noticing_loss():
            return await self.handle.agenerate(*args, **kwargs)

    async def astream(self, *args, **kwargs):
        async with self._noticing_loss(), contextlib.aclosing(self.handle.astream(*args, **kwargs)) as outs:
            async for out in outs:  # (aclosing: a client that leaves aborts its request at once)
                yield out

    async def agenerate_many(self, *args, **kwargs):
        async with self._noticing_loss():
            return await self.handle.agenerate_many(*args, **kwargs)

    async def astream_many(self, *args, **kwargs):
        async with self._noticing_loss(), contextlib.aclosing(self.handle.astream_many(*args, **kwargs)) as outs:
            async for out in outs:
                yield out

    async def atokenize(self, *args, **kwargs):
        async with self._noticing_loss():
            return await self.handle.atokenize(*args, **kwargs)

    async def adetokenize(self, *args, **kwargs):
        async with self._noticing_loss():
            return await self.handle.adetokenize(*args, **kwargs)

    async def ahealth(self) -> dict:
        async with self._noticing_loss():
            return await self.handle.ahealth()

    async def ametrics(self) -> bytes:
        async with self._noticing_loss():
            return await self.handle.ametrics()

    @contextlib.asynccontextmanager
    async def _noticing_loss(self):
        try:
            yield
        except (EngineUnavailableError, ray.exceptions.RayActorError):
            self.follow()  # the engine may be gone: look for the one that replaces it
            raise

    def follow(self) -> None:
        """Take the engine deployment's handle again, in the background, unless already on it."""
        if self._following is None or self._following.done():
            self._following = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                handle = await self.engine.engine_handle.remote()
                break
            except Exception as e:  # noqa: BLE001 - the old engine replica, dead engine and all, still answers
                log.debug("no engine yet: %s", e)
                await asyncio.sleep(1.0)
        if handle.actor != self.handle.actor:  # (ActorHandle compares by actor id)
            self.handle = handle.multiplexed()
            log.info("serving the new engine of %s", self.handle.model_name)


@serve.ingress()
class OpenAIIngress:
    async def __init__(self, args: dict, engine):
        self.args = TandemServeArgs.model_validate(args)
        # waits while the engine replica loads the model; all HTTP streams of this replica
        # share one output stream: a socket on the engine's node, else Ray
        self.engine = FollowedEngine(engine, await engine.engine_handle.remote())
        log.info("serving %s", self.engine.model_name)

    def __serve_build_asgi_app__(self):
        from tandem.serve.api import create_app

        from tandem.serve.limits import ServeLimits

        return create_app(self.engine, api_key=self.args.api_key, limits=ServeLimits.from_args(self.args))

    async def check_health(self) -> None:
        """Healthy while the engine is replaced (FollowedEngine answers 503 meanwhile); a
        lost engine found here is followed even when no request came."""
        try:
            await self.engine.ahealth()
        except (EngineUnavailableError, ray.exceptions.RayActorError) as e:
            log.info("the engine is unavailable (%s); following its replacement", e)


def build_app(args: dict | TandemServeArgs | None = None):
    """Serve builder: args (validated as TandemServeArgs) -> the bound application."""
    if isinstance(args, TandemServeArgs):
        args = args.model_dump()
    parsed = TandemServeArgs.model_validate(args or {})
    checks = {"health_check_period_s": 10, "health_check_timeout_s": 30}
    engine = serve.deployment(
        TandemEngine,
        name=ENGINE_DEPLOYMENT,
        num_replicas=1,  # one engine per app; scale with more apps
        ray_actor_options={"num_cpus": 0},
        **checks,
    )
    ingress = serve.deployment(
        OpenAIIngress,
        name=INGRESS_DEPLOYMENT,
        num_replicas=parsed.ingress_replicas,
        max_ongoing_requests=parsed.max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
        **checks,
    )
    values = parsed.model_dump()
    return ingress.bind(values, engine.bind(values))
