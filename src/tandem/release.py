"""OutputRelease: the one owner of releasing a tick's outputs.

No output leaves before every rank has acknowledged the verdicts it depends on. A group
that acknowledges at once (one in-process rank on a CPU) or a release without a sink
settles at the tick's end and hands the outputs back from step(). With a sink (the
scheduler actor) and a group whose acknowledgements come later (gRPC sessions; one
in-process rank on a GPU, see tandem.shard.local_group), the round trip stays off the
tick: the outputs are held, and go to the sink from inside the next tick as soon as the
group has read the acknowledgements, while that tick's first command runs on the ranks.
Held outputs are built (their text decoded) only then (see due_outputs).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from tandem.due_outputs import DueOutput
from tandem.outputs import RequestOutput
from tandem.sequence import FinishReason, Sequence

log = logging.getLogger("tandem.release")

Sink = Callable[[list[RequestOutput]], None]


class OutputRelease:
    def __init__(self, group, due: Callable[[], list[DueOutput]], build: Callable[[list[DueOutput]], list[RequestOutput]],
                 sink: Sink | None = None):
        self.group = group
        self.sink = sink  # None: every output comes back from step()
        self._due = due  # the outputs a tick owes (finished requests leave, their slots go)
        self._build = build
        # batch id -> its sequences, for the verdicts not yet acknowledged by every rank
        self._unsettled: dict[int, list[Sequence]] = {}
        self.held: list[DueOutput] | None = None  # the last tick's outputs, verdicts unacknowledged
        group.listen_for_acknowledgements(self._acknowledged)

    def committed(self, batch_id: int, batch: list[Sequence]) -> None:
        """A verdict went out; its batch's outputs wait for every rank's acknowledgement."""
        self._unsettled[batch_id] = batch

    def end_tick(self) -> list[RequestOutput]:
        """The tick's outputs: held for the sink when acknowledgements are owed, else
        settled and handed back (with any the last tick held)."""
        earlier = self.flush()
        if self.sink is not None and self.group.owes_acknowledgements():
            self.held = self._due()  # built and released by _acknowledged during the next tick
            return earlier
        self.settle()
        return earlier + self._build(self._due())

    def send_now(self) -> None:
        """The outputs due now straight to the sink (a prefill: every rank has replied)."""
        outs = self._build(self._due())
        if outs:
            try:
                self.sink(outs)
            except Exception:  # noqa: BLE001 - a consumer that failed loses its outputs, not the tick's verify
                log.exception("the output sink failed")

    def flush(self) -> list[RequestOutput]:
        """The held outputs that no acknowledgement released yet (no command went out since,
        or a rank was lost): settle now, then hand them back."""
        if self.held is None:
            return []
        self.settle()  # may release them through _acknowledged
        held, self.held = self.held or [], None
        return self._build(held)

    def settle(self) -> None:
        """Wait until every rank has acknowledged the verdicts sent so far. A batch whose
        verdict some rank did not take finishes with an error (a sequence that finished in
        that tick anyway keeps its tokens: none follow), and its held outputs are dropped."""
        lost = self.group.settle()
        failed = set()
        for batch_id in lost:
            for s in self._unsettled.get(batch_id, []):
                if not s.finished:
                    failed.add(s.request_id)
                s.finish(FinishReason.ERROR, error=f"verify verdict of batch {batch_id} not acknowledged by every rank")
        if self.held and failed:
            # built, never handed out: the final output's deltas start after them, so no
            # stream gets a token whose verdict a rank never took
            self._build([d for d in self.held if d.request_id in failed])
            self.held = [d for d in self.held if d.request_id not in failed]
        self._unsettled.clear()

    def _acknowledged(self) -> None:
        """The group's call once it has read every acknowledgement owed so far, all taken
        (from inside a later command, before that command's reply): the held outputs go."""
        self._unsettled.clear()
        held, self.held = self.held, None
        if held:
            self.sink(self._build(held))
