"""Output tracking: what each request has been handed out so far, so that every tick's
output carries only what is new (its deltas), and a finished request leaves the registry."""
from __future__ import annotations

from tandem.clock import Clock
from tandem.detokenizer import Detokenizer
from tandem.due_outputs import DueOutput, build_output
from tandem.intake import RequestIntake
from tandem.metrics import EngineMetrics
from tandem.outputs import RequestOutput
from tandem.sequence import FinishReason


class OutputTracker:
    def __init__(self, intake: RequestIntake, detok: Detokenizer, metrics: EngineMetrics, clock: Clock):
        self.intake = intake
        self.detok = detok
        self.metrics = metrics
        self.clock = clock
        self._reported: dict[str, tuple[int, str]] = {}  # request id -> (tokens, text) already handed out

    def due(self) -> list[DueOutput]:
        """The outputs owed now (built later by build): each request with new tokens, and
        each finished one, which leaves the registry."""
        dues = []
        for rid, seq in self.intake.live():
            prev_tokens, prev_text = self._reported.get(rid, (0, ""))
            if len(seq.output_ids) != prev_tokens or seq.finished:
                dues.append(DueOutput.of(seq, prev_tokens, prev_text))
                self._reported[rid] = (len(seq.output_ids), prev_text)  # the text once built
            if seq.finished:
                self.metrics.requests_finished.labels(finished_reason=seq.finish_reason.value).inc()
                if seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
                    self.metrics.record_finished(seq.arrival, seq.first_token_time, len(seq.output_ids), self.clock.now())
                self.intake.forget(rid)
                self._reported.pop(rid, None)
        return dues

    def build(self, dues: list[DueOutput]) -> list[RequestOutput]:
        outs = [build_output(d, self.detok) for d in dues]
        for d, out in zip(dues, outs):
            if self._reported.get(d.request_id, (None,))[0] == d.tokens:
                self._reported[d.request_id] = (d.tokens, out.text)
        return outs
