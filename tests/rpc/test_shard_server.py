"""A shard server refuses a malformed message (a bad block table too) with INVALID_ARGUMENT,
changes nothing, and keeps serving; a prefill over a prefix its blocks already hold gives what
a full prefill gives; the group checks a verify batch's shape before sending anything."""
from __future__ import annotations

import os
import time

import grpc
import pytest
import torch

from slot_blocks import blocks, pool_blocks, prefill_item
from tandem.errors import ShapeError, ShardError
from tandem.rpc import codec
from tandem.rpc.generated import shard_pb2 as pb
from tandem.shard.commands import GREEDY, SamplingSpec, Verdict, VerifyBatch
from tandem.shard.factory import ShardSpec

SLOTS, BUDGET, CONTEXT = 4, 12, 32  # the `group` fixture's too (conftest: GROUP_SLOTS, GROUP_BUDGET)


def init(stub, model_dir: str, drafter: str = "none"):
    spec = ShardSpec(model=model_dir, num_slots=SLOTS, max_model_len=CONTEXT, row_budget=BUDGET, drafter=drafter)
    return stub.Init(pb.InitRequest(spec=codec.encode_spec(spec), rank=0, world_size=1), timeout=60)


def prefill_msg(slot: int, tokens: list[int], table: list[int] | None = None, cached_len: int = 0,
                sampling: SamplingSpec = GREEDY) -> pb.PrefillItem:
    """One prefill item on the wire; its table is the slot's own (tests/slot_blocks.py) unless given."""
    table = blocks(slot, len(tokens)) if table is None else table
    return pb.PrefillItem(slot=slot, tokens=tokens, blocks=table, cached_len=cached_len, sampling=codec.encode_sampling(sampling))


def verify_msg(tables: list[list[int]] | None = None, **over) -> pb.VerifyBatch:
    """A verify of slot 0 at position 3 (k=2) on the wire, its table [0] unless given."""
    fields = dict(batch_id=1, n=1, k=2, slots=[0], start_pos=[3], tokens=[5, 6], sampling=[pb.SamplingSpec()])
    fields.update(over)
    tables = [[0]] if tables is None else tables
    return pb.VerifyBatch(**fields, blocks=[b for t in tables for b in t], block_counts=[len(t) for t in tables])


