"""ShardActor: one Ray actor per target rank (one GPU each where there are GPUs).

It only hosts a gRPC shard server and reports its address; the scheduler's
GrpcShardGroup then sends it Init (the ShardSpec, its rank, the world and the
collective address) and drives it over gRPC like any shard process.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tandem.actors")


def default_torch_threads(world_size: int) -> int:
    """A CPU rank's torch threads: its share of the cores this process may use (its CPU
    affinity, within its container's CPU quota), not of the host's: a pod limited to 4 CPUs
    on a 64-core node that ran 64 OpenMP threads would spend most of its time waiting."""
    from tandem.rpc.session_socket import usable_cores

    return max(1, int(usable_cores()) // world_size)


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
            torch_threads = default_torch_threads(world_size)
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

    def runtime(self) -> dict:
        """What this rank computes with, to compare against an embedded engine's: torch's
        intra-op threads, the linear layers' quantization and whether the CPU attention
        kernel is loaded (those two None before Init)."""
        import torch

        shard = self.server.servicer.shard if self.server is not None else None
        info = {"pid": os.getpid(), "torch_threads": torch.get_num_threads(), "quantization": None,
                "cpu_attention_kernel": None}
        if shard is not None:
            from tandem.model.paged_attention_cpu import load_kernel

            info.update(quantization=shard.model.quantization,
                        cpu_attention_kernel=shard.device.type == "cpu" and load_kernel() is not None)
        return info

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
            self.server = None
