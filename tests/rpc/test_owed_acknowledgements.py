"""Verdicts and releases go out on the session streams without waiting for their
acknowledgements: they ride on the next command to every rank, or go alone at settle();
the replies that follow, or settle(), read them. What that must keep: settle() names a batch whose verdict a rank never took, the command sent behind it
is reported as not run (its sequences were not in that batch), a refused release
leaves the group healthy."""
from __future__ import annotations

import pytest

from slot_blocks import prefill_item
from test_shard_server import batch
from tandem.errors import ShardError
from tandem.shard.commands import Verdict


@pytest.mark.timeout(120)
def test_a_verdict_is_sent_without_waiting_and_settled_before_its_effect_is_relied_on(group):
    group.prefill([prefill_item(0, [1, 2, 3]), prefill_item(1, [4, 5, 6])])
    group.verify(batch())
    group.commit(Verdict(1, [2, 1]))
    assert len(group._riders) == 1 and group.owes_acknowledgements(), "the verdict waits for a command to ride on"
    assert group.settle() == [] and group._owed == group._riders == [] and group.healthy()
    # the ranks applied it: the next verify starts where the verdict left each slot
    res = group.verify(batch(batch_id=2, start_pos=[5, 4]))
    assert len(res.picks) == 6


@pytest.mark.timeout(120)
def test_a_release_is_acknowledged_with_the_next_command_and_a_refused_one_harms_nothing(group):
    group.prefill([prefill_item(0, [1, 2, 3])])
    group.release([0])
    group.release([99])  # a slot no rank has: every rank refuses it, nothing changed anywhere
    assert len(group._riders) == 2
    assert group.prefill([prefill_item(0, [7, 8])]).next_tokens  # they ride on it; it reads both replies first
    assert group._owed == group._riders == [] and group.healthy()
    assert group.settle() == []


@pytest.mark.timeout(120)
def test_a_verdict_a_lost_rank_never_took_is_named_by_settle_and_the_next_command_did_not_run(group):
    group.prefill([prefill_item(0, [1, 2, 3]), prefill_item(1, [4, 5, 6])])
    group.verify(batch())
    group.launcher.servers[0].stop(grace=None)  # the rank dies after its forward
    group.commit(Verdict(1, [2, 1]))  # returns: the acknowledgement is owed
    with pytest.raises(ShardError) as info:
        group.verify(batch(batch_id=2, start_pos=[5, 4]))
    assert not info.value.state_advanced and info.value.unhealthy
    assert "lost before it" in str(info.value) and "verdict of batch 1 not acknowledged" in str(info.value)
    assert group.settle() == [1] and not group.healthy()
    group.restart()
    assert group.healthy() and group.prefill([prefill_item(0, [1, 2])]).next_tokens
