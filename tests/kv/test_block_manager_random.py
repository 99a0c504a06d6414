"""Many random admits, verifies (grow, write drafts, commit the kept ones) and frees,
with the pool's invariants checked after each, against a shadow of the KV contents.

The shadow records which token each block holds at each offset as sequences write
them. Every live sequence's table must read back exactly its committed tokens, a hit
must hand over blocks that hold the prompt's own tokens (an inexact match would not),
and every write must land in a block the writer alone holds and that is not cached.
Prompts come from a few shared texts over a tiny vocabulary, so hits, shared blocks,
equal blocks after different prefixes, and evictions are all frequent.
"""
from __future__ import annotations

import random

import pytest
from kv_checks import check_invariants, snapshot

from tandem.kv import KVBlockManager

NUM_BLOCKS = 24
VOCAB = 3
OPS = 500


class Simulation:
    def __init__(self, manager: KVBlockManager, rng: random.Random):
        self.manager = manager
        self.rng = rng
        self.kv: dict[int, list[int | None]] = {}  # block -> token at each offset
        self.committed: dict[int, list[int]] = {}  # seq -> tokens its KV holds
        self.text: dict[int, list[int]] = {}  # seq -> its true tokens, prompt and after
        self.bases = [self.random_tokens(40) for _ in range(3)]
        self.next_seq = 0

    def random_tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def write(self, seq: int, start: int, tokens: list[int]) -> None:
        """The KV of tokens at positions start.. of seq, as a forward would write it."""
        bs = self.manager.block_size
        table = self.manager.table(seq)
        for t, token in enumerate(tokens, start):
            block = table[t // bs]
            assert self.manager.pool.refcount(block) == 1, "a write into a shared block"
            assert not self.manager.pool.is_registered(block), "a write into a cached block"
            self.kv.setdefault(block, [None] * bs)[t % bs] = token

    def read(self, seq: int, length: int) -> list[int | None]:
        bs = self.manager.block_size
        table = self.manager.table(seq)
        return [self.kv.get(table[t // bs], [None] * bs)[t % bs] for t in range(length)]

    def check(self) -> None:
        check_invariants(self.manager, self.committed)
        for seq, tokens in self.committed.items():
            assert self.read(seq, len(tokens)) == tokens, f"the KV of seq {seq}"
            assert len(self.manager.table(seq)) >= self.manager.blocks_for(len(tokens))

    def admit(self) -> None:
        manager, rng = self.manager, self.rng
        base = rng.choice(self.bases)
        text = base[:rng.randrange(0, 30)]
        if rng.random() < 0.3:  # diverge from the shared text
            text += self.random_tokens(rng.randrange(1, 6))
        text += self.random_tokens(1) if not text else []
        text += base[len(text):] if rng.random() < 0.5 else self.random_tokens(20)
        prompt = text[:rng.randrange(1, min(len(text), 30) + 1)]
        reserve = rng.randrange(0, 2 * manager.block_size)
        seq = self.next_seq
        self.next_seq += 1

        before = snapshot(manager, self.committed)
        plain_before = len(manager.pool.plain_free_ids())
        cached_len = manager.admit(seq, prompt, reserve)
        if cached_len is None:
            assert not manager.has(seq)
            assert snapshot(manager, self.committed) == before
            return
        bs = manager.block_size
        assert cached_len % bs == 0 and 0 <= cached_len <= len(prompt) - 1
        if not manager.prefix_caching:
            assert cached_len == 0
        table = manager.table(seq)
        assert len(table) == manager.blocks_for(len(prompt) + reserve)
        num_new = len(table) - cached_len // bs
        assert manager.evictions - before["counters"][2] == max(0, num_new - plain_before)
        assert manager.prefix_queries == before["counters"][0] + len(prompt)
        assert manager.prefix_hits == before["counters"][1] + cached_len
        # the hit blocks hold exactly the prompt's leading tokens: the match is exact
        assert self.read(seq, cached_len) == prompt[:cached_len]

        self.write(seq, cached_len, prompt[cached_len:])  # the prefill
        manager.commit(seq, prompt)
        assert len(manager.table(seq)) == manager.blocks_for(len(prompt))
        self.committed[seq] = list(prompt)
        self.text[seq] = text

    def verify(self, seq: int) -> None:
        """Write k drafts past the committed tokens, keep the right ones, rewind the rest."""
        manager, rng = self.manager, self.rng
        length = len(self.committed[seq])
        k = rng.randrange(1, 6)
        text = self.text[seq]
        text += self.random_tokens(max(0, length + k - len(text)))
        before = snapshot(manager, self.committed)
        plain_before = len(manager.pool.plain_free_ids())
        if not manager.grow(seq, length + k):
            assert snapshot(manager, self.committed) == before
            return
        assert manager.evictions - before["counters"][2] == max(
            0, len(manager.table(seq)) - len(before["tables"][seq]) - plain_before)
        kept = rng.randrange(0, k + 1)
        drafts = text[length:length + kept] + [t + VOCAB for t in text[length + kept:length + k]]
        self.write(seq, length, drafts)
        table = manager.table(seq)
        new_tokens = text[:length + kept]
        manager.commit(seq, new_tokens)
        assert manager.table(seq) == table[:manager.blocks_for(len(new_tokens))]
        self.committed[seq] = new_tokens

    def free(self, seq: int) -> None:
        self.manager.free(seq)
        del self.committed[seq]
        assert not self.manager.has(seq)

    def run(self, ops: int) -> None:
        for _ in range(ops):
            roll = self.rng.random()
            live = list(self.committed)
            if not live or roll < 0.3:
                self.admit()
            elif roll < 0.8:
                self.verify(self.rng.choice(live))
            else:
                self.free(self.rng.choice(live))
            self.check()
        for seq in list(self.committed):
            self.free(seq)
        self.check()
        assert self.manager.num_free() == self.manager.num_blocks


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("block_size", [1, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_keep_the_pool_consistent(seed, block_size, prefix_caching):
    manager = KVBlockManager(NUM_BLOCKS, block_size, prefix_caching=prefix_caching)
    sim = Simulation(manager, random.Random(seed))
    sim.run(OPS)
    if prefix_caching:  # the run exercised what it is meant to
        assert manager.prefix_hits > 0 and manager.evictions > 0
    else:
        assert manager.prefix_hits == 0 and manager.evictions == 0
