"""What an ingress replica serves: every engine replica of the app, each request routed to
one of them (tandem.serve.replica_router), with the TandemHandle's async surface.

Engine replicas are found by their scheduler actors' names (tandem.serve.app names them
<base>/<replica id>, or <base> alone for one fixed engine given engine_actor_name),
listed every REFRESH_S and whenever one is lost. Each gets a multiplexed handle whose
subscription (a socket on the same node) carries its reports after every tick; each is
also asked for its whole report every REFRESH_S (one on another node has no socket).

A request refused before it started (its replica recovering, draining, or gone) is sent
to another replica; one that has started stays where it is, and ends with an error event
if its replica is lost. While no replica serves, requests get EngineUnavailableError
(HTTP 503 with Retry-After); this ingress replica stays up meanwhile."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import ray

from tandem.actors.prefix_keys import prefix_keys
from tandem.errors import EngineUnavailableError
from tandem.serve import metrics_merge
from tandem.serve.replica_router import Replica, ReplicaRouter, request_cost

log = logging.getLogger("tandem.serve")

REFRESH_S = 1.0
ENGINE_NAMESPACE = "tandem"
_LOST = (EngineUnavailableError, ray.exceptions.RayActorError)


def _names(base: str) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == ENGINE_NAMESPACE and (a["name"] == base or a["name"].startswith(base + "/"))]


class RoutedEngines:
    def __init__(self, base_name: str, prefix_routing: bool = True, prefix_overload_tokens: int = 8192):
        self.base = base_name
        self.router = ReplicaRouter(prefix_routing, prefix_overload_tokens)
        self.info: dict | None = None
        self._joining: dict[str, asyncio.Task] = {}
        self._watcher: asyncio.Task | None = None
        self._wake = asyncio.Event()

    async def start(self, first) -> None:
        """Serve with `first` (a TandemHandle on one engine replica) and every replica found."""
        self.info = first.info
        await self._refresh()
        # serve once a replica has joined (the one `first` is on joins at once); one still
        # loading its model joins when it is up
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not self.router.replicas and self._joining and loop.time() < deadline:
            await asyncio.wait(list(self._joining.values()), timeout=deadline - loop.time(),
                               return_when=asyncio.FIRST_COMPLETED)
        self._watcher = loop.create_task(self._watch())

    @property
    def model_name(self) -> str:
        return self.info["model"]

    @property
    def max_model_len(self) -> int:
        return self.info["max_model_len"]

    # ---- finding the replicas -----------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), REFRESH_S)
            self._wake.clear()
            try:
                await self._refresh()
            except Exception as e:  # noqa: BLE001 - the next round tries again
                log.warning("engine replicas not refreshed: %s", e)

    async def _refresh(self) -> None:
        names = set(await asyncio.get_running_loop().run_in_executor(None, _names, self.base))
        for name in list(self.router.replicas):
            if name not in names:
                self._lose(self.router.replicas[name], "its actor is gone")
        for name in names - set(self.router.replicas) - set(self._joining):
            self._joining[name] = asyncio.get_running_loop().create_task(self._join(name))
        await asyncio.gather(*(self._poll(r) for r in list(self.router.replicas.values())))

    async def _join(self, name: str) -> None:
        """A replica found by its name, once its engine is up."""
        from tandem.actors.handle import TandemHandle

        try:
            actor = ray.get_actor(name, namespace=ENGINE_NAMESPACE)
            info = await actor.ready.remote()
            replica = Replica(name, None)
            replica.handle = TandemHandle(actor, info).multiplexed(on_report=replica.on_report)
            replica.on_report(await replica.handle.areport())
            pump = replica.handle.subscribe_now()
            pump.add_done_callback(lambda _: self._lose(replica, "its output stream ended"))
            self.router.replicas[name] = replica
            log.info("engine replica %s joined (%d serving)", name, len(self.router.serving()))
        except Exception as e:  # noqa: BLE001 - still starting, or already gone: the next refresh looks again
            log.debug("engine replica %s not joined: %s", name, e)
        finally:
            self._joining.pop(name, None)

    async def _poll(self, replica: Replica) -> None:
        try:
            replica.on_report(await asyncio.wait_for(replica.handle.areport(), 10.0))
        except _LOST as e:
            self._lose(replica, f"{type(e).__name__}: {e}")
        except asyncio.TimeoutError:
            replica.available = False  # a busy or hung actor gets nothing new until it answers

    def _lose(self, replica: Replica, why: str) -> None:
        if self.router.replicas.get(replica.name) is replica:
            replica.down = True
            del self.router.replicas[replica.name]  # found again under its name if it comes back
            log.warning("engine replica %s lost: %s (%d serving)", replica.name, why, len(self.router.serving()))
            self._wake.set()

    def _unavailable(self, replica: Replica, e: Exception) -> None:
        """A replica refused a request: nothing more goes there until its next report says it serves."""
        replica.available = False
        if isinstance(e, ray.exceptions.RayActorError):
            self._lose(replica, str(e))
        self._wake.set()  # the refresh asks it: a dead one is lost there

    # ---- routing ------------------------------------------------------------------------

    def _pick(self, prompt, messages, tried: set[str], error: Exception | None) -> tuple[Replica, list[int], str]:
        keys = prefix_keys(prompt, messages) if self.router.prefix_routing else []
        replica, reason = self.router.pick(keys, tried)
        if replica is None:
            raise error or EngineUnavailableError("no engine replica serves now (starting, recovering or "
                                                  "being replaced); retry shortly")
        return replica, keys, reason

    async def _routed(self, prompt, messages, rid: str, call):
        """call(replica) on the replica picked for this request, again on another while one
        refuses it before it starts."""
        tried: set[str] = set()
        error = None
        while True:
            replica, keys, reason = self._pick(prompt, messages, tried, error)
            replica.sent(rid, request_cost(prompt, messages), keys, reason)
            try:
                return await call(replica)
            except _LOST as e:
                error = e
                tried.add(replica.name)
                self._unavailable(replica, e)
            finally:
                replica.settled(rid)

    async def _streamed(self, prompt, messages, rid: str, stream_of):
        """Each output of stream_of(replica), on the replica picked (another while one
        refuses it before its first output)."""
        tried: set[str] = set()
        error = None
        while True:
            replica, keys, reason = self._pick(prompt, messages, tried, error)
            replica.sent(rid, request_cost(prompt, messages), keys, reason)
            started = False
            try:
                async with contextlib.aclosing(stream_of(replica)) as outs:
                    async for out in outs:
                        if not started:
                            started = True
                            replica.settled(rid)
                        yield out
                return
            except _LOST as e:
                if started:
                    raise
                error = e
                tried.add(replica.name)
                self._unavailable(replica, e)
            finally:
                replica.settled(rid)

    async def agenerate(self, prompt=None, params=None, *, messages=None, request_id=None, **kw):
        rid = request_id or f"req-{uuid.uuid4().hex}"
        return await self._routed(prompt, messages, rid, lambda r: r.handle.agenerate(
            prompt, params, messages=messages, request_id=rid, **kw))

    async def astream(self, prompt=None, params=None, *, messages=None, request_id=None, deltas_only=False, **kw):
        rid = request_id or f"req-{uuid.uuid4().hex}"
        async for out in self._streamed(prompt, messages, rid, lambda r: r.handle.astream(
                prompt, params, messages=messages, request_id=rid, deltas_only=deltas_only, **kw)):
            yield out

    async def agenerate_many(self, requests):
        first = requests[0]
        return await self._routed(first.prompt, first.messages, first.request_id,
                                  lambda r: r.handle.agenerate_many(requests))

    async def astream_many(self, requests, deltas_only=False):
        first = requests[0]
        async for out in self._streamed(first.prompt, first.messages, first.request_id,
                                        lambda r: r.handle.astream_many(requests, deltas_only)):
            yield out

    async def atokenize(self, prompt=None, *, messages=None, **options):
        return await self._routed(None, None, f"tok-{uuid.uuid4().hex}",
                                  lambda r: r.handle.atokenize(prompt, messages=messages, **options))

    async def adetokenize(self, tokens):
        return await self._routed(None, None, f"tok-{uuid.uuid4().hex}", lambda r: r.handle.adetokenize(tokens))

    # ---- operations ---------------------------------------------------------------------

    async def _each(self, call) -> dict[str, object]:
        """call(replica) on every known replica: name -> its result or the exception."""
        replicas = list(self.router.replicas.values())
        results = await asyncio.gather(*(call(r) for r in replicas), return_exceptions=True)
        for r, res in zip(replicas, results):
            if isinstance(res, _LOST):
                self._unavailable(r, res)
        return {r.name: res for r, res in zip(replicas, results)}

    async def ahealth(self) -> dict:
        """Every replica's health and how many serve; `recovering` while none does."""
        each = {n: h for n, h in (await self._each(lambda r: r.handle.ahealth())).items() if isinstance(h, dict)}
        if not each:
            raise EngineUnavailableError("no engine replica answers now; retry shortly")
        serving = [n for n, h in each.items() if not h.get("recovering") and not self._draining(n)]
        first = each[serving[0] if serving else next(iter(each))]
        summed = {k: sum(h.get(k, 0) for h in each.values()) for k in ("running", "waiting", "restarts", "ticks")}
        return {**first, **summed, "status": "ok" if serving else "recovering", "recovering": not serving,
                "replicas": len(serving), "replicas_known": len(each),
                "engines": {n: {k: h.get(k) for k in ("status", "running", "waiting", "restarts", "kv_cache")}
                            | self._view(n) for n, h in each.items()}}

    def _view(self, name: str) -> dict:
        """What this router knows of a replica: its load as routed on, how its outputs come."""
        r = self.router.replicas.get(name)
        if r is None:
            return {"load_tokens": None, "outputs": None}
        return {"load_tokens": r.estimate(), "outputs": "socket" if r.handle.outputs_over_socket else "ray"}

    def _draining(self, name: str) -> bool:
        r = self.router.replicas.get(name)
        return r is None or r.draining

    async def ametrics(self) -> bytes:
        texts = {n: t for n, t in (await self._each(lambda r: r.handle.ametrics())).items() if isinstance(t, bytes)}
        if not texts:
            raise EngineUnavailableError("no engine replica answers now; retry shortly")
        return metrics_merge.merge(texts, self._router_gauges())

    def _router_gauges(self) -> str:
        """This ingress's view: replicas serving, each one's load as routed on, requests sent by reason."""
        lines = ["# HELP tandem:serving_replicas Engine replicas taking requests, as this ingress sees them.",
                 "# TYPE tandem:serving_replicas gauge", f"tandem:serving_replicas {len(self.router.serving())}",
                 "# HELP tandem:replica_load_tokens Queued + running tokens of an engine replica as this ingress "
                 "routes on them (its last report and what was sent since).",
                 "# TYPE tandem:replica_load_tokens gauge"]
        routed = ["# HELP tandem:routed_requests Requests this ingress sent to an engine replica, by why: the "
                  "prefix it holds or its load.", "# TYPE tandem:routed_requests counter"]
        for r in self.router.replicas.values():
            lines.append(f'tandem:replica_load_tokens{{replica="{r.name}"}} {r.estimate()}')
            routed += [f'tandem:routed_requests_total{{replica="{r.name}",reason="{why}"}} {r.routed[why]}'
                       for why in ("prefix", "load")]
        return "\n".join(lines + routed) + "\n"
