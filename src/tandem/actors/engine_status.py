"""What the scheduler actor reports about its engine: the served model (ready), its
health, and its Prometheus metrics with the actor's own counters."""
from __future__ import annotations


def served_model(engine, model_name: str) -> dict:
    """What clients need to know about the served model."""
    lim = engine.group.limits
    return {
        "model": model_name,
        "max_model_len": lim.max_model_len,
        "vocab_size": lim.vocab_size,
        "tensor_parallel_size": lim.world_size,
        "has_chat_template": bool(getattr(engine.tokenizer, "chat_template", None)),
    }


def health(engine, restarts: int, ticks: int, step_seconds: float) -> dict:
    recovering = not engine.available
    return {
        "status": "recovering" if recovering else "ok",
        "recovering": recovering,
        "running": len(engine.scheduler.running),
        "waiting": len(engine.scheduler.waiting),
        "restarts": restarts,
        "ticks": ticks,
        "step_seconds": step_seconds,
        # each rank's command stream: "socket" (same node), "grpc", or none in process
        "shard_sessions": list(getattr(engine.group, "session_transports", [])),
        "kv_cache": engine.scheduler.kv_summary(),
    }


def metrics(engine, restarts: int, ticks: int, step_seconds: float, load_tokens: int = 0) -> bytes:
    """The engine's Prometheus counters and the actor's, in the text exposition format."""
    from prometheus_client import generate_latest

    lines = [
        "# HELP tandem:shard_group_restarts Restarts of the shard group after a lost rank.",
        "# TYPE tandem:shard_group_restarts counter",
        f"tandem:shard_group_restarts_total {restarts}",
        "# HELP tandem:engine_ticks Engine steps run by the scheduler actor.",
        "# TYPE tandem:engine_ticks counter",
        f"tandem:engine_ticks_total {ticks}",
        "# HELP tandem:engine_step_seconds Seconds spent inside engine steps.",
        "# TYPE tandem:engine_step_seconds counter",
        f"tandem:engine_step_seconds_total {step_seconds}",
        "# HELP tandem:engine_load_tokens Queued + running tokens after the last tick: what replicas are routed and autoscaled on.",
        "# TYPE tandem:engine_load_tokens gauge",
        f"tandem:engine_load_tokens {load_tokens}",
        "",
    ]
    return generate_latest(engine.metrics.registry) + "\n".join(lines).encode()
