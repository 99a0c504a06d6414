"""A local Ray cluster sized for this machine (for `tandem serve`, tests and benchmarks).

On a real cluster (KubeRay) nothing here runs: Ray is already up and Serve connects to it.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tandem.actors")

# What every tandem Ray process should see; RAY_AUTH_MODE=disabled keeps a local
# cluster token-free, and usage stats stay off. Ray starts its workers at nice 15,
# which on a busy CPU node lets any other process preempt the model's forward (measured
# here: +10-20% verify time while benchmark clients ran); a serving node wants them at 0.
_ENV_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0"}


def local_cpus() -> int:
    """Logical CPUs to advertise: twice the cores, because tandem's actors reserve
    fractions of a CPU and mostly wait on each other (at least 4)."""
    return max(4, 2 * (os.cpu_count() or 1))


def init_local_ray(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_mb: int = 300,
    address: str | None = None,
    log_to_driver: bool = True,
) -> bool:
    """Start (or join, if `address` is given or one is already up in this process) a Ray
    cluster bound to 127.0.0.1, without the dashboard and with a small object store.
    Returns True when this call started it (the caller then owns ray.shutdown())."""
    import ray

    for k, v in _ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    if ray.is_initialized():
        return False
    if address is not None:
        ray.init(address=address, log_to_driver=log_to_driver)
        return False
    ray.init(
        num_cpus=num_cpus or local_cpus(),
        num_gpus=num_gpus,
        object_store_memory=object_store_mb * 1024 * 1024,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=log_to_driver,
        runtime_env={"env_vars": dict(_ENV_DEFAULTS)},
    )
    log.info("started a local Ray cluster: %s", ray.cluster_resources())
    return True
