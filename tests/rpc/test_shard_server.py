"""A shard server refuses a malformed message with INVALID_ARGUMENT, changes nothing, and
keeps serving; the group checks a verify batch's shape before sending anything."""
from __future__ import annotations

import grpc
import pytest

from tandem.errors import ShapeError, ShardError
from tandem.rpc import codec
from tandem.rpc.generated import shard_pb2 as pb
from tandem.shard.commands import GREEDY, PrefillItem, Verdict, VerifyBatch
from tandem.shard.factory import ShardSpec

SLOTS, BUDGET = 4, 12  # the `group` fixture's too (conftest: GROUP_SLOTS, GROUP_BUDGET)


def init(stub, model_dir: str, drafter: str = "none"):
    spec = ShardSpec(model=model_dir, num_slots=SLOTS, max_seq_len=32, row_budget=BUDGET, drafter=drafter)
    return stub.Init(pb.InitRequest(spec=codec.encode_spec(spec), rank=0, world_size=1), timeout=60)


def verify_msg(**over) -> pb.VerifyBatch:
    fields = dict(batch_id=1, n=1, k=2, slots=[0], start_pos=[3], tokens=[5, 6], sampling=[pb.SamplingSpec()])
    fields.update(over)
    return pb.VerifyBatch(**fields)


