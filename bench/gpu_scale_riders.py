"""gpu_scale.py's `riders` part: what prompt chunks riding on a verify cost on the GPU.

One rank's commands timed directly (no engine): a verify of 32 sequences x 1 row replayed
from its CUDA graph, the same verify run eagerly, and that verify with R prompt rows
riding on it (always eager), against the verify graphed plus a prefill of the R rows in a
command of its own (graphed where the shard has the shape). The gap between the eager and
the graphed verify is the forward's launch cost, which a riding forward pays.
"""
from __future__ import annotations

from common import covering, fixed_block_tables, interleaved_min, print_table

VERIFY_N = 32
RIDER_SLOTS = 4


def part_riders(group, ctx: int, vocab: int, prompts) -> dict:
    from tandem.shard.commands import GREEDY, PrefillItem, VerifyBatch

    shard, bs = group.shard, group.limits.block_size
    n_all = VERIFY_N + RIDER_SLOTS
    tables = fixed_block_tables(n_all, ctx + 520, bs)
    ids = prompts(n_all, ctx + 520, vocab, seed=3)
    for lo in range(0, VERIFY_N, 8):
        shard.prefill([PrefillItem(slot=i, tokens=ids[i][:ctx], blocks=covering(tables[i], ctx, bs)) for i in range(lo, lo + 8)])

    def chunks(rows: int) -> list[PrefillItem]:
        per = rows // RIDER_SLOTS
        return [PrefillItem(slot=s, tokens=ids[s][:per], blocks=covering(tables[s], per, bs))
                for s in range(VERIFY_N, n_all)]

    def verify(riders=()) -> VerifyBatch:
        slots = list(range(VERIFY_N))
        return VerifyBatch(batch_id=0, n=VERIFY_N, k=1, slots=slots, start_pos=[ctx] * VERIFY_N,
                           tokens=[ids[s][ctx] for s in slots], sampling=[GREEDY] * VERIFY_N,
                           block_tables=[covering(tables[s], ctx + 1, bs) for s in slots], prefill=list(riders))

    graphs = shard.graphs

    def eager(cmd):
        shard.graphs = None
        try:
            return shard.verify(cmd)
        finally:
            shard.graphs = graphs

    out, rows = {}, []
    plain = verify()
    t = interleaved_min({"graphed": lambda: shard.verify(plain), "eager": lambda: eager(plain)}, reps=20)
    out["riders_verify_graphed_ms"], out["riders_verify_eager_ms"] = t["graphed"] * 1e3, t["eager"] * 1e3
    rows.append(["verify alone", t["graphed"] * 1e3, t["eager"] * 1e3, "-", "-"])
    for r in (64, 256, 512):
        riding = verify(chunks(r))
        t = interleaved_min({"ride": lambda: shard.verify(riding),
                             "apart": lambda: (shard.verify(plain), shard.prefill(chunks(r)))}, reps=10)
        out[f"riders_{r}_ride_ms"], out[f"riders_{r}_apart_ms"] = t["ride"] * 1e3, t["apart"] * 1e3
        rows.append([f"verify + {r} prompt rows", "-", "-", t["ride"] * 1e3, t["apart"] * 1e3])
    shard.pending = None
    shard.release(list(range(n_all)))
    print_table(["case", "graphed ms", "eager ms", "riding ms", "verify graphed + prefill apart ms"], rows,
                title=f"prompt chunks riding on a verify of {VERIFY_N}x1 ({ctx} tokens of context)")
    return out
