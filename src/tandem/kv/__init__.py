"""The KV cache as a pool of fixed-size blocks: the scheduler's allocator of block
tables, with prefix caching (see tandem.kv.block_manager)."""
from __future__ import annotations

from tandem.kv.block_manager import KVBlockManager
from tandem.kv.block_pool import BlockPool

__all__ = ["BlockPool", "KVBlockManager"]
