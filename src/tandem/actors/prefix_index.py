"""Which prompt prefixes an engine replica holds in its prefix cache, by their prefix
keys (tandem.actors.prefix_keys): what the replica reports to the routers in front.

A prompt's keys are noted when it is admitted, weighted by the KV blocks its prompt
fills. The pool evicts cached blocks least recently freed first; as its eviction count
grows, the index forgets its oldest prompts by as many blocks, and a restarted shard
group (its KV gone) empties it. So a key it reports is a prefix the pool holds, as far
as the pool's own counters can tell, not merely one that was once sent here."""
from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 4096  # what a report carries at most (8 bytes a key)


class PrefixIndex:
    def __init__(self):
        self._keys: OrderedDict[int, int] = OrderedDict()  # key -> blocks it accounts for, oldest first
        self.version = 0  # changes whenever the set of keys does
        self._evictions = 0
        self._generation = None

    def note(self, keys: list[int], blocks: int) -> None:
        """A prompt with these keys was admitted and fills `blocks` blocks (its last key carries them)."""
        if not keys:
            return
        for k in keys:
            self._keys[k] = self._keys.pop(k, 0)
        self._keys[keys[-1]] = max(self._keys[keys[-1]], blocks)
        while len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)
        self.version += 1

    def follow(self, evictions: int, generation) -> None:
        """Forget what the pool evicted since the last call, or everything after a restart."""
        if generation != self._generation:
            restarted, self._generation = self._generation is not None, generation
            if restarted and self._keys:
                self._keys.clear()
                self.version += 1
        evicted, self._evictions = evictions - self._evictions, evictions
        while evicted > 0 and self._keys:
            _, blocks = self._keys.popitem(last=False)
            evicted -= blocks
            self.version += 1

    def keys(self) -> frozenset[int]:
        return frozenset(self._keys)
