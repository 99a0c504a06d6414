"""A tick's outputs in two steps: what is due (decided at the tick's end, cheap), then the
RequestOutputs (the text decoded, the deltas cut).

Why two steps: decoding is most of building an output (at 64 sequences on an H200 host,
a third of the scheduler's own time a tick). When the tick's outputs are held until the
ranks acknowledge its verdicts (Engine.emit with a remote shard group), they are built
once the next tick's first command is on its way, while the ranks run it, instead of
between the verify's reply and that command.

A DueOutput keeps everything that may change after its tick (the token count, the
finish, the counters); the text is decoded from the sequence's first `tokens` ids. Its
sequence gets no new tokens before it is built (the build comes before the next verify's
reply is read); were it built later, those ids would be decoded whole (IncrementalText).
"""
from __future__ import annotations

from dataclasses import dataclass

from tandem.detokenizer import Detokenizer
from tandem.outputs import RequestOutput, TokenLogprob, Usage
from tandem.sequence import Sequence


@dataclass(frozen=True)
class DueOutput:
    seq: Sequence
    tokens: int  # output tokens so far
    prev_tokens: int  # ... and those already handed out
    prev_text: str  # the text already handed out
    finished: bool
    finish_reason: str | None
    error: str | None
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @classmethod
    def of(cls, seq: Sequence, prev_tokens: int, prev_text: str) -> DueOutput:
        st = seq.stats
        return cls(seq, len(seq.output_ids), prev_tokens, prev_text, seq.finished,
                   seq.finish_reason.value if seq.finish_reason else None, seq.error,
                   st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens)


def build_output(due: DueOutput, detok: Detokenizer) -> RequestOutput:
    """The RequestOutput of a due output: the text of its tokens, a stop string's possible
    beginning held back from a running sequence (the next tokens tell)."""
    seq = due.seq
    text = seq.output_text(detok, stable=not due.finished, upto=due.tokens)
    if seq.params.stop and not due.finished:
        text = text[: len(text) - stop_prefix_len(text, seq.params.stop)]
    ids = seq.output_ids[: due.tokens]
    return RequestOutput(
        request_id=seq.request_id,
        prompt=seq.prompt,
        prompt_token_ids=seq.prompt_ids,
        text=text,
        token_ids=ids,
        delta_text=text[len(due.prev_text):],  # the text only grows (stop prefixes are held back)
        delta_token_ids=ids[due.prev_tokens:],
        finished=due.finished,
        finish_reason=due.finish_reason,
        error=due.error,
        usage=Usage(prompt_tokens=len(seq.prompt_ids), completion_tokens=due.tokens),
        num_drafts=due.num_drafts,
        num_draft_tokens=due.num_draft_tokens,
        num_accepted_tokens=due.num_accepted_tokens,
        **_logprobs(seq, due, detok),
    )


def _logprobs(seq: Sequence, due: DueOutput, detok: Detokenizer) -> dict:
    """The output's logprob fields, where the request asked for them."""
    out = {}
    if seq.output_logprobs is not None:
        built = seq.built_logprobs  # each entry is built once, not once a tick
        built += [token_logprob(t, e, detok) for t, e in zip(seq.output_ids[len(built) : due.tokens],
                                                             seq.output_logprobs[len(built) : due.tokens])]
        whole = built[: due.tokens]
        out["logprobs"], out["delta_logprobs"] = whole, whole[due.prev_tokens :]
    if seq.prompt_logprobs is not None and (due.prev_tokens == 0 or due.finished):
        out["prompt_logprobs"] = [None if e is None else token_logprob(t, e, detok)
                                  for t, e in zip(seq.prompt_ids, seq.prompt_logprobs)]
    return out


def token_logprob(token: int, entry: tuple[float, tuple], detok: Detokenizer) -> TokenLogprob:
    logprob, top = entry
    return TokenLogprob(token, detok.token_text(token), logprob, tuple((t, detok.token_text(t), v) for t, v in top))


def stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of text could begin a stop string: they are held
    back from a stream until the next tokens show whether the stop string follows."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
