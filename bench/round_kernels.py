"""What one speculative round costs on a GPU, call by call: propose (the DFlash drafter),
verify (the target's forward of n x k rows and its picks), commit (the verdict), with the
number of GPU kernels and their GPU time for each.

    python bench/round_kernels.py [--batches 1 8 32] [--rounds 120]

Why: a graphed forward of a small model at small batch is bound by how many kernels it
launches (SmolLM2 at batch 1 on an H200: ~2.5 us a kernel), so the kernel count is the
number to watch when the forward changes. The target is SmolLM2-135M's shape with random
weights (timing does not depend on the weights; no model file needed), loaded as a real
one is (bf16, q/k/v and gate/up sharing storage), with the shipped DFlash drafter. Each
round proposes 7 drafts, verifies 8 rows a sequence and keeps 3 (k = 1: plain decoding,
no propose). Needs a CUDA GPU. Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from common import covering, fixed_block_tables, json_line, machine, print_table  # noqa: E402

# SmolLM2-135M's shape
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
               head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True)
SLOTS, CONTEXT, PROMPT, KEEP = 32, 1024, 100, 3
BLOCK = 16  # positions of a KV block


def build_shard():
    import torch

    from tandem.drafters.dflash import DFlashDrafter, load_dflash_checkpoint, shipped_checkpoint
    from tandem.model.config import ModelConfig
    from tandem.model.cpu_linear import share_fused_storage
    from tandem.model.kv_cache import PagedKVCache
    from tandem.model.llama import LlamaForCausalLM
    from tandem.model.verify_graphs import VerifyGraphs
    from tandem.shard.model_shard import ModelShard

    dev, dtype = torch.device("cuda"), torch.bfloat16
    cfg = ModelConfig(**SMOLLM2)
    torch.manual_seed(0)
    target = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in target.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
    target = target.to(dev, dtype).eval().requires_grad_(False)
    share_fused_storage(target)  # as the loader does on a GPU
    blocks = SLOTS * -(-CONTEXT // BLOCK)  # every slot's whole context (Rounds.tables)
    cache = PagedKVCache(cfg.num_layers, blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype, dev, scratch_blocks=1)
    draft = load_dflash_checkpoint(shipped_checkpoint("smollm2"), dtype=dtype, device=dev)
    drafter = DFlashDrafter(draft, target, num_slots=SLOTS, num_blocks=blocks, block_size=BLOCK, max_seq_len=CONTEXT)
    return ModelShard(target, cache, num_slots=SLOTS, max_model_len=CONTEXT, row_budget=512, vocab_size=cfg.vocab_size,
                      drafter=drafter, graphs=VerifyGraphs(target, cache, CONTEXT))


class Rounds:
    def __init__(self, shard):
        self.shard, self.batch_id = shard, 0
        # slot s owns its own blocks; each command sends the blocks its positions reach
        self.tables = fixed_block_tables(SLOTS, CONTEXT, BLOCK)

    def run(self, n: int, k: int, count: int) -> dict[str, list[float]]:
        """`count` rounds of n sequences; each call's wall ms."""
        from torch.profiler import record_function

        from tandem.shard.commands import GREEDY, PrefillItem, ProposeBatch, Verdict, VerifyBatch

        shard, slots = self.shard, list(range(n))
        shard.release(slots)
        shard.prefill([PrefillItem(slot=s, tokens=[100 + s + i for i in range(PROMPT)],
                                   blocks=covering(self.tables[s], PROMPT, BLOCK)) for s in slots])
        last, times = [5] * n, {"propose": [], "verify": [], "commit": []}
        for _ in range(count):
            pos = [shard.lengths[s] for s in slots]
            t0 = time.perf_counter()
            with record_function("propose"):
                drafts = [[]] * n
                if k > 1:
                    drafts = shard.propose(ProposeBatch(slots=slots, last_tokens=last, positions=pos,
                                                        num_drafts=[k - 1] * n, sampling=[GREEDY] * n)).drafts
            t1 = time.perf_counter()
            self.batch_id += 1
            with record_function("verify"):
                res = shard.verify(VerifyBatch(batch_id=self.batch_id, n=n, k=k, slots=slots, start_pos=pos,
                                               tokens=[t for i in range(n) for t in [last[i], *drafts[i]]],
                                               sampling=[GREEDY] * n,
                                               block_tables=[covering(self.tables[s], p + k, BLOCK)
                                                             for s, p in zip(slots, pos)]))
            t2 = time.perf_counter()
            with record_function("commit"):
                shard.commit(Verdict(batch_id=self.batch_id, words=[min(KEEP, k)] * n))
            t3 = time.perf_counter()
            last = [res.picks[i * k + min(KEEP, k) - 1] for i in range(n)]  # the bonus token, as the engine emits
            times["propose"].append((t1 - t0) * 1e3)
            times["verify"].append((t2 - t1) * 1e3)
            times["commit"].append((t3 - t2) * 1e3)
        return times


def kernels_per_call(rounds: Rounds, n: int, k: int, count: int = 20) -> dict[str, tuple[float, float]]:
    """call -> (kernels, GPU us) a round, from a profile of `count` rounds."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rounds.run(n, k, count)
    events = prof.events()
    spans = [e for e in events if e.name in ("propose", "verify", "commit") and e.device_type.name == "CUDA"]
    gpu = sorted((e for e in events if e.device_type.name == "CUDA" and e.name not in ("propose", "verify", "commit")),
                 key=lambda e: e.time_range.start)
    out = {}
    for name in ("propose", "verify", "commit"):
        kernels = busy = 0
        for span in (s for s in spans if s.name == name):
            inside = [e for e in gpu if span.time_range.start <= e.time_range.start < span.time_range.end]
            kernels += len(inside)
            busy += sum(e.time_range.elapsed_us() for e in inside)
        out[name] = (kernels / count, busy / count)
    return out


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=120)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("round_kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    rounds = Rounds(build_shard())
    rows, results = [], []
    for n in args.batches:
        for k in (1, 8):
            rounds.run(n, k, max(10, args.rounds // 3))  # CUDA graph captures, untimed
            times = rounds.run(n, k, args.rounds)
            med = {c: statistics.median(v[len(v) // 4:]) for c, v in times.items()}
            kern = kernels_per_call(rounds, n, k)
            r = {"batch": n, "k": k, **{f"{c}_ms": round(med[c], 3) for c in med},
                 **{f"{c}_kernels": round(kern[c][0], 1) for c in kern}, **{f"{c}_gpu_us": round(kern[c][1], 1) for c in kern}}
            results.append(r)
            rows.append([n, k, r["propose_ms"], r["propose_kernels"], r["verify_ms"], r["verify_kernels"], r["verify_gpu_us"],
                         r["commit_ms"]])
    print_table(["batch", "k", "propose ms", "kernels", "verify ms", "kernels", "GPU us", "commit ms"], rows,
                title=f"{torch.cuda.get_device_name()}, SmolLM2 shape (random weights), bf16, shipped DFlash")
    json_line({"bench": "round_kernels", "machine": machine(), "rows": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
