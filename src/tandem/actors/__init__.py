"""Ray actors: the scheduler actor, the GPU shard actors and the Python handle API.
With tandem.serve, the only Ray-importing part of tandem.

    start(model=..., tensor_parallel=2) -> TandemHandle   generate / stream / agenerate / astream
    connect(name) -> TandemHandle                         an engine started with start(name=...)
    init_local_ray()                                      a local cluster sized for this machine
"""
from tandem.actors.cluster import init_local_ray
from tandem.actors.handle import TandemHandle, connect, sampling_params, start
from tandem.actors.launcher import RayShardLauncher
from tandem.actors.scheduler_actor import SchedulerActor
from tandem.actors.settings import SchedulerSettings
from tandem.actors.shard_actor import ShardActor

__all__ = [
    "RayShardLauncher",
    "SchedulerActor",
    "SchedulerSettings",
    "ShardActor",
    "TandemHandle",
    "connect",
    "init_local_ray",
    "sampling_params",
    "start",
]
