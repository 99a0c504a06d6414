"""The scheduler's allocator of KV blocks: one block table per sequence over a shared
pool of fixed-size blocks, with automatic prefix caching like vLLM's.

Every tensor-parallel rank lays its KV pool out the same way, so the scheduler owns
this one allocator and sends each sequence's table to all ranks. Position t of a
sequence lives in block table[t // block_size] at offset t % block_size.

Prefix caching: when a sequence commits KV that fills a block, the block is registered
under its chain key (the parent block's uid, its own tokens). A later sequence whose
prompt starts with the same tokens finds those blocks by walking the chain block by
block and shares them (reference counts) instead of computing them again.

Why a sequence never writes into a shared block. The caller writes a sequence's KV only
at positions at or past its committed length (the prefill from cached_len, each verify
from the length before it), and rewinds only to at least the length before the verify.
Blocks shared with other sequences are cached blocks, and a table holds cached blocks
only wholly below its committed length: the blocks a hit hands out lie wholly below
cached_len (the hit is capped so at least one prompt token is left to compute, in a
block of the sequence's own), and commit registers only blocks wholly below the length
it commits. So commit never shrinks below a position the sequence did not itself write,
every block written holds a position past everything registered or hit, and it is the
sequence's own. Nothing here asserts this; it is the caller's contract.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from tandem.kv.block_pool import ROOT_UID, BlockPool


@dataclass
class _SeqBlocks:
    """One sequence's blocks. chain[i] is the uid of the cached block whose contents
    equal this sequence's block i, for each leading full block already settled: hit in
    admit, registered by commit, or found already cached from another sequence (then the
    uid is that other block's, and this sequence's block i stays unregistered). A uid here
    may outlive its block's eviction; uids are never reused, so blocks registered under it
    later are merely unreachable, and age out of the cache like any other."""
    table: list[int] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)


class KVBlockManager:
    """Block tables over one pool of num_blocks blocks of block_size positions each.

    Cumulative counters: prefix_queries (prompt tokens looked up by admit), prefix_hits
    (of those, tokens whose KV a hit supplied), evictions (cached blocks whose id was
    taken for something else).
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.pool = BlockPool(num_blocks)
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._seqs: dict[Hashable, _SeqBlocks] = {}

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    # --- sizes ----------------------------------------------------------------------

    def blocks_for(self, num_positions: int) -> int:
        """Blocks that cover num_positions positions: ceil(num_positions / block_size)."""
        if num_positions < 0:
            raise ValueError(f"num_positions must be >= 0, got {num_positions}")
        return -(-num_positions // self.block_size)

    def num_free(self) -> int:
        """Blocks allocatable now: unused ones plus cached ones no sequence references."""
        return self.pool.num_free()

    def usage(self) -> float:
        """Fraction of the pool referenced by some sequence (evictable blocks count as
        free: their ids are there for the taking)."""
        return (self.num_blocks - self.pool.num_free()) / self.num_blocks

    # --- sequences ------------------------------------------------------------------

    def has(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def table(self, seq_id: Hashable) -> list[int]:
        """A copy of the sequence's block table."""
        return list(self._state(seq_id, "table").table)

    def capacity(self, seq_id: Hashable) -> int:
        """Positions the sequence's table covers: len(table) * block_size."""
        return len(self._state(seq_id, "capacity").table) * self.block_size

    def admit(self, seq_id: Hashable, tokens: list[int], reserve: int = 0, lookup: bool = True) -> int | None:
        """Give seq_id (which must hold no table yet: ValueError otherwise) a table
        covering positions 0..len(tokens)+reserve-1.

        With prefix caching on, its first blocks are the cached full blocks of the longest
        cached prefix of `tokens`, looked up block by block along the hash chain; the hit
        is capped so at least one token of `tokens` is left to compute: at most
        (len(tokens) - 1) // block_size blocks (the forward that computes it yields the
        logits of the next token). Returns cached_len: how many leading tokens' KV the
        table already holds (a multiple of block_size); the caller computes the rest.

        lookup=False: no cached prefix is looked up (a prompt whose every row the prefill
        must compute, to score it); its blocks are still registered as it commits them.

        Returns None and changes nothing (no counters either) when the free blocks
        cannot cover the rest. Hit blocks that are evictable need no allocation, but they
        leave the evictable set, so they do not count towards what the rest can take.
        On success counts len(tokens) query tokens and cached_len hit tokens.
        """
        if seq_id in self._seqs:
            raise ValueError(f"admit: sequence {seq_id!r} already holds a block table")
        if reserve < 0:
            raise ValueError(f"admit: reserve must be >= 0, got {reserve}")
        hits, chain = self._longest_cached_prefix(tokens) if self.prefix_caching and lookup else ([], [])
        num_new = self.blocks_for(len(tokens) + reserve) - len(hits)
        revived = sum(1 for block in hits if self.pool.is_evictable(block))
        if num_new > self.pool.num_free() - revived:
            return None
        for block in hits:  # before allocating, so no hit block is evicted for the rest
            self.pool.acquire(block)
        table = hits + self.pool.allocate(num_new)
        self._seqs[seq_id] = _SeqBlocks(table=table, chain=chain)
        cached_len = len(hits) * self.block_size
        self.prefix_queries += len(tokens)
        self.prefix_hits += cached_len
        return cached_len

    def grow(self, seq_id: Hashable, num_positions: int) -> bool:
        """Extend the table to cover positions 0..num_positions-1 (no-op if it already
        does). False, with nothing changed, when the pool cannot."""
        state = self._state(seq_id, "grow")
        num_new = self.blocks_for(num_positions) - len(state.table)
        if num_new <= 0:
            return True
        if num_new > self.pool.num_free():
            return False
        state.table.extend(self.pool.allocate(num_new))
        return True

    def commit(self, seq_id: Hashable, tokens: Sequence[int]) -> None:
        """The sequence's KV now holds exactly `tokens` (its positions 0..len(tokens)-1,
        e.g. after a verify kept some drafts and rejected the rest).

        Blocks wholly past len(tokens) go back to the pool (a rewind after rejected
        drafts; reserved blocks past it go too, so grow before the next verify). With
        prefix caching on, every full block (all block_size positions below len(tokens))
        not yet registered is registered under its chain key, so later sequences can
        share it. If an equal block (same key) is already cached from another sequence,
        this sequence's own block stays unregistered (no dedup, no copy); its later
        blocks chain on from the cached one, so they are found along the same chain.

        The caller commits only at or past the length it last committed (see the module
        docstring): blocks already registered are then never rewound or rewritten.
        """
        state = self._state(seq_id, "commit")
        length = len(tokens)
        if length > len(state.table) * self.block_size:
            raise ValueError(
                f"commit: {length} tokens for sequence {seq_id!r}, whose table covers only "
                f"{len(state.table) * self.block_size} positions")
        keep = self.blocks_for(length)
        self._release(state.table[keep:])
        del state.table[keep:]
        num_full = length // self.block_size
        del state.chain[num_full:]
        if self.prefix_caching:
            self._register_full_blocks(state, tokens, num_full)

    def free(self, seq_id: Hashable) -> None:
        """Drop the sequence's table (unknown seq_id: no-op). Reference counts drop; a
        registered block no sequence references stays cached and reusable until the pool
        needs its id (least recently freed evicted first); an unregistered one is plainly
        free."""
        state = self._seqs.pop(seq_id, None)
        if state is not None:
            self._release(state.table)

    # --- internals --------------------------------------------------------------------

    def _state(self, seq_id: Hashable, op: str) -> _SeqBlocks:
        state = self._seqs.get(seq_id)
        if state is None:
            raise ValueError(f"{op}: unknown sequence {seq_id!r} (it holds no block table)")
        return state

    def _block_tokens(self, tokens: Sequence[int], index: int) -> tuple[int, ...]:
        return tuple(tokens[index * self.block_size:(index + 1) * self.block_size])

    def _longest_cached_prefix(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """The cached blocks of the longest cached prefix of tokens, within the hit cap,
        and their uids. Changes nothing (a failed admit must leave no trace)."""
        max_hits = max(0, (len(tokens) - 1) // self.block_size)
        hits: list[int] = []
        chain: list[int] = []
        parent = ROOT_UID
        for index in range(max_hits):
            block = self.pool.lookup((parent, self._block_tokens(tokens, index)))
            if block is None:
                break
            parent = self.pool.uid_of(block)
            hits.append(block)
            chain.append(parent)
        return hits, chain

    def _register_full_blocks(self, state: _SeqBlocks, tokens: Sequence[int], num_full: int) -> None:
        parent = state.chain[-1] if state.chain else ROOT_UID
        for index in range(len(state.chain), num_full):
            block = state.table[index]
            # A block here is registered already only after a rewind below what this
            # sequence had committed (the caller's contract rules it out): keep it as is.
            uid = self.pool.uid_of(block)
            if uid is None:
                key = (parent, self._block_tokens(tokens, index))
                cached = self.pool.lookup(key)
                uid = self.pool.register(block, key) if cached is None else self.pool.uid_of(cached)
            state.chain.append(uid)
            parent = uid

    def _release(self, blocks: list[int]) -> None:
        # Last block first: among one sequence's cached blocks the tail is evicted first,
        # since evicting an earlier block would strand every later one of its chain.
        for block in reversed(blocks):
            self.pool.release(block)
