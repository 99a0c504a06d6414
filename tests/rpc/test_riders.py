"""Riders: a verdict or a release the scheduler sends without waiting rides on the next
command (Command.before), one message a tick instead of two. The shard runs the riders
first, in order, and answers each before the command; on a GPU a verify's forward is
queued before the riders' replies go out (forced here on the CPU, so both paths run)."""
from __future__ import annotations

import grpc
import pytest

from slot_blocks import prefill_item
from test_shard_server import batch, init, prefill_msg, verify_msg
from tandem.rpc.generated import shard_pb2 as pb
from tandem.shard.commands import Verdict
from tandem.shard.model_shard import ModelShard

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forward_is_async", [False, True], ids=["cpu-order", "gpu-order"])
def test_riders_run_first_in_order_each_with_its_reply_and_a_bad_one_harms_nothing(
        shard_server, tiny_model_dir, monkeypatch, forward_is_async):
    monkeypatch.setattr(ModelShard, "forward_is_async", property(lambda self: forward_is_async))
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    commit = pb.Command(timeout_s=10, commit=pb.Verdict(batch_id=1, words=[2]))
    release = pb.Command(timeout_s=10, release=pb.ReleaseRequest(slots=[1]))
    bad_rider = pb.Command(timeout_s=10, commit=pb.Verdict(batch_id=77, words=[1]))  # nothing pending as 77
    nested = pb.Command(timeout_s=10, release=pb.ReleaseRequest(slots=[2]), before=[release])
    commands = [
        pb.Command(timeout_s=10, prefill=pb.PrefillRequest(items=[prefill_msg(0, [1, 2, 3]), prefill_msg(1, [4, 5, 6])])),
        pb.Command(timeout_s=10, verify=verify_msg()),
        # the verdict must be applied before this verify: it starts where the verdict left slot 0
        pb.Command(timeout_s=10, verify=verify_msg(batch_id=2, start_pos=[5]), before=[commit, release]),
        pb.Command(timeout_s=10, commit=pb.Verdict(batch_id=2, words=[1]), before=[bad_rider, nested]),
        # a refused verify still answers its rider first (slot 0 holds 6 tokens now)
        pb.Command(timeout_s=10, verify=verify_msg(batch_id=3, start_pos=[2]),
                   before=[pb.Command(timeout_s=10, release=pb.ReleaseRequest(slots=[3]))]),
    ]
    replies = list(stub.Session(iter(commands), timeout=30))
    assert [r.WhichOneof("reply") for r in replies] == ["prefill", "verify", "done", "done", "verify", None, None, "done",
                                                          "done", None]
    assert len(replies[4].verify.picks) == 2 and replies[4].verify.batch_id == 2
    assert replies[5].code == INVALID and replies[5].details.startswith("batch_id")
    assert replies[6].code == INVALID and "rider" in replies[6].details
    assert replies[9].code == INVALID and replies[9].details.startswith("start_pos")
    health = stub.Health(pb.Empty(), timeout=10)
    assert health.last_verdict_batch_id == 2 and health.pending_batch_id == 0 and not health.busy


@pytest.mark.timeout(120)
def test_the_group_sends_a_verdict_with_the_next_verify_in_one_message(group, monkeypatch):
    group.prefill([prefill_item(0, [1, 2, 3]), prefill_item(1, [4, 5, 6])])
    group.verify(batch())
    session = group._sessions[0]
    sent = []
    send = session.send
    monkeypatch.setattr(session, "send", lambda cmd, timeout, *, riders=0: sent.append(
        (cmd.WhichOneof("command"), [r.WhichOneof("command") for r in cmd.before], riders)) or send(cmd, timeout, riders=riders))
    group.commit(Verdict(1, [2, 1]))
    group.release([1])
    assert sent == [], "nothing goes out until a command does"
    res = group.verify(batch(batch_id=2, n=1, slots=[0], start_pos=[5], tokens=[5] * 3, sampling=batch().sampling[:1]))
    assert len(res.picks) == 3
    assert sent == [("verify", ["commit", "release"], 2)]
    assert not group.owes_acknowledgements() and group.healthy()
    group.commit(Verdict(2, [1]))
    assert group.settle() == [] and sent[-1] == ("commit", [], 0), "with no command to ride on, settle sends it alone"
