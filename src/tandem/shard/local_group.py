"""LocalShardGroup: the target as one in-process rank (the seed's single-rank path).

One rank sends nothing over any wire. A forward that raises has advanced no state
(the ModelShard sets nothing before its forward returns), so the error says so and
the engine puts the drafts back and verifies them again next tick.

On a GPU, where a forward is queued and runs while the host goes on, a committed verdict
is acknowledged from inside the next command, as a remote rank's is: once its forward is
queued, the listener (the engine's OutputRelease) builds and sends the outputs the last
tick held while the GPU runs, instead of between that tick's reply and this command.
"""
from __future__ import annotations

import logging

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

log = logging.getLogger("tandem.shard")


class LocalShardGroup:
    def __init__(self, shard: ModelShard):
        self.shard = shard
        self.limits = shard.limits
        self._on_acknowledged = None  # see ShardGroup.listen_for_acknowledgements
        self._owed = False  # a verdict committed on a GPU, acknowledged inside the next command

    def listen_for_acknowledgements(self, listener) -> None:
        self._on_acknowledged = listener

    def prefill(self, items: list[PrefillItem]) -> PrefillResult:
        self._acknowledge()  # a prefill reads its picks back at once: nothing to overlap
        try:
            return self.shard.prefill(items)
        except ShapeError:
            raise
        except Exception as e:  # noqa: BLE001 - any forward failure becomes a ShardError with its cause
            raise ShardError(f"prefill failed: {type(e).__name__}: {e}", state_advanced=True) from e

    def verify(self, cmd: VerifyBatch) -> VerifyResult:
        self.shard.rules.check(cmd)  # a ShapeError as it is, before anything runs
        try:
            result = self.shard.verify_begin(cmd, checked=True)
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from e
        self._acknowledge()  # while the queued forward runs
        try:
            return result()
        except Exception as e:  # noqa: BLE001
            raise self._failed(e) from e

    def _failed(self, e: Exception) -> ShardError:
        self.shard.pending = None
        return ShardError(f"verify forward failed: {type(e).__name__}: {e}", state_advanced=False)

    def commit(self, verdict: Verdict) -> None:
        self.shard.commit(verdict)
        # done when it returns; on a GPU its acknowledgement waits for the next forward to overlap
        self._owed = self._on_acknowledged is not None and self.shard.forward_is_async

    def owes_acknowledgements(self) -> bool:
        return self._owed

    def settle(self) -> list[int]:
        self._owed = False
        return []

    def _acknowledge(self) -> None:
        if self._owed:
            self._owed = False
            try:
                self._on_acknowledged()
            except Exception:  # noqa: BLE001 - the queued forward still has its picks to read
                log.exception("the acknowledgement listener failed")

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
