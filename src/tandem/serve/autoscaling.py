"""The engine deployment's autoscaling: Serve's autoscaler on tandem's own metric.

Each engine replica reports its queued + running tokens (TandemEngine's
record_autoscaling_stats, `load_tokens`; in /metrics as tandem:engine_load_tokens).
LoadPolicy asks for enough replicas to keep the mean under target_load_tokens, and for
one fewer once the others would carry the load at under half the target (the gap keeps
it from flapping). Serve holds a decision back until it has stood for
upscale_window_s / downscale_window_s, keeps the count within min and max, and stops a
replica it removes gracefully: the replica drains first (TandemEngine.__del__)."""
from __future__ import annotations

import math

from tandem.serve.args import EngineAutoscaling


class LoadPolicy:
    def __init__(self, target_load_tokens: int):
        self.target = float(target_load_tokens)

    def __call__(self, ctx) -> tuple[int, dict]:
        # Serve's target count, replicas still starting included: from the running count
        # alone, a load under the target would read as "one fewer" and stop a replica
        # that is starting (the gap below would not hold)
        n = ctx.target_num_replicas
        loads = (ctx.aggregated_metrics or {}).get("load_tokens", {})
        return desired_replicas(n, sum(loads.values()), self.target), ctx.policy_state


def desired_replicas(current: int, total_load: float, target: float) -> int:
    if current < 1:
        return 1
    if total_load > target * current:
        return max(current + 1, math.ceil(total_load / target))
    if current > 1 and total_load < 0.5 * target * (current - 1):
        return current - 1
    return current


def autoscaling_config(a: EngineAutoscaling) -> dict:
    """Serve's autoscaling_config for the engine deployment."""
    interval = min(10.0, max(0.5, min(a.upscale_window_s, a.downscale_window_s) / 5))
    return {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "initial_replicas": a.min_replicas,
        "upscale_delay_s": a.upscale_window_s,
        "downscale_delay_s": a.downscale_window_s,
        "metrics_interval_s": interval,  # how often each replica pushes its load
        "look_back_period_s": max(2 * interval, min(a.upscale_window_s, 30.0)),
        "policy": {"policy_function": f"{__name__}:LoadPolicy",
                   "policy_kwargs": {"target_load_tokens": a.target_load_tokens}},
    }
