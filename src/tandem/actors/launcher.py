"""RayShardLauncher: the ShardLauncher of a GrpcShardGroup whose ranks are Ray actors.

The ranks sit in one placement group (one bundle per rank, packed onto as few nodes as
possible). start() kills whatever actors are there and creates fresh ones in the same
bundles, so a restart after a lost rank gives every rank a clean process and empty KV.
"""
from __future__ import annotations

import logging
import time

from tandem.actors.shard_actor import ShardActor

log = logging.getLogger("tandem.actors")


class RayShardLauncher:
    def __init__(
        self,
        world_size: int,
        *,
        num_gpus: float = 0.0,
        num_cpus: float = 0.5,
        torch_threads: int | None = None,
        fault_injection: bool = False,
        strategy: str = "PACK",
        start_timeout_s: float = 300.0,
    ):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.num_gpus = num_gpus
        self.num_cpus = num_cpus
        self.torch_threads = torch_threads
        self.fault_injection = fault_injection
        self.strategy = strategy
        self.start_timeout_s = start_timeout_s
        self.placement_group = None
        self.actors: list = []  # rank order; the live ShardActor handles
        self.generation = 0  # how many times the ranks were started

    def _bundle(self) -> dict:
        bundle = {"CPU": max(self.num_cpus, 0.01)}  # a bundle may not be empty
        if self.num_gpus:
            bundle["GPU"] = self.num_gpus
        return bundle

    def _ensure_placement_group(self) -> None:
        if self.placement_group is not None:
            return
        import ray
        from ray.util.placement_group import placement_group

        pg = placement_group([self._bundle() for _ in range(self.world_size)], strategy=self.strategy)
        try:
            ray.get(pg.ready(), timeout=self.start_timeout_s)
        except Exception:
            ray.util.remove_placement_group(pg)
            raise RuntimeError(
                f"no room for {self.world_size} shard actors of {self._bundle()} each in the Ray cluster "
                f"({ray.available_resources()} available)"
            ) from None
        self.placement_group = pg

    def start(self) -> list[str]:
        """(Re)start all ranks fresh, stopping old ones; their gRPC addresses in rank order."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._kill_actors()
        self._ensure_placement_group()
        self.generation += 1
        cls = ray.remote(ShardActor)
        t0 = time.monotonic()
        self.actors = [
            cls.options(
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                max_restarts=0,  # the shard group restarts ranks itself, all together
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=rank),
                name=None,
            ).remote(rank, self.world_size, self.torch_threads, self.fault_injection)
            for rank in range(self.world_size)
        ]
        try:
            addresses = ray.get([a.start.remote() for a in self.actors], timeout=self.start_timeout_s)
        except Exception:
            self._kill_actors()
            raise
        log.info("started %d shard actors (generation %d) in %.1fs: %s", self.world_size, self.generation, time.monotonic() - t0, addresses)
        return list(addresses)

    def _kill_actors(self) -> None:
        import ray

        if self.actors:
            # stop the gRPC servers first (a lost rank answers at once with an error), then kill
            try:
                ray.wait([a.stop.remote() for a in self.actors], num_returns=len(self.actors), timeout=5.0)
            except Exception as e:  # noqa: BLE001
                log.debug("stop of shard actors: %s", e)
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception as e:  # noqa: BLE001 - already gone is fine
                log.debug("kill of a shard actor: %s", e)
        self.actors = []

    def stop(self) -> None:
        import ray

        self._kill_actors()
        if self.placement_group is not None:
            try:
                ray.util.remove_placement_group(self.placement_group)
            except Exception as e:  # noqa: BLE001
                log.debug("placement group removal: %s", e)
            self.placement_group = None
