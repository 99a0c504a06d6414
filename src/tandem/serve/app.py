"""The Ray Serve application: FastAPI ingress replicas in front of the engine replicas.

build_app(args) is the builder that `import_path: tandem.serve:build_app` names in a
Serve YAML config (serve run, KubeRay's serveConfigV2). It binds two deployments:
- tandem-engine, `engine_replicas` replicas (or as many as `autoscaling` says), each of
  which starts an engine (tandem.actors.start: its scheduler actor and shard actors in a
  placement group of its own) when it is constructed, so the engine's actors live as
  long as that replica; a replica being removed drains its engine first;
- tandem-openai, the HTTP ingress: `ingress_replicas` replicas, each routing every
  request to one engine replica over its own subscription to each (RoutedEngines). More
  than one takes a burst's HTTP on several processes at once (Serve's HAProxy mode puts
  them behind one port).
Requests do not pass through tandem-engine: the ingress talks to the scheduler actors
(over a socket on the same node), which is why the routing is tandem's own rather than
Serve's request router, which routes Serve calls. Both deployments reserve no CPU
(num_cpus: 0); the engine's actors reserve what TandemServeArgs says.
"""
from __future__ import annotations

import asyncio
import logging

import ray
from ray import serve

from tandem.errors import EngineUnavailableError
from tandem.serve.args import TandemServeArgs
from tandem.serve.routed_engines import ENGINE_NAMESPACE, RoutedEngines

log = logging.getLogger("tandem.serve")

INGRESS_DEPLOYMENT = "tandem-openai"
ENGINE_DEPLOYMENT = "tandem-engine"


def engine_base_name(a: TandemServeArgs, app_name: str) -> str:
    """What the app's scheduler actors are named after (RoutedEngines finds them by it)."""
    return a.engine_actor_name or f"tandem-engine.{app_name}"


def _engine_actor_name(a: TandemServeArgs) -> str:
    ctx = serve.get_replica_context()
    base = engine_base_name(a, ctx.app_name)
    if a.engine_actor_name and a.fixed_single_engine:
        return base  # one engine: the name given, as tandem.actors.connect(name) expects
    return f"{base}/{ctx.replica_id.unique_id}"


class TandemEngine:
    """Owns one engine: its SchedulerActor and, through it, the shard actors."""

    def __init__(self, args: dict):
        from tandem.actors.handle import start

        a = TandemServeArgs.model_validate(args)
        self.drain_timeout_s = a.drain_timeout_s
        self.handle = start(tensor_parallel=a.tensor_parallel_size, name=_engine_actor_name(a), namespace=ENGINE_NAMESPACE,
                            **a.engine_options(), **a.settings_options())
        log.info("engine up: %s", self.handle.model_name)

    async def engine_handle(self):
        """The engine's TandemHandle, for an ingress replica starting. A dead engine hands
        out nothing: the asking replica asks again, by when this replica has failed its
        health check and a new engine is coming up."""
        await self.handle.ahealth()
        return self.handle

    async def check_health(self) -> None:
        """Serve's health check: raises when the scheduler actor is gone, so Serve replaces
        this replica and with it the engine. A recovering engine is healthy."""
        await self.handle.ahealth()

    async def record_autoscaling_stats(self) -> dict:
        """What tandem.serve.autoscaling scales on: this engine's queued + running tokens."""
        return {"load_tokens": float((await self.handle.areport())["load_tokens"])}

    async def __del__(self):
        """Serve removes this replica (scale-down, an update, a failure): the engine takes no
        more requests (the routers send them elsewhere), finishes those it holds, then stops."""
        handle = getattr(self, "handle", None)
        if handle is None:
            return
        try:
            left = await handle.adrain(self.drain_timeout_s)
            if left:
                log.warning("engine drained for %.0f s; %d requests still open are ended", self.drain_timeout_s, left)
        except Exception as e:  # noqa: BLE001 - a lost engine has nothing to drain
            log.debug("engine drain: %s", e)
        try:
            await asyncio.wait_for(handle.actor.shutdown.remote(), 60)
            ray.kill(handle.actor)
        except Exception as e:  # noqa: BLE001 - the actors die with this replica anyway
            log.debug("engine shutdown: %s", e)


@serve.ingress()
class OpenAIIngress:
    async def __init__(self, args: dict, engine):
        self.args = TandemServeArgs.model_validate(args)
        base = engine_base_name(self.args, serve.get_replica_context().app_name)
        self.engine = RoutedEngines(base, self.args.prefix_routing, self.args.prefix_overload_tokens)
        # waits while an engine replica loads the model
        await self.engine.start(await engine.engine_handle.remote())
        log.info("serving %s", self.engine.model_name)

    def __serve_build_asgi_app__(self):
        from tandem.serve.api import create_app

        from tandem.serve.limits import ServeLimits

        return create_app(self.engine, api_key=self.args.api_key, limits=ServeLimits.from_args(self.args))

    async def check_health(self) -> None:
        """Healthy while engine replicas are replaced (RoutedEngines answers 503 meanwhile)."""
        try:
            await self.engine.ahealth()
        except (EngineUnavailableError, ray.exceptions.RayActorError) as e:
            log.info("no engine replica serves now (%s)", e)


def build_app(args: dict | TandemServeArgs | None = None):
    """Serve builder: args (validated as TandemServeArgs) -> the bound application."""
    from tandem.serve.autoscaling import autoscaling_config

    if isinstance(args, TandemServeArgs):
        args = args.model_dump()
    parsed = TandemServeArgs.model_validate(args or {})
    checks = {"health_check_period_s": parsed.health_check_period_s, "health_check_timeout_s": 30}
    if parsed.autoscaling is None:
        count = {"num_replicas": parsed.engine_replicas}
    else:
        count = {"autoscaling_config": autoscaling_config(parsed.autoscaling)}
    engine = serve.deployment(
        TandemEngine,
        name=ENGINE_DEPLOYMENT,
        ray_actor_options={"num_cpus": 0},
        # time to drain: Serve kills a replica this long after asking it to stop
        graceful_shutdown_timeout_s=parsed.drain_timeout_s + 30,
        **count,
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
