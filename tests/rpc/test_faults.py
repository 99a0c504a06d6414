"""Fault injection on a group of two shard processes (tensor parallel 2, gloo), seen
through the engine: a rank that raises in the forward, a rank process that dies in the
middle of a verify, a rank that hangs, and a short result. Each time the batch finishes
with finish reason error and a message naming the cause, within the deadline; the ranks
still reachable got the all-zero verdict; nothing hangs; and after the group's restart
the next request succeeds. All of it with the ranks' Session streams over their session
sockets and over gRPC. The ranks run the tiny random-weight chat model: what is under
test is the group's fault handling, not the text, and every restart loads it afresh.
"""
from __future__ import annotations

import os
import re
import time

import grpc
import pytest

from tandem.config import EngineConfig
from tandem.engine import Engine
from tandem.model.loader import load_tokenizer
from tandem.rpc.generated import shard_pb2 as pb
from tandem.rpc.generated import shard_pb2_grpc as pb_grpc
from tandem.rpc.grpc_group import GrpcShardGroup
from tandem.rpc.launcher import ProcessLauncher
from tandem.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

DEADLINE_S = 6.0  # every RPC's
COLLECTIVE_S = 3.0  # a rank stuck in a collective with a lost peer gives up after this
VERDICT_S = 2.0  # the failed verdict's deadline
WITHIN_S = DEADLINE_S + VERDICT_S + 10.0  # loose: this machine is shared; not a performance check
F = pb.FaultRequest


@pytest.fixture(scope="module", params=["socket", "grpc"])
def engine(tiny_chat_model, request):
    """The ranks' Session streams over their session sockets (this host's default), or over gRPC."""
    config = EngineConfig(model=tiny_chat_model, drafter="ngram", max_num_seqs=4, max_model_len=128, row_budget=64)
    group = GrpcShardGroup(config.shard_spec(), ProcessLauncher(2, fault_injection=True), deadline_s=DEADLINE_S,
                           collective_timeout_s=COLLECTIVE_S, failed_verdict_deadline_s=VERDICT_S,
                           session_socket=request.param == "socket")
    assert group.session_transports == [request.param] * 2
    tok = load_tokenizer(tiny_chat_model, progress=False)
    yield Engine(group, tok.tokenizer, tok.eos_token_ids, config)
    group.close()


def call(address: str, method: str, msg):
    with grpc.insecure_channel(address) as channel:
        return getattr(pb_grpc.ShardControlStub(channel), method)(msg, timeout=2.0)


def health(address: str) -> pb.HealthReply | None:
    try:
        return call(address, "Health", pb.Empty())
    except grpc.RpcError:
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "rank, mode, cause",
    [
        (1, F.RAISE, r"rank 1 \(.*\): INTERNAL: RuntimeError: injected fault on rank 1"),
        (1, F.EXIT, r"rank 1 \(.*\): unreachable"),
        (0, F.HANG, r"rank 0 \(.*\): no answer within the 6 s deadline"),
        (0, F.SHORT_RESULT, r"rank 0 returned a short result"),
    ],
    ids=["raise", "exit", "hang", "short-result"],
)
def test_a_failed_rank_finishes_its_batch_with_an_error_and_the_next_request_succeeds(engine, rank, mode, cause):
    group = engine.group
    if not group.healthy():
        engine.step()  # the restart after the previous fault
    assert group.healthy()
    addresses = list(group.addresses)
    pids = [health(a).pid for a in addresses]

    rid = engine.add_request("Count with me: one, two, three,", SamplingParams(max_tokens=16, ignore_eos=True))
    call(addresses[rank], "InjectFault", F(mode=mode))
    t0 = time.monotonic()
    out = None
    for _ in range(3):  # the admission tick (prefill, first token out), then the failing verify
        out = next((o for o in engine.step() if o.request_id == rid), out)
        if out is not None and out.finished:
            break
    elapsed = time.monotonic() - t0

    assert out.finished and out.finish_reason == "error", out
    assert re.search(cause, out.error), out.error
    assert elapsed < WITHIN_S, f"the failed batch took {elapsed:.1f} s"
    assert not group.healthy()
    batch_id = int(re.search(r"verify of batch (\d+)", out.error).group(1))
    reached = [int(r) for r in re.search(r"the failed verdict reached ranks \[([\d, ]*)\]", out.error).group(1).split(",") if r]
    for r, address in enumerate(addresses):
        h = health(address)
        if r in reached:
            assert h.last_verdict_batch_id == batch_id and h.last_verdict_failed and h.failed_verdicts == 1
            assert h.pending_batch_id == 0, "a rank that took the failed verdict keeps no pending rows"
    expected_reached = {F.RAISE: [0, 1], F.EXIT: [0], F.HANG: [1], F.SHORT_RESULT: [0, 1]}[mode]
    assert reached == expected_reached
    if mode == F.EXIT:
        assert health(addresses[1]) is None and group.launcher.procs[1].poll() is not None

    ok = engine.generate(["The capital of France is"], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert ok.finish_reason == "length" and len(ok.token_ids) == 8, ok
    assert group.healthy() and group.addresses != addresses
    assert group.session_transports == ["socket" if group.use_session_socket else "grpc"] * 2
    assert not any(alive(p) for p in pids), "the restart stopped every old rank"
