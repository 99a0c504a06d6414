"""ShardActor: one Ray actor per target rank (one GPU each where there are GPUs).

It only hosts a gRPC shard server and reports its address; the scheduler's
GrpcShardGroup then sends it Init (the ShardSpec, its rank, the world and the
collective address) and drives it over gRPC like any shard process.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tandem.actors")


class ShardActor:
    """Wrapped with ray.remote by RayShardLauncher (resources are chosen there)."""

    def __init__(self, rank: int, world_size: int, torch_threads: int | None = None, fault_injection: bool = False):
        self.rank = rank
        self.fault_injection = fault_injection
        self.server = None
        self.address: str | None = None
        import torch

        if torch_threads is None and not torch.cuda.is_available():
            # Ray sets OMP_NUM_THREADS=1 for fractional-CPU actors; a CPU rank wants its
            # share of the node's cores.
            torch_threads = max(1, (os.cpu_count() or 1) // world_size)
        if torch_threads:
            torch.set_num_threads(torch_threads)

    def start(self) -> str:
        """Start the gRPC shard server (once) and return its address, host:port."""
        if self.server is None:
            import ray

            from tandem.rpc.server import start_shard_server
            from tandem.shard.factory import build_rank

            host = ray.util.get_node_ip_address()
            self.server, self.address = start_shard_server(build_rank, f"{host}:0", fault_injection=self.fault_injection)
            log.info("shard rank %d serving on %s (pid %d)", self.rank, self.address, os.getpid())
        return self.address

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
            self.server = None
