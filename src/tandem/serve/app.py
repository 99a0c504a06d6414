"""The Ray Serve application: a FastAPI ingress deployment in front of a SchedulerActor.

build_app(args) is the builder that `import_path: tandem.serve:build_app` names in a
Serve YAML config (serve run, KubeRay's serveConfigV2). The ingress replica starts the
engine (tandem.actors.start) when it is constructed, so the engine's actors live as
long as the replica; the replica reserves no CPU (num_cpus: 0), the actors reserve
what TandemServeArgs says.
"""
from __future__ import annotations

import logging

from ray import serve

from tandem.serve.args import TandemServeArgs

log = logging.getLogger("tandem.serve")

ENGINE_NAMESPACE = "tandem"  # where a named scheduler actor (engine_actor_name) lives


@serve.ingress()
class OpenAIIngress:
    def __init__(self, args: dict):
        from tandem.actors.handle import start

        self.args = TandemServeArgs.model_validate(args)
        a = self.args
        self.handle = start(
            model=a.model,
            tensor_parallel=a.tensor_parallel_size,
            drafter=a.drafter,
            served_model_name=a.served_model_name,
            scheduler_num_cpus=a.scheduler_num_cpus,
            shard_num_gpus=a.shard_num_gpus,
            shard_num_cpus=a.shard_num_cpus,
            shard_torch_threads=a.shard_torch_threads,
            rpc_deadline_s=a.rpc_deadline_s,
            in_process_target=a.in_process_target,
            session_socket=a.session_socket,
            session_spin_us=a.session_spin_us,
            name=a.engine_actor_name,
            namespace=ENGINE_NAMESPACE,
            draft_model=a.draft_model,
            dflash_checkpoint=a.dflash_checkpoint,
            num_speculative_tokens=a.num_speculative_tokens,
            max_num_seqs=a.max_num_seqs,
            max_seq_len=a.max_seq_len,
            row_budget=a.row_budget,
            device=a.device,
            dtype=a.dtype,
        )
        # all HTTP streams share one output stream: a socket on the engine's node, else Ray
        self.handle = self.handle.multiplexed()
        log.info("serving %s", self.handle.model_name)

    def __serve_build_asgi_app__(self):
        from tandem.serve.api import create_app

        return create_app(self.handle, api_key=self.args.api_key, max_tokens_limit=self.args.max_tokens_limit)

    async def check_health(self) -> None:
        """Serve's replica health check: raises when the scheduler actor is gone, so Serve
        replaces this replica (and with it the engine). A recovering engine is healthy."""
        await self.handle.ahealth()

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None:
            try:
                handle.shutdown()
            except Exception as e:  # noqa: BLE001 - the actors die with this replica anyway
                log.debug("engine shutdown: %s", e)


def build_app(args: dict | TandemServeArgs | None = None):
    """Serve builder: args (validated as TandemServeArgs) -> the bound application."""
    if isinstance(args, TandemServeArgs):
        args = args.model_dump()
    parsed = TandemServeArgs.model_validate(args or {})
    deployment = serve.deployment(
        OpenAIIngress,
        name="tandem-openai",
        num_replicas=1,  # one replica owns the engine; scale with more apps, not replicas
        max_ongoing_requests=parsed.max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
        health_check_period_s=10,
        health_check_timeout_s=30,
    )
    return deployment.bind(parsed.model_dump())
