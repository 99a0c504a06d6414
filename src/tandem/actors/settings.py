"""SchedulerSettings: what a SchedulerActor is built from, the engine's config and how its
ranks are placed. Plain data (no Ray here), so the served app's arguments
(tandem.serve.args) take these fields, with their defaults and help, as they take
EngineConfig's."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from tandem.config import EngineConfig, check_bounds, option
from tandem.errors import InvalidRequestError


@dataclass(frozen=True)
class SchedulerSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: str | None = option(None, "The model id clients send and /v1/models lists; defaults to the model's name.")
    scheduler_num_cpus: float = option(0.25, "CPUs reserved by the scheduler actor (it runs the step loop, n-gram drafting and detokenization).", ge=0)
    rpc_deadline_s: float = option(30.0, "Deadline of each shard RPC; a hung rank fails its batch after this.", gt=0)
    init_deadline_s: float = option(300.0, "Deadline of a rank's Init (its model load).", gt=0)
    shard_num_gpus: float = option(0.0, "GPUs per shard actor (1 on a GPU cluster, 0 on CPU).", ge=0)
    shard_num_cpus: float = option(0.5, "CPUs reserved per shard actor.", ge=0)
    shard_torch_threads: int | None = option(None, "Torch threads per CPU shard actor; None = the cores its process may use (CPU affinity, within the container's CPU quota) divided by the ranks.", ge=1)
    fault_injection: bool = option(False, "Let tests make a rank fail on purpose (the shard servers' InjectFault).")
    in_process_target: bool = option(False, "Run the single rank inside the scheduler actor, which then reserves shard_num_gpus: no gRPC hop a verify, so less latency at few clients; but a rank that fails takes the engine and every running request with it, where a shard actor is restarted and its sequences go on. Only with one rank.")
    session_socket: bool = option(True, "Send the tick's commands to shard ranks on the scheduler's node over each rank's Unix socket: the same protobuf messages as the gRPC Session stream, without gRPC's thread hand-offs (a round trip of ~0.1 ms instead of ~0.6 on an H200 host). False: gRPC always. Ranks on other nodes use gRPC either way.")
    session_spin_us: int | None = option(None, "How long the scheduler and each shard rank busy-poll their session socket for the next message before they block, in microseconds: 0.1-0.2 ms off every tick on an H200 host (verify_legs), for a core each kept busy while requests run. None: 20000 where a process may use 8 cores or more (its CPU affinity, within its container's CPU quota), else 0 (no polling).", ge=0, le=1_000_000)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_bounds(f, getattr(self, f.name))
        if self.in_process_target and self.engine.shards != 1:
            raise InvalidRequestError("in_process_target", f"holds one rank, not tensor_parallel {self.engine.shards}")


SETTINGS_FIELDS = tuple(f.name for f in fields(SchedulerSettings) if f.name != "engine")
