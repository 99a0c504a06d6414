"""Checks shared by the KV block tests: a snapshot of a manager's whole state (to prove
a refused call changed nothing) and the pool's invariants, computed from scratch."""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from tandem.kv import KVBlockManager


def snapshot(manager: KVBlockManager, seq_ids: Iterable[Hashable]) -> dict:
    pool = manager.pool
    return {
        "tables": {seq: manager.table(seq) for seq in seq_ids},
        "refcounts": [pool.refcount(b) for b in range(manager.num_blocks)],
        "plain_free": pool.plain_free_ids(),
        "evictable": pool.evictable_ids(),
        "registered": [pool.uid_of(b) for b in range(manager.num_blocks)],
        "num_cached": pool.num_cached(),
        "num_free": manager.num_free(),
        "counters": (manager.prefix_queries, manager.prefix_hits, manager.evictions),
    }


def check_invariants(manager: KVBlockManager, seq_ids: Iterable[Hashable]) -> None:
    pool = manager.pool
    seq_ids = list(seq_ids)
    holders: Counter[int] = Counter()
    for seq in seq_ids:
        assert manager.has(seq)
        table = manager.table(seq)
        assert len(set(table)) == len(table), f"table of {seq!r} holds a block twice: {table}"
        assert all(0 <= b < manager.num_blocks for b in table)
        holders.update(table)
    for block in range(manager.num_blocks):
        assert pool.refcount(block) == holders[block], f"block {block}"

    plain = pool.plain_free_ids()
    evictable = pool.evictable_ids()
    referenced = [b for b in range(manager.num_blocks) if pool.refcount(b) > 0]
    assert len(set(plain)) == len(plain) and len(set(evictable)) == len(evictable)
    assert not set(plain) & set(evictable)
    assert not set(referenced) & (set(plain) | set(evictable))
    assert len(plain) + len(evictable) + len(referenced) == manager.num_blocks

    assert all(pool.is_registered(b) for b in evictable), "an evictable block is not cached"
    assert not any(pool.is_registered(b) for b in plain), "a plain free block is cached"
    registered = [b for b in range(manager.num_blocks) if pool.is_registered(b)]
    assert pool.num_cached() == len(registered)
    uids = [pool.uid_of(b) for b in registered]
    assert len(set(uids)) == len(uids), "two cached blocks share a uid"
    if not manager.prefix_caching:
        assert registered == []

    assert manager.num_free() == len(plain) + len(evictable)
    assert manager.usage() == len(referenced) / manager.num_blocks
