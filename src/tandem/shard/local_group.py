"""LocalShardGroup: the target as one in-process rank (the seed's single-rank path).

One rank sends nothing over any wire. A forward that raises has advanced no state
(the ModelShard sets nothing before its forward returns), so the error says so and
the engine puts the drafts back and verifies them again next tick.
"""
from __future__ import annotations

from tandem.errors import ShapeError, ShardError
from tandem.shard.commands import (
    PrefillItem,
    PrefillResult,
    ProposeBatch,
    ProposeResult,
    Verdict,
    VerifyBatch,
    VerifyResult,
)
from tandem.shard.model_shard import ModelShard


class LocalShardGroup:
    def __init__(self, shard: ModelShard):
        self.shard = shard
        self.limits = shard.limits

    def listen_for_acknowledgements(self, listener) -> None:
        pass  # never called: every command is done when it returns

    def prefill(self, items: list[PrefillItem]) -> PrefillResult:
        try:
            return self.shard.prefill(items)
        except ShapeError:
            raise
        except Exception as e:  # noqa: BLE001 - any forward failure becomes a ShardError with its cause
            raise ShardError(f"prefill failed: {type(e).__name__}: {e}", state_advanced=True) from e

    def verify(self, cmd: VerifyBatch) -> VerifyResult:
        self.shard.rules.check(cmd)
        try:
            return self.shard.verify(cmd)
        except Exception as e:  # noqa: BLE001
            self.shard.pending = None
            raise ShardError(f"verify forward failed: {type(e).__name__}: {e}", state_advanced=False) from e

    def commit(self, verdict: Verdict) -> None:
        self.shard.commit(verdict)

    def owes_acknowledgements(self) -> bool:
        return False  # an in-process commit is done when it returns

    def settle(self) -> list[int]:
        return []

    def propose(self, cmd: ProposeBatch) -> ProposeResult:
        return self.shard.propose(cmd)

    def release(self, slots: list[int]) -> None:
        self.shard.release(slots)

    def healthy(self) -> bool:
        return True

    def restart(self) -> None:
        pass  # an in-process rank cannot be lost

    def close(self) -> None:
        pass
