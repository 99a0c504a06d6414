"""The control-path cost of the gRPC shard group: what one tick's round trips add.

One tick = verify (n=8 sequences x k=5 rows, ONE forward) + the verdict to every rank,
the shard control protocol of one batched verify. The same ticks run on the in-process
LocalShardGroup and on a GrpcShardGroup of shard processes over loopback; the
difference of the median tick times is the control-path overhead (target: <= 1 ms).

The target is a tiny random Llama (2 layers), so the forward is about a millisecond and
the overhead is not lost in the forward's noise; the control path does not depend on
the model's size. The groups take turns, round by round, so a busy machine slows them
alike. The gRPC group sends the tick's commands on one Session per rank (with
GrpcShardGroup's defaults: over the rank's Unix session socket on this host, not a gRPC
stream) and waits for the verdict's acknowledgement in each tick (what an embedded
engine on shard processes does); "verdict riding" leaves it to ride on the next tick's
verify (one message a tick: what the scheduler actor's engine does, its outputs leaving
mid-tick); the same group with unary calls is shown for comparison. The two-rank group (tensor parallel 2,
gloo) is shown for information: its ticks also pay the forward's all-reduces, which are
not control path.

    python bench/grpc_overhead.py [--ticks 400] [--no-tp2]

Prints a short table, then one line of JSON whose key overhead_ms_per_tick is the result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from tandem.rpc.generated import shard_pb2 as pb  # noqa: E402
from tandem.rpc.grpc_group import GrpcShardGroup  # noqa: E402
from tandem.rpc.launcher import ProcessLauncher  # noqa: E402
from tandem.shard.commands import GREEDY, PrefillItem, Verdict, VerifyBatch  # noqa: E402
from tandem.shard.factory import ShardSpec, build_model_shard  # noqa: E402
from tandem.shard.local_group import LocalShardGroup  # noqa: E402

from common import covering, fixed_block_tables  # noqa: E402

N, K = 8, 5
PROMPT_LEN = 8
TICKS_PER_ROUND = 50
MAX_MODEL_LEN = PROMPT_LEN + TICKS_PER_ROUND + K + 1
TARGET_MS = 1.0


def tiny_model(folder: str) -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def run_round(group, ticks: int, batch_ids, settle: bool = True) -> list[float]:
    """Prefill N slots, then `ticks` timed ticks (verify + verdict); the tick times in ms.
    settle=False: a tick does not wait for its verdict's acknowledgement (the verdict rides
    on the next tick's verify, its acknowledgement read before that verify's reply)."""
    bs = group.limits.block_size
    tables = fixed_block_tables(N, MAX_MODEL_LEN, bs)  # slot i owns the blocks of tables[i]
    group.prefill([PrefillItem(slot, [1 + slot] * PROMPT_LEN, blocks=covering(tables[slot], PROMPT_LEN, bs))
                   for slot in range(N)])
    lengths, times = [PROMPT_LEN] * N, []
    for _ in range(ticks):
        cmd = VerifyBatch(batch_id=next(batch_ids), n=N, k=K, slots=list(range(N)), start_pos=list(lengths),
                          tokens=[7] * (N * K), sampling=[GREEDY] * N,
                          block_tables=[covering(t, n + K, bs) for t, n in zip(tables, lengths)])
        t0 = time.perf_counter()
        res = group.verify(cmd)
        group.commit(Verdict(cmd.batch_id, [1] * N))  # keep the last token's row: every slot + 1
        if settle:
            assert not group.settle()  # every rank's acknowledgement, as the engine waits for it
        times.append((time.perf_counter() - t0) * 1000.0)
        assert len(res.picks) == N * K
        lengths = [n + 1 for n in lengths]
    group.release(list(range(N)))
    assert not group.settle()
    return times


def rpc_ping_ms(group, count: int = 200) -> float:
    stub = group._stubs[0]
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        stub.Health(pb.Empty(), timeout=5)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=400, help="timed ticks per group (default %(default)s)")
    parser.add_argument("--no-tp2", action="store_true", help="skip the two-rank group")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the tiny forward gains nothing from more; every rank gets 1 too

    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as tmp:
        spec = ShardSpec(model=tiny_model(tmp), num_slots=N, max_model_len=MAX_MODEL_LEN,
                         row_budget=64, dtype="float32", device="cpu")
        groups = {"in-process (LocalShardGroup)": LocalShardGroup(build_model_shard(spec, progress=False)[0])}
        groups["gRPC, 1 shard process"] = GrpcShardGroup(spec, ProcessLauncher(1, threads_per_rank=1), deadline_s=30)
        riding = "gRPC, 1 shard process, verdict riding"  # its verdicts ride on the next verify: no settle
        groups[riding] = GrpcShardGroup(spec, ProcessLauncher(1, threads_per_rank=1),
                                                                        deadline_s=30)
        groups["gRPC, 1 shard process, unary"] = GrpcShardGroup(spec, ProcessLauncher(1, threads_per_rank=1), deadline_s=30,
                                                               sessions=False)
        if not args.no_tp2:
            groups["gRPC, 2 shard processes (TP2)"] = GrpcShardGroup(spec, ProcessLauncher(2, threads_per_rank=1), deadline_s=30)
        try:
            from itertools import count

            ids = count(1)
            for name, group in groups.items():  # warm up: first forwards, connections
                run_round(group, 10, ids, settle=name != riding)
            times: dict[str, list[float]] = {name: [] for name in groups}
            rounds = max(1, args.ticks // TICKS_PER_ROUND)
            for _ in range(rounds):  # take turns, so load on the machine hits every group alike
                for name, group in groups.items():
                    times[name] += run_round(group, TICKS_PER_ROUND, ids, settle=name != riding)
            ping = rpc_ping_ms(groups["gRPC, 1 shard process"])
        finally:
            for group in groups.values():
                group.close()

    medians = {name: statistics.median(t) for name, t in times.items()}
    local = medians["in-process (LocalShardGroup)"]
    overhead = medians["gRPC, 1 shard process"] - local
    print(f"control-path cost per tick: verify n={N} x k={K} + verdict, {rounds * TICKS_PER_ROUND} ticks per group, "
          "tiny 2-layer target, loopback, 1 CPU thread a rank")
    print(f"{'group':38s} {'median ms':>10s} {'p90 ms':>8s} {'over local':>11s}")
    for name, t in times.items():
        p90 = statistics.quantiles(t, n=10)[-1]
        print(f"{name:38s} {medians[name]:10.3f} {p90:8.3f} {medians[name] - local:+11.3f}")
    print(f"one gRPC round trip (Health), median: {ping:.3f} ms; target overhead <= {TARGET_MS} ms a tick: "
          f"{'met' if overhead <= TARGET_MS else 'NOT met'}")
    result = {
        "overhead_ms_per_tick": round(overhead, 4),
        "local_ms_per_tick": round(local, 4),
        "grpc_ms_per_tick": round(medians["gRPC, 1 shard process"], 4),
        "grpc_riding_ms_per_tick": round(medians[riding], 4),
        "grpc_unary_ms_per_tick": round(medians["gRPC, 1 shard process, unary"], 4),
        "rpc_round_trip_ms": round(ping, 4),
        "n": N,
        "k": K,
        "ticks": rounds * TICKS_PER_ROUND,
        "target_ms": TARGET_MS,
    }
    if "gRPC, 2 shard processes (TP2)" in medians:
        result["grpc_tp2_ms_per_tick"] = round(medians["gRPC, 2 shard processes (TP2)"], 4)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
