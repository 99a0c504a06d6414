"""One rank of the tensor-parallel quantized-cache test, started by torch.multiprocessing.spawn:
the same folder loaded, sharded and quantized to int4 three times (cold, warm, and with
rank 1's cache file removed); saves its logits and the cache's hit/miss counts after each."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from tandem.model import quant
from tandem.model.loader import load_model
from tandem.model.quant import packed_cache
from tandem.model.tensor_parallel import shard_model


def logits_of(model) -> torch.Tensor:
    tokens = torch.arange(3, 23)[None]
    return model(tokens, torch.tensor([0]), model.new_cache(8), torch.arange(8, dtype=torch.int32)[None]).logits


def worker(rank: int, world_size: int, port: int, folder: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    logits, hits, misses = [], [], []
    try:
        for round_ in range(3):
            if round_ == 2:
                dist.barrier()
                if rank == 1:
                    mine = [f for f in os.listdir(packed_cache.cache_dir()) if f"rank1of{world_size}" in f]
                    assert len(mine) == 1
                    os.remove(os.path.join(packed_cache.cache_dir(), mine[0]))
                dist.barrier()
            model = shard_model(load_model(folder, progress=False).model, rank, world_size)
            quant.quantize(model, "int4")
            logits.append(logits_of(model))
            hits.append(packed_cache.stats["hits"])
            misses.append(packed_cache.stats["misses"])
        torch.save({"logits": logits, "hits": hits, "misses": misses}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
