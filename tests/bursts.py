"""A burst of prompts arriving while others run: what the mixed-prefill tests drive."""
from __future__ import annotations


def burst_midstream(engine, first: list, burst: list, params, reasons=("stop", "length")) -> list[list[int]]:
    """`first` start and reach their first tokens; then `burst` arrives while they run.
    Every request's output tokens, in order; each must end with one of `reasons`."""
    ids = [engine.add_request(p, params) for p in first]
    final = {}
    while not all(engine.requests[i].output_ids for i in ids):
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    ids += [engine.add_request(p, params) for p in burst]
    while len(final) < len(ids):
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    outs = [final[i] for i in ids]
    assert all(o.finish_reason in reasons for o in outs), [o.error for o in outs]
    return [o.token_ids for o in outs]
