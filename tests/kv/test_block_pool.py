"""BlockPool: allocation order, reference counts, the evictable LRU and the registry."""
from __future__ import annotations

import pytest

from tandem.kv import BlockPool
from tandem.kv.block_pool import ROOT_UID


def test_rejects_an_empty_pool():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


def test_allocates_low_ids_first_and_refuses_more_than_free():
    pool = BlockPool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.num_free() == 1
    assert [pool.refcount(b) for b in range(4)] == [1, 1, 1, 0]
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    assert pool.num_free() == 1


def test_unregistered_block_is_plain_free_at_zero_references():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.release(block)
    assert pool.refcount(block) == 0
    assert block in pool.plain_free_ids()
    assert pool.evictable_ids() == []
    with pytest.raises(RuntimeError):
        pool.release(block)


def test_registered_block_stays_cached_until_its_id_is_needed():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    key = (ROOT_UID, (1, 2))
    pool.register(a, key)
    pool.release(a)
    assert pool.evictable_ids() == [a]
    assert pool.lookup(key) == a
    assert pool.num_free() == 1
    pool.release(b)  # plain free: taken before the cached block
    assert pool.allocate(1) == [b]
    assert pool.evictions == 0 and pool.lookup(key) == a
    assert pool.allocate(1) == [a]
    assert pool.evictions == 1
    assert pool.lookup(key) is None and not pool.is_registered(a)


def test_evicts_the_least_recently_freed_first():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for i, block in enumerate(blocks):
        pool.register(block, (ROOT_UID, (i,)))
    for block in (2, 0, 1):
        pool.release(block)
    assert pool.evictable_ids() == [2, 0, 1]
    pool.acquire(2)  # a hit takes it out of the evictable set ...
    assert pool.evictable_ids() == [0, 1]
    pool.release(2)  # ... and freeing it again makes it the most recent
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.evictions == 3


def test_acquire_of_a_block_neither_held_nor_cached_is_refused():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError):
        pool.acquire(0)


def test_uids_are_never_reused():
    pool = BlockPool(1)
    [block] = pool.allocate(1)
    first = pool.register(block, (ROOT_UID, (7,)))
    pool.release(block)
    assert pool.allocate(1) == [block]  # evicted
    second = pool.register(block, (ROOT_UID, (7,)))
    assert first != second and ROOT_UID not in (first, second)
    # a child key registered under the first uid names no live block's uid any more
    assert pool.lookup((first, (8,))) is None


def test_register_refuses_a_taken_key_or_a_registered_block():
    pool = BlockPool(3)
    a, b, _ = pool.allocate(3)
    pool.register(a, (ROOT_UID, (1,)))
    with pytest.raises(RuntimeError):
        pool.register(b, (ROOT_UID, (1,)))
    with pytest.raises(RuntimeError):
        pool.register(a, (ROOT_UID, (2,)))
    assert pool.num_cached() == 1
