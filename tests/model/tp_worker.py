"""One rank of the tensor-parallel test, started by torch.multiprocessing.spawn."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from paged_slots import SlotTables
from tandem.model.loader import load_model
from tandem.model.tensor_parallel import kv_heads_for_rank, shard_model


def run_script(model) -> torch.Tensor:
    """A fixed mix of prefills and batched K=3 steps in two slots; all logits, flattened to [rows, vocab]."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randint(model.config.vocab_size, (n,), generator=generator) for n in (17, 12))
    cache = SlotTables(model, num_slots=3, positions=32)
    logits = [cache(model, a[None, :11], [0], [0]).logits[0], cache(model, b[None, :6], [2], [0]).logits[0]]
    for step in range(2):
        sa, sb = 11 + 3 * step, 6 + 3 * step
        out = cache(model, torch.stack([a[sa:sa + 3], b[sb:sb + 3]]), [0, 2], [sa, sb])
        logits.append(out.logits.flatten(0, 1))
    return torch.cat(logits)


def worker(rank: int, world_size: int, port: int, folders: dict[str, str], out_dir: str) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        for name, folder in folders.items():
            model = shard_model(load_model(folder, progress=False).model, rank, world_size)
            cache_heads = model.new_cache(num_blocks=1).k[0].shape[1]
            assert cache_heads == len(kv_heads_for_rank(model.config.num_kv_heads, rank, world_size))
            torch.save(run_script(model), os.path.join(out_dir, f"{name}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