def refused(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    return info.value


MALFORMED = {
    "prefill with empty tokens": ("Prefill", pb.PrefillRequest(items=[prefill_msg(1, [], [32])]), "tokens non-empty"),
    "prefill of an unknown slot": ("Prefill", pb.PrefillRequest(items=[prefill_msg(SLOTS, [1], [32])]), "slots in range"),
    "prefill of a negative slot": ("Prefill", pb.PrefillRequest(items=[prefill_msg(-1, [1], [32])]), "slots in range"),
    "prefill of a token outside the vocab": ("Prefill", pb.PrefillRequest(items=[prefill_msg(1, [128])]), "token ids"),
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
    first = stub.Prefill(pb.PrefillRequest(items=[prefill_msg(0, [1, 2, 3])]), timeout=10)
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


# slot 0 holds 14 tokens in block 0, slot 1 20 in blocks 32, 33; a verify of both with k=3 writes
# positions 14..16 of slot 0 (blocks 0 and 1) and 20..22 of slot 1 (block 33 only)
HELD = {0: list(range(1, 15)), 1: list(range(30, 50))}
BOTH_AT = dict(n=2, k=3, slots=[0, 1], start_pos=[14, 20])
BOTH_TABLES = [[0, 1], [32, 33]]


def bad_tables(num_blocks: int) -> dict:
    """name -> (method, message, the rule it breaks), each with one block table wrong."""

    def both(tables):
        return verify_msg(tables, **BOTH_AT, tokens=[5] * 6, sampling=[pb.SamplingSpec()] * 2)

    def prefill(*items):
        return pb.PrefillRequest(items=list(items))

    return {
        "verify table too short for start_pos + k": ("Verify", both([[0], [32, 33]]), "block table length"),
        "verify table longer than max_model_len": ("Verify", both([[0, 1, 2], [32, 33]]), "block table length"),
        "verify block id past the pool": ("Verify", both([[0, num_blocks], [32, 33]]), "block ids"),
        "verify negative block id": ("Verify", both([[0, -1], [32, 33]]), "block ids"),
        "verify block named twice": ("Verify", both([[0, 0], [32, 33]]), "block ids distinct"),
        "verify reading a block another sequence writes": ("Verify", both([[0, 1], [1, 33]]), "blocks written"),
        "verify writing a block another sequence writes": ("Verify", both([[0, 1], [32, 1]]), "blocks written"),
        "verify with fewer tables than sequences": ("Verify", both([[0, 1]]), "len(block_tables)==n"),
        "prefill table too short for its tokens": ("Prefill", prefill(prefill_msg(2, list(range(20)), [64])), "block table length"),
        "prefill block id past the pool": ("Prefill", prefill(prefill_msg(2, [1, 2], [num_blocks])), "block ids"),
        "prefill block named twice": ("Prefill", prefill(prefill_msg(2, list(range(20)), [64, 64])), "block ids distinct"),
        "prefill whose cached_len is all its tokens": ("Prefill", prefill(prefill_msg(2, list(range(16)), [0], 16)), "cached_len"),
        "prefill whose cached_len is past its tokens": ("Prefill", prefill(prefill_msg(2, [1, 2], [64], 3)), "cached_len"),
        "prefill with a negative cached_len": ("Prefill", prefill(prefill_msg(2, [1, 2], [64], -1)), "cached_len"),
        "prefill writing a block another item writes": ("Prefill", prefill(prefill_msg(2, [1, 2], [64]), prefill_msg(3, [3], [64])),
                                                        "blocks written"),
        # slot 3 reads block 64 as a cached prefix while slot 2's new rows go into it
        "prefill reading a block another item writes": ("Prefill", prefill(prefill_msg(2, [1, 2], [64]),
                                                                           prefill_msg(3, list(range(1, 19)), [64, 96], 16)),
                                                        "blocks written"),
    }


def hold_two_slots(stub) -> list[int]:
    """Prefill HELD on a rank; the pick after each prompt."""
    res = stub.Prefill(pb.PrefillRequest(items=[prefill_msg(s, t, table) for (s, t), table in zip(HELD.items(), BOTH_TABLES)]),
                       timeout=30)
    return list(res.next_tokens)


def verify_both(stub, last: list[int], batch_id: int = 1):
    """A well-formed verify of both held slots: each slot's pick, then two drafts."""
    tokens = [last[0], 7, 8, last[1], 9, 10]
    return stub.Verify(verify_msg(BOTH_TABLES, batch_id=batch_id, **BOTH_AT, tokens=tokens,
                                  sampling=[pb.SamplingSpec()] * 2), timeout=30)


@pytest.mark.timeout(180)
def test_a_shard_refuses_a_malformed_block_table_naming_the_rule_then_serves_as_a_fresh_rank(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    limits = init(stub, tiny_model_dir).limits
    assert limits.block_size == 16 and limits.num_blocks > pool_blocks(SLOTS), "the default KV budget holds every test slot's"
    last = hold_two_slots(stub)
    for name, (method, msg, rule) in bad_tables(limits.num_blocks).items():
        err = refused(getattr(stub, method), msg)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {err.code()} {err.details()}"
        assert err.details().startswith(rule), f"{name}: {err.details()!r} should name the rule {rule!r}"
    health = stub.Health(pb.Empty(), timeout=10)
    assert health.ready and health.pending_batch_id == 0, "a refused verify leaves nothing pending"
    # nothing changed: the slots still hold what they held, so the same verify gives the same
    # picks as on a rank that never saw a malformed command (slots 2, 3 took no rows either)
    got = verify_both(stub, last)
    stub.Commit(pb.Verdict(batch_id=1, words=[3, 3]), timeout=10)
    assert stub.Prefill(pb.PrefillRequest(items=[prefill_msg(2, [4, 5]), prefill_msg(3, [6])]), timeout=10).next_tokens
    fresh, _ = shard_server()
    init(fresh, tiny_model_dir)
    assert hold_two_slots(fresh) == last
    want = verify_both(fresh, last)
    assert list(got.picks) == list(want.picks) and list(got.accept_probs) == list(want.accept_probs)
    assert len(got.picks) == 6


PREFIX = list(range(40, 56))  # one full block


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tail", [4, BUDGET + 2], ids=["tail-in-one-forward", "tail-in-chunks-of-the-row-budget"])
def test_a_prefill_that_reuses_a_cached_prefix_gives_what_a_full_prefill_gives(shard_server, tiny_model_dir, tail):
    """Slot 1 prefills PREFIX + tail with cached_len 16 over block 0, which slot 0's prefill of
    the same tokens wrote: its next token, and a verify's picks and probabilities after it, are
    those of slot 1 prefilling every token itself on a fresh rank."""
    tokens = PREFIX + list(range(60, 60 + tail))
    sampled = SamplingSpec(temperature=1.0, seed=11)

    def verify_slot(stub, slot, table, last, sampling, batch_id):
        """A verify of the pick and one draft, then a failed verdict: the slot stays where it was."""
        msg = verify_msg([table], batch_id=batch_id, slots=[slot], start_pos=[len(tokens)], k=2, tokens=[last, 3],
                         sampling=[codec.encode_sampling(sampling)])
        res = stub.Verify(msg, timeout=30)
        stub.Commit(pb.Verdict(batch_id=batch_id, words=[0]), timeout=10)
        return res

    full, _ = shard_server()
    init(full, tiny_model_dir)
    want = full.Prefill(pb.PrefillRequest(items=[prefill_msg(1, tokens, [32, 33], sampling=sampled)]), timeout=30).next_tokens
    want_greedy = verify_slot(full, 1, [32, 33], want[0], GREEDY, 1)
    want_sampled = verify_slot(full, 1, [32, 33], want[0], sampled, 2)

    cached, _ = shard_server()
    init(cached, tiny_model_dir)
    cached.Prefill(pb.PrefillRequest(items=[prefill_msg(0, tokens, [0, 1])]), timeout=30)
    got = cached.Prefill(pb.PrefillRequest(items=[prefill_msg(1, tokens, [0, 33], cached_len=16, sampling=sampled)]),
                         timeout=30).next_tokens
    assert list(got) == list(want)
    got_greedy = verify_slot(cached, 1, [0, 33], got[0], GREEDY, 1)
    got_sampled = verify_slot(cached, 1, [0, 33], got[0], sampled, 2)
    assert list(got_greedy.picks) == list(want_greedy.picks)
    assert list(got_sampled.picks) == list(want_sampled.picks)
    assert got_sampled.accept_probs[0] == pytest.approx(want_sampled.accept_probs[0], rel=1e-5)
    # the prefix is read from block 0, not recomputed: over a block that holds no prefix (never
    # written: zeros) the same prefill sees another history
    cached.Prefill(pb.PrefillRequest(items=[prefill_msg(2, tokens, [64, 65], cached_len=16)]), timeout=30)
    other = verify_slot(cached, 2, [64, 65], got[0], sampled, 3)
    assert other.accept_probs[0] != pytest.approx(want_sampled.accept_probs[0], rel=1e-3)


@pytest.mark.timeout(120)
def test_a_session_stream_answers_each_command_in_order_and_a_refused_one_does_not_end_it(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    commands = [
        pb.Command(timeout_s=10, prefill=pb.PrefillRequest(items=[prefill_msg(0, [1, 2, 3])])),
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
    fields.setdefault("block_tables", [blocks(s, p + fields["k"]) for s, p in zip(fields["slots"], fields["start_pos"])])
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
    ("len(block_tables)==n", batch(block_tables=[[0]])),
    ("block table length", batch(block_tables=[[], [32]])),
    ("block table length", batch(block_tables=[[0, 1, 2], [32]])),  # past max_model_len's 2 blocks
    ("block ids", batch(block_tables=[[-1], [32]])),
    ("block ids distinct", batch(start_pos=[3, 17], block_tables=[[0], [32, 32]])),
    ("blocks written", batch(block_tables=[[0], [0]])),  # both write block 0
]


@pytest.mark.timeout(120)
def test_the_group_checks_the_verify_shape_before_sending_anything_and_names_the_rule(group, monkeypatch):
    group.prefill([prefill_item(0, [1, 2, 3]), prefill_item(1, [4, 5, 6])])
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
    group.prefill([prefill_item(0, [1, 2, 3])])
    with pytest.raises(ShapeError, match="start_pos"):
        group.verify(batch(n=1, slots=[0], start_pos=[2], tokens=[5] * 3, sampling=[GREEDY]))
    with pytest.raises(ShapeError, match="tokens non-empty"):
        group.prefill([prefill_item(1, [])])
    assert group.healthy()
    res = group.verify(batch(n=1, slots=[0], start_pos=[3], tokens=[5] * 3, sampling=[GREEDY]))
    group.commit(Verdict(res.batch_id, [2]))


@pytest.mark.timeout(120)
def test_a_group_whose_rank_is_gone_fails_fast_and_says_it_needs_a_restart(group):
    group.prefill([prefill_item(0, [1, 2, 3])])
    group.launcher.servers[0].stop(grace=None)  # the rank is lost
    with pytest.raises(ShardError) as info:
        group.verify(batch(n=1, slots=[0], start_pos=[3], tokens=[5] * 3, sampling=[GREEDY]))
    assert info.value.state_advanced and info.value.unhealthy and "rank 0" in str(info.value)
    assert not group.healthy()
    with pytest.raises(ShardError, match="needs a restart"):
        group.release([0])
    group.restart()
    assert group.healthy() and group.prefill([prefill_item(0, [1, 2])]).next_tokens


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_rank_is_built_on_a_thread_that_takes_its_openmp_team_with_it():
    # A rank built on a gRPC pool thread left that thread's OpenMP team beside the forward
    # thread's; with more OpenMP threads than cores libgomp stopped spinning between
    # parallel regions (a 1-row CPU forward: 24.9 ms in the shard process, 16.0 in process).
    from tandem.rpc.server import on_a_thread_of_its_own

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(512, 512)
        want = (x @ x).sum().item()  # this thread's own team, if it had none yet
        before = _threads()
        assert on_a_thread_of_its_own(lambda: (x @ x).sum().item()) == want
        deadline = time.monotonic() + 30
        while _threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads() <= before, "the build thread's OpenMP workers outlived it"
        with pytest.raises(ValueError, match="bad spec"):
            on_a_thread_of_its_own(lambda: (_ for _ in ()).throw(ValueError("bad spec")))
    finally:
        torch.set_num_threads(threads)
