"""How many prompt tokens a tick may prefill in a forward of their own while sequences run
(config.prefill_stall): the running streams wait for that prefill, so its cost, priced by
the measured costs (tandem.adaptive.BatchCostModel), is held to `stall` times the verify
forward they run anyway. Their inter-token gap then grows about 1 + stall times under a
burst of new prompts, whatever the model and the hardware. The price is the cheapest row
seen, so a chunk padded to a CUDA graph's wider shape costs more than priced.
"""
from __future__ import annotations


def stall_budget(cost, verify_rows: int, stall: float, row_budget: int) -> int | None:
    """The tick's prefill budget in tokens; None where nothing bounds it (no stall asked,
    nothing running, or no forward measured yet: the first ticks prefill at full width)."""
    if stall <= 0 or verify_rows <= 0 or cost.prefill_ms_per_row is None:
        return None
    verify_ms = cost.estimate(verify_rows)
    if verify_ms is None:
        return None
    tokens = int(stall * verify_ms / cost.prefill_ms_per_row)
    if tokens >= row_budget:
        tokens -= tokens % row_budget  # whole forwards: a short last one would cost nearly a full one
    return max(1, tokens)  # under a block the scheduler still moves the oldest prompt on by one
