"""Block tables for tests that send shard commands by hand, with no scheduler: slot s owns
the blocks s*PER_SLOT .. (s+1)*PER_SLOT - 1 of a rank's pool (a rank built with the default
KV budget, or `pool_blocks(num_slots)` blocks, holds them)."""
from __future__ import annotations

from tandem.shard.commands import GREEDY, PrefillItem, VerifyBatch

BLOCK = 16  # the default block size
PER_SLOT = 32  # 512 positions a slot


def pool_blocks(num_slots: int) -> int:
    return num_slots * PER_SLOT


def blocks(slot: int, positions: int) -> list[int]:
    """Slot's table covering `positions` positions."""
    need = -(-positions // BLOCK)
    assert need <= PER_SLOT, f"{positions} positions exceed a test slot's {PER_SLOT * BLOCK}"
    return list(range(slot * PER_SLOT, slot * PER_SLOT + need))


def prefill_item(slot: int, tokens: list[int], sampling=GREEDY) -> PrefillItem:
    return PrefillItem(slot=slot, tokens=list(tokens), sampling=sampling, blocks=blocks(slot, len(tokens)))


def verify_batch(batch_id: int, n: int, k: int, slots: list[int], start_pos: list[int], tokens: list[int],
                 sampling=None) -> VerifyBatch:
    return VerifyBatch(batch_id=batch_id, n=n, k=k, slots=list(slots), start_pos=list(start_pos), tokens=list(tokens),
                       sampling=sampling if sampling is not None else [GREEDY] * n,
                       block_tables=[blocks(s, p + k) for s, p in zip(slots, start_pos)])