def refused(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    return info.value


MALFORMED = {
    "prefill with empty tokens": ("Prefill", pb.PrefillRequest(items=[pb.PrefillItem(slot=1, tokens=[])]), "tokens non-empty"),
    "prefill of an unknown slot": ("Prefill", pb.PrefillRequest(items=[pb.PrefillItem(slot=SLOTS, tokens=[1])]), "slots in range"),
    "prefill of a negative slot": ("Prefill", pb.PrefillRequest(items=[pb.PrefillItem(slot=-1, tokens=[1])]), "slots in range"),
    "prefill of a token outside the vocab": ("Prefill", pb.PrefillRequest(items=[pb.PrefillItem(slot=1, tokens=[128])]), "token ids"),
    "verify with n*k != len(tokens)": ("Verify", verify_msg(tokens=[5]), "len(tokens)==n*k"),
    "verify with n = 0": ("Verify", verify_msg(n=0, slots=[], start_pos=[], tokens=[], sampling=[]), "n>=1"),
    "verify with k = 0": ("Verify", verify_msg(k=0, tokens=[]), "k>=1"),
    "verify over the row budget": ("Verify", verify_msg(k=BUDGET + 1, tokens=[5] * (BUDGET + 1)), "row_budget"),
    "verify of an unknown slot": ("Verify", verify_msg(slots=[SLOTS]), "slots in range"),
    "verify with missing slots": ("Verify", verify_msg(slots=[]), "len(slots)==n"),
    "verify at the wrong position": ("Verify", verify_msg(start_pos=[2]), "start_pos"),
    "verify of a token outside the vocab": ("Verify", verify_msg(tokens=[5, 1000]), "token ids"),
    "verdict with nothing pending": ("Commit", pb.Verdict(batch_id=77, words=[1]), "batch_id"),
    "release of an unknown slot": ("Release", pb.ReleaseRequest(slots=[SLOTS + 3]), "slots in range"),
    "propose without a rank-side drafter": ("Propose", pb.ProposeBatch(slots=[0], last_tokens=[1], positions=[3], num_drafts=[2],
                                                                        sampling=[pb.SamplingSpec()]), "drafter"),
}


@pytest.mark.timeout(120)
def test_a_shard_refuses_malformed_messages_with_invalid_argument_and_keeps_serving(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    first = stub.Prefill(pb.PrefillRequest(items=[pb.PrefillItem(slot=0, tokens=[1, 2, 3])]), timeout=10)
    for name, (method, msg, rule) in MALFORMED.items():
        err = refused(getattr(stub, method), msg)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {err.code()} {err.details()}"
        assert err.details().startswith(rule), f"{name}: {err.details()!r} should name the rule {rule!r}"
    # nothing changed: slot 0 still holds its 3 tokens, and a well-formed verify + verdict go through
    res = stub.Verify(verify_msg(tokens=[first.next_tokens[0], 6]), timeout=10)
    assert len(res.picks) == 2 and len(res.accept_probs) == 2
    stub.Commit(pb.Verdict(batch_id=1, words=[1]), timeout=10)
    health = stub.Health(pb.Empty(), timeout=10)
    assert health.ready and not health.busy and health.last_verdict_batch_id == 1 and not health.last_verdict_failed


@pytest.mark.timeout(120)
def test_a_session_stream_answers_each_command_in_order_and_a_refused_one_does_not_end_it(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    commands = [
        pb.Command(timeout_s=10, prefill=pb.PrefillRequest(items=[pb.PrefillItem(slot=0, tokens=[1, 2, 3])])),
        pb.Command(timeout_s=10, verify=verify_msg(tokens=[5])),  # refused: len(tokens) != n*k
        pb.Command(timeout_s=10, verify=verify_msg()),
        pb.Command(timeout_s=10, commit=pb.Verdict(batch_id=1, words=[2])),
        pb.Command(timeout_s=10, release=pb.ReleaseRequest(slots=[0])),
        pb.Command(timeout_s=10),  # no command at all
    ]
    replies = list(stub.Session(iter(commands), timeout=30))
    assert [r.WhichOneof("reply") for r in replies] == ["prefill", None, "verify", "done", "done", None]
    assert replies[1].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and replies[1].details.startswith("len(tokens)==n*k")
    assert replies[5].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert len(replies[2].verify.picks) == 2 and replies[0].prefill.next_tokens
    health = stub.Health(pb.Empty(), timeout=10)
    assert health.last_verdict_batch_id == 1 and health.pending_batch_id == 0


def test_a_shard_refuses_commands_before_init_and_faults_unless_enabled(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    assert not stub.Health(pb.Empty(), timeout=10).ready
    err = refused(stub.Verify, verify_msg())
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "before Init" in err.details()
    err = refused(stub.InjectFault, pb.FaultRequest(mode=pb.FaultRequest.RAISE))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = refused(stub.Init, pb.InitRequest(spec=codec.encode_spec(ShardSpec(model=tiny_model_dir)), rank=2, world_size=2))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    init(stub, tiny_model_dir)
    err = refused(stub.Init, pb.InitRequest(spec=codec.encode_spec(ShardSpec(model=tiny_model_dir)), rank=0, world_size=1))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "already" in err.details()


# ---- the group's shape validation -------------------------------------------------------

def batch(**over) -> VerifyBatch:
    fields = dict(batch_id=1, n=2, k=3, slots=[0, 1], start_pos=[3, 3], tokens=[5] * 6, sampling=[GREEDY] * 2)
    fields.update(over)
    return VerifyBatch(**fields)


SHAPE_TABLE = [
    ("n>=1", batch(n=0, slots=[], start_pos=[], tokens=[], sampling=[])),
    ("k>=1", batch(k=0, tokens=[])),
    ("row_budget", batch(k=7, tokens=[5] * 14)),
    ("len(tokens)==n*k", batch(tokens=[5] * 5)),
    ("len(tokens)==n*k", batch(tokens=[5] * 7)),
    ("len(slots)==n", batch(slots=[0])),
    ("len(start_pos)==len(sampling)==n", batch(start_pos=[3])),
    ("slots distinct", batch(slots=[1, 1])),
    ("slots in range", batch(slots=[0, SLOTS])),
    ("slots in range", batch(slots=[-1, 0])),
]


@pytest.mark.timeout(120)
def test_the_group_checks_the_verify_shape_before_sending_anything_and_names_the_rule(group, monkeypatch):
    group.prefill([PrefillItem(0, [1, 2, 3]), PrefillItem(1, [4, 5, 6])])
    sent = []
    fan_out = group._fan_out
    monkeypatch.setattr(group, "_fan_out", lambda method, *a, **kw: sent.append(method) or fan_out(method, *a, **kw))
    for rule, cmd in SHAPE_TABLE:
        with pytest.raises(ShapeError) as info:
            group.verify(cmd)
        assert info.value.rule == rule, f"{cmd}: {info.value}"
    assert sent == [], "a malformed verify batch must never reach a shard"
    assert group.healthy()
    assert len(group.verify(batch()).picks) == 6 and sent == ["Verify"]


@pytest.mark.timeout(120)
def test_a_command_every_rank_refuses_is_a_shape_error_and_the_group_stays_healthy(group):
    group.prefill([PrefillItem(0, [1, 2, 3])])
    with pytest.raises(ShapeError, match="start_pos"):
        group.verify(batch(n=1, slots=[0], start_pos=[2], tokens=[5] * 3, sampling=[GREEDY]))
    with pytest.raises(ShapeError, match="tokens non-empty"):
        group.prefill([PrefillItem(1, [])])
    assert group.healthy()
    res = group.verify(batch(n=1, slots=[0], start_pos=[3], tokens=[5] * 3, sampling=[GREEDY]))
    group.commit(Verdict(res.batch_id, [2]))


@pytest.mark.timeout(120)
def test_a_group_whose_rank_is_gone_fails_fast_and_says_it_needs_a_restart(group):
    group.prefill([PrefillItem(0, [1, 2, 3])])
    group.launcher.servers[0].stop(grace=None)  # the rank is lost
    with pytest.raises(ShardError) as info:
        group.verify(batch(n=1, slots=[0], start_pos=[3], tokens=[5] * 3, sampling=[GREEDY]))
    assert info.value.state_advanced and info.value.unhealthy and "rank 0" in str(info.value)
    assert not group.healthy()
    with pytest.raises(ShardError, match="needs a restart"):
        group.release([0])
    group.restart()
    assert group.healthy() and group.prefill([PrefillItem(0, [1, 2])]).next_tokens
