"""KVBlockManager: tables, sharing, the hash chain, eviction, rewinds and refusals."""
from __future__ import annotations

import pytest
from kv_checks import check_invariants, snapshot

from tandem.kv import KVBlockManager

BS = 4
X, Y, Z, W = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]


def admitted(manager: KVBlockManager, seq, tokens, reserve=0) -> int:
    """Admit, then commit the prompt as its prefill would: the common first step."""
    cached_len = manager.admit(seq, tokens, reserve)
    assert cached_len is not None
    manager.commit(seq, tokens)
    return cached_len


# --- validation ------------------------------------------------------------------------

@pytest.mark.parametrize("num_blocks, block_size, word",
                         [(0, 4, "num_blocks"), (4, 0, "block_size")])
def test_rejects_empty_sizes(num_blocks, block_size, word):
    with pytest.raises(ValueError, match=word):
        KVBlockManager(num_blocks, block_size)


def test_rejects_misuse_with_clear_errors():
    manager = KVBlockManager(8, BS)
    manager.admit("a", X)
    with pytest.raises(ValueError, match="already holds"):
        manager.admit("a", Y)
    with pytest.raises(ValueError, match="unknown sequence"):
        manager.grow("b", 4)
    with pytest.raises(ValueError, match="unknown sequence"):
        manager.commit("b", X)
    with pytest.raises(ValueError, match="covers only 4"):
        manager.commit("a", X + [5])
    with pytest.raises(ValueError, match="reserve"):
        manager.admit("c", X, reserve=-1)
    assert manager.table("a") == [0] and not manager.has("b") and not manager.has("c")


