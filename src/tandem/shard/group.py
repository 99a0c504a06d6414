"""ShardGroup: the one interface the engine drives the target through.

LocalShardGroup (one in-process rank) and GrpcShardGroup (N shard processes) both
implement it; the engine runs on either with no other change.
"""
from __future__ import annotations

from typing import Callable, Protocol

from tandem.shard.commands import (
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    ShardLimits,
    Verdict,
    VerifyBatch,
    VerifyResult,
)


class ShardGroup(Protocol):
    limits: ShardLimits

    def listen_for_acknowledgements(self, listener: Callable[[], None]) -> None:
        """Call `listener` (the engine's OutputRelease), on the calling thread, each time the
        group has read every acknowledgement owed so far and all were taken, while a later
        command waits for its reply (a group that acknowledges at once never calls it)."""
        ...

    def prefill(self, items: list[PrefillItem]) -> PrefillResult:
        """Run the target (and a rank-side drafter) over each item's tokens into its slot."""
        ...

    def verify(self, cmd: VerifyBatch) -> VerifyResult:
        """One forward of n*k rows on every rank. Raises ShardError on failure; a
        multi-rank group has then already sent the failed verdict to the ranks."""
        ...

    def commit(self, verdict: Verdict) -> None:
        """Send the verdict words to every rank. A group may return before every rank has
        acknowledged them; settle() then waits for that."""
        ...

    def owes_acknowledgements(self) -> bool:
        """Whether verdicts or releases went out whose acknowledgements are not read yet."""
        ...

    def settle(self) -> list[int]:
        """Wait until every rank has acknowledged the verdicts and releases sent so far;
        returns the batch ids whose verdict some rank did not take (the group is then
        unhealthy)."""
        ...

    def propose(self, cmd: ProposeBatch) -> ProposeResult:
        """Drafts from the rank-side drafter (draft model, DFlash)."""
        ...

    def release(self, slots: list[int]) -> None:
        ...

    def healthy(self) -> bool:
        ...

    def restart(self) -> None:
        """Bring an unhealthy group back (fresh ranks, empty KV)."""
        ...

    def close(self) -> None:
        ...
