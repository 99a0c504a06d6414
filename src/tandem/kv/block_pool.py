"""The pool of KV blocks of one rank: who references each block, which blocks are free,
and the prefix cache's registry of full blocks by their chain key.

A block is in exactly one of three states:

- referenced: its reference count (how many block tables hold it) is above 0;
- plain free: count 0 and not registered; allocatable at no cost;
- evictable: count 0 but registered in the prefix cache; allocatable, at the cost of
  forgetting its contents (an eviction).

Allocation takes plain free blocks first, then evicts the least recently freed
evictable block. Every operation touches only the blocks it names: counting the free
blocks is O(1), never a scan of the pool.
"""
from __future__ import annotations

from collections import OrderedDict

BlockKey = tuple[int, tuple[int, ...]]
"""A full block's identity in the prefix cache: (its parent's uid, its own token ids).

The parent's uid stands for the whole prefix before the block, so two blocks with the
same tokens after different prefixes have different keys. Keys are compared exactly
(tuple equality, not a digest), so a lookup can never return a block with other
contents."""

ROOT_UID = 0
"""The parent uid of a sequence's first block. Registered blocks get uids from 1 up."""


class BlockPool:
    """Block ids 0..num_blocks-1, their reference counts and the prefix-cache registry.

    Each registered block gets a fresh uid, never reused: when a block is evicted, the
    keys of blocks registered under it name a uid no live block carries any more, so
    lookups, which walk the chain from ROOT_UID, can never reach them again (they age out
    of the evictable set like any other cached block).
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.evictions = 0
        self._refcount = [0] * num_blocks
        # popped from the end: block 0 is handed out first
        self._plain_free = list(range(num_blocks - 1, -1, -1))
        # refcount-0 registered blocks, least recently freed first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._block_by_key: dict[BlockKey, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self._uid_of: dict[int, int] = {}
        self._next_uid = ROOT_UID + 1

    # --- counts -------------------------------------------------------------------

    def num_free(self) -> int:
        """Blocks allocatable now: plain free plus evictable."""
        return len(self._plain_free) + len(self._evictable)

    def num_evictable(self) -> int:
        return len(self._evictable)

    def num_cached(self) -> int:
        """Registered blocks, referenced or evictable."""
        return len(self._block_by_key)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def is_registered(self, block: int) -> bool:
        return block in self._uid_of

    # --- views for checks and metrics (O(pool): not for the scheduler's hot path) --

    def plain_free_ids(self) -> list[int]:
        return list(self._plain_free)

    def evictable_ids(self) -> list[int]:
        """Evictable blocks in eviction order: the next one evicted first."""
        return list(self._evictable)

    # --- allocation and references -------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """n blocks, each with reference count 1: plain free ones first, then evicted ones.
        The caller checks num_free() first; asking for more is a bug in the caller."""
        if n > self.num_free():
            raise RuntimeError(f"allocating {n} blocks with only {self.num_free()} free")
        blocks = []
        for _ in range(n):
            block = self._plain_free.pop() if self._plain_free else self._evict_oldest()
            self._refcount[block] = 1
            blocks.append(block)
        return blocks

    def acquire(self, block: int) -> None:
        """One more table holds a cached block (a prefix hit). An evictable block stops
        being evictable: its id can no longer be taken while a table holds it."""
        if self._refcount[block] == 0:
            if block not in self._evictable:
                raise RuntimeError(f"acquiring block {block}, which is neither held nor cached")
            del self._evictable[block]
        self._refcount[block] += 1

    def release(self, block: int) -> None:
        """One table fewer holds the block. At 0 a registered block stays cached, as the
        most recently freed evictable block; an unregistered one is plainly free."""
        count = self._refcount[block] - 1
        if count < 0:
            raise RuntimeError(f"releasing block {block}, which no table holds")
        self._refcount[block] = count
        if count == 0:
            if block in self._uid_of:
                self._evictable[block] = None
            else:
                self._plain_free.append(block)

    # --- the prefix-cache registry -------------------------------------------------

    def lookup(self, key: BlockKey) -> int | None:
        """The cached block with this key, or None. Changes nothing."""
        return self._block_by_key.get(key)

    def uid_of(self, block: int) -> int | None:
        """The uid of a registered block, None for an unregistered one."""
        return self._uid_of.get(block)

    def register(self, block: int, key: BlockKey) -> int:
        """Register a referenced, unregistered block under a key no block holds yet;
        returns the block's new uid (the parent uid of the keys of its children)."""
        if block in self._uid_of or key in self._block_by_key or self._refcount[block] == 0:
            raise RuntimeError(f"registering block {block}: registered, key taken, or unheld")
        uid = self._next_uid
        self._next_uid += 1
        self._block_by_key[key] = block
        self._key_of[block] = key
        self._uid_of[block] = uid
        return uid

    def _evict_oldest(self) -> int:
        """Take the least recently freed cached block's id, forgetting its contents."""
        block, _ = self._evictable.popitem(last=False)
        del self._block_by_key[self._key_of.pop(block)]
        del self._uid_of[block]
        self.evictions += 1
        return block