def test_blocks_for_rounds_up():
    manager = KVBlockManager(8, BS)
    assert [manager.blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


# --- allocation -------------------------------------------------------------------------

def test_admit_and_free_round_trip():
    manager = KVBlockManager(8, BS)
    assert manager.admit("a", X + Y + [1], reserve=3) == 0  # 12 positions: 3 blocks
    assert manager.has("a") and len(manager.table("a")) == 3
    assert manager.capacity("a") == 12
    assert manager.num_free() == 5 and manager.usage() == 3 / 8
    table = manager.table("a")
    table.append(99)  # a copy: the manager's table is untouched
    assert len(manager.table("a")) == 3
    manager.free("a")
    manager.free("a")  # unknown now: a no-op
    assert not manager.has("a")
    assert manager.num_free() == 8 and manager.usage() == 0.0
    check_invariants(manager, [])


def test_grow_extends_only_as_needed():
    manager = KVBlockManager(8, BS)
    manager.admit("a", [1, 2])
    assert manager.grow("a", 3) and len(manager.table("a")) == 1
    assert manager.grow("a", 9) and len(manager.table("a")) == 3
    assert manager.grow("a", 2) and len(manager.table("a")) == 3  # never shrinks
    assert manager.num_free() == 5


# --- sharing and the hash chain ----------------------------------------------------------

def test_same_prompt_at_once_shares_blocks_and_freeing_one_keeps_the_other():
    manager = KVBlockManager(8, BS)
    prompt = X + Y + [1]
    assert admitted(manager, "a", prompt) == 0
    assert manager.admit("b", prompt) == 8
    a, b = manager.table("a"), manager.table("b")
    assert b[:2] == a[:2] and b[2] != a[2]
    assert [manager.pool.refcount(x) for x in a[:2]] == [2, 2]
    assert manager.num_free() == 4  # 2 shared + 2 own tails
    check_invariants(manager, ["a", "b"])

    manager.free("a")
    assert manager.table("b") == b
    assert [manager.pool.refcount(x) for x in b[:2]] == [1, 1]
    assert manager.pool.evictable_ids() == []  # still referenced by b: not evictable
    assert manager.num_free() == 5  # b's 3 blocks held; a's own tail freed
    check_invariants(manager, ["b"])


def test_the_same_block_after_a_different_prefix_does_not_hit():
    manager = KVBlockManager(16, BS)
    admitted(manager, "a", X + Y + [1])
    assert manager.admit("b", Z + Y + [1]) == 0  # Y is cached, but after X
    assert manager.admit("c", X + Z + [1]) == 4  # the chain holds through X only
    assert manager.admit("d", X + Y + Z + [1]) == 8
    assert manager.table("d")[:2] == manager.table("a")[:2]


def test_the_hit_leaves_at_least_one_token_to_compute():
    manager = KVBlockManager(16, BS)
    admitted(manager, "a", X + Y + [1])
    assert manager.admit("two_full", X + Y) == 4  # (8 - 1) // 4 = 1 block at most
    assert manager.admit("one_more", X + Y + [1]) == 8
    assert manager.admit("one_full", X) == 0
    assert manager.admit("empty", []) == 0 and manager.table("empty") == []


def test_equal_block_already_cached_stays_unregistered_and_the_chain_goes_on():
    manager = KVBlockManager(16, BS)
    manager.admit("a", X + Y + [1])
    manager.admit("b", X + Y + Z + [1])  # both miss: nothing is committed yet
    manager.commit("a", X + Y + [1])
    manager.commit("b", X + Y + Z + [1])
    a, b = manager.table("a"), manager.table("b")
    assert manager.pool.num_cached() == 3  # a's X and Y, b's Z; b's own X and Y are not
    assert not manager.pool.is_registered(b[0]) and not manager.pool.is_registered(b[1])
    assert manager.pool.is_registered(b[2])
    # b's Z chains on from a's Y: a later prompt finds a's X, a's Y, then b's Z
    assert manager.admit("c", X + Y + Z + [2]) == 12
    assert manager.table("c")[:3] == [a[0], a[1], b[2]]
    manager.free("c")
    manager.free("b")  # b's own X and Y were never cached: plainly free
    assert b[0] in manager.pool.plain_free_ids() and b[1] in manager.pool.plain_free_ids()
    assert manager.pool.evictable_ids() == [b[2]]
    check_invariants(manager, ["a"])


# --- eviction ----------------------------------------------------------------------------

def test_evicts_least_recently_freed_and_an_evicted_block_is_no_longer_hit():
    manager = KVBlockManager(6, BS)
    admitted(manager, "a", X + Y + [1])  # a: X, Y cached, plus a tail
    admitted(manager, "b", Z + W + [1])
    a, b = manager.table("a"), manager.table("b")
    manager.free("a")
    manager.free("b")
    # a before b; within a sequence its tail first (so no chain is cut in the middle)
    assert manager.pool.evictable_ids() == [a[1], a[0], b[1], b[0]]
    assert manager.num_free() == 6

    manager.admit("c", [0] * 9)  # 3 blocks: the 2 plain free tails, then a's Y
    assert manager.evictions == 1
    assert manager.table("c")[2] == a[1]
    assert manager.admit("d", X + Y + [1]) == 4  # X still cached, Y gone
    # X was hit, not evicted; d's 2 own blocks are b's W, then b's Z
    assert manager.table("d") == [a[0], b[1], b[0]]
    assert manager.evictions == 3 and manager.pool.evictable_ids() == []
    manager.free("c")
    assert manager.admit("e", Z + W + [1]) == 0
    check_invariants(manager, ["d", "e"])


def test_a_chain_whose_parent_was_evicted_is_never_hit_again():
    manager = KVBlockManager(7, 2)
    x, y, w, t = [1, 2], [3, 4], [5, 6], [9]
    manager.admit("a", x + y + t)  # 3 blocks
    manager.admit("b", x + y + w + t)  # 4 blocks; the pool is full
    manager.commit("a", x + y + t)  # registers a's x and y
    manager.commit("b", x + y + w + t)  # b's x, y stay its own; its w chains on a's y
    stranded = manager.table("b")[2]
    manager.free("a")  # a's x and y evictable
    manager.admit("e", [7] * 5)  # 3 blocks: a's tail, then a's y and x evicted
    assert manager.evictions == 2
    manager.free("e")
    manager.free("b")
    assert manager.pool.is_evictable(stranded)  # still cached ...
    assert manager.admit("f", x + y + w + t) == 0  # ... but its chain starts nowhere
    assert stranded not in manager.table("f") and manager.pool.is_evictable(stranded)
    manager.commit("f", x + y + w + t)  # x, y and w cached afresh under new uids
    assert manager.admit("g", x + y + w + t) == 6
    assert manager.table("g")[:3] == manager.table("f")[:3]
    check_invariants(manager, ["f", "g"])


def test_a_hit_on_evictable_blocks_counts_them_out_of_the_free_blocks():
    manager = KVBlockManager(5, BS)
    admitted(manager, "a", X + Y + [1])
    manager.free("a")  # X, Y evictable; 3 plain free
    manager.admit("filler", [0] * 12)  # takes the 3 plain free blocks
    assert manager.num_free() == 2 and manager.pool.num_evictable() == 2
    # X + Y + [1] hits both evictable blocks and needs 1 more: none is left once the
    # hits leave the evictable set (taking one would evict a block of its own hit)
    before = snapshot(manager, ["filler"])
    assert manager.admit("b", X + Y + [1]) is None
    assert snapshot(manager, ["filler"]) == before
    # without the tail the hit is capped at X, and 1 block covers Y: evicting Y itself
    assert manager.admit("b", X + Y) == 4
    assert manager.pool.evictable_ids() == [] and manager.evictions == 1
    check_invariants(manager, ["filler", "b"])


def test_a_hit_takes_evictable_blocks_out_of_the_evictable_set():
    manager = KVBlockManager(8, BS)
    admitted(manager, "a", X + Y + [1])
    manager.free("a")
    assert manager.num_free() == 8 and manager.pool.num_evictable() == 2
    assert manager.admit("b", X + Y + [1]) == 8
    assert manager.pool.num_evictable() == 0 and manager.num_free() == 5
    assert manager.evictions == 0


# --- refusals ----------------------------------------------------------------------------

def test_a_dry_pool_refuses_admit_and_grow_and_changes_nothing():
    manager = KVBlockManager(5, BS)
    admitted(manager, "a", X + Y + [1])
    admitted(manager, "b", [0])
    before = snapshot(manager, ["a", "b"])
    assert manager.admit("c", X + Y + Z + [1]) is None  # hits X, Y; needs 2 more, 1 free
    assert manager.admit("d", [0] * 5) is None
    assert not manager.has("c") and not manager.has("d")
    assert not manager.grow("a", 17)  # needs 2 more
    assert snapshot(manager, ["a", "b"]) == before
    assert manager.grow("a", 16)
    assert manager.num_free() == 0
    assert not manager.grow("b", 5)
    check_invariants(manager, ["a", "b"])


# --- commit: rewinds and registration --------------------------------------------------

def test_rewind_frees_exactly_the_blocks_past_the_new_length():
    manager = KVBlockManager(8, BS)
    admitted(manager, "a", X + [1])  # 5 tokens: 2 blocks
    assert manager.grow("a", 5 + 8)  # room for 8 drafts: 4 blocks
    table = manager.table("a")
    manager.commit("a", X + [1, 2, 3, 4, 5])  # 9 kept: 3 blocks
    assert manager.table("a") == table[:3]
    assert table[3] in manager.pool.plain_free_ids()
    assert manager.num_free() == 5
    manager.commit("a", X + [1, 2, 3, 4, 5])  # the same length again: nothing moves
    assert manager.table("a") == table[:3] and manager.num_free() == 5
    check_invariants(manager, ["a"])


def test_commit_drops_reserved_blocks_past_the_committed_length():
    manager = KVBlockManager(8, BS)
    assert manager.admit("a", X + [1], reserve=8) == 0
    assert len(manager.table("a")) == 4
    manager.commit("a", X + [1])
    assert len(manager.table("a")) == 2 and manager.num_free() == 6


def test_only_full_committed_blocks_are_registered():
    manager = KVBlockManager(8, BS)
    manager.admit("a", X + [1, 2])
    assert manager.grow("a", 8)  # drafts written through Y's block, not committed
    manager.commit("a", X + [1, 2])
    assert manager.pool.num_cached() == 1  # X alone: [1, 2] fills half a block
    # the partial block is never shared, even with a prompt that extends it
    assert manager.admit("b", X + [1, 2, 3, 4, 5]) == 4
    assert manager.table("b")[1] != manager.table("a")[1]
    manager.commit("a", X + [1, 2, 3, 4])  # a's second block is full now
    assert manager.pool.num_cached() == 2
    assert manager.admit("c", X + [1, 2, 3, 4, 5]) == 8
    assert manager.table("c")[:2] == manager.table("a")


def test_commit_registers_each_block_once():
    manager = KVBlockManager(8, BS)
    admitted(manager, "a", X + [1])
    assert manager.grow("a", 9)
    manager.commit("a", X + Y + [1])
    manager.commit("a", X + Y + [1])
    assert manager.pool.num_cached() == 2
    manager.free("a")
    assert manager.pool.num_evictable() == 2


# --- prefix caching off, and the counters ----------------------------------------------

def test_without_prefix_caching_nothing_is_looked_up_or_cached():
    manager = KVBlockManager(8, BS, prefix_caching=False)
    assert admitted(manager, "a", X + Y + [1]) == 0
    assert manager.admit("b", X + Y + [1]) == 0
    assert not set(manager.table("a")) & set(manager.table("b"))
    assert manager.pool.num_cached() == 0
    assert (manager.prefix_queries, manager.prefix_hits) == (18, 0)
    manager.free("a")
    manager.free("b")
    assert manager.pool.num_evictable() == 0 and len(manager.pool.plain_free_ids()) == 8
    check_invariants(manager, [])


def test_counters_count_queries_hits_and_evictions():
    manager = KVBlockManager(4, BS)
    admitted(manager, "a", X + Y + [1])
    assert (manager.prefix_queries, manager.prefix_hits, manager.evictions) == (9, 0, 0)
    assert manager.admit("b", X + [2]) == 4
    assert (manager.prefix_queries, manager.prefix_hits) == (14, 4)
    assert manager.admit("c", [0] * 9) is None  # a refused admit counts nothing
    assert (manager.prefix_queries, manager.prefix_hits) == (14, 4)
    manager.free("a")
    manager.free("b")  # Y then X evictable, 2 plain free
    assert manager.admit("c", [0] * 9) == 0
    assert (manager.prefix_queries, manager.prefix_hits, manager.evictions) == (23, 4, 1)
