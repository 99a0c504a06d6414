"""Sequence: all the bookkeeping of one request, with the rest derived as properties."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from tandem.adaptive import SpecControl
from tandem.detokenizer import Detokenizer, IncrementalText, find_stop
from tandem.sampling_params import SamplingParams
from tandem.shard.commands import LogitRules, SamplingSpec


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass
class SpecStats:
    num_drafts: int = 0  # verify rounds that had drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_length(self) -> float:
        """Mean tokens a drafted verify round yields: 1 + accepted / drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class Sequence:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # resolved: the request's seed, or one drawn for it
    eos_ids: frozenset[int]
    max_model_len: int
    arrival: float
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int | None = None
    cached_len: int = 0  # leading tokens of its next prefill that the prefix cache holds
    finish_reason: FinishReason | None = None
    error: str | None = None
    drafts: list[int] = field(default_factory=list)  # pending drafts, verified next
    forced: int = 0  # the drafts' last ones that the grammar forced (not the drafter's: see verify.forced)
    stats: SpecStats = field(default_factory=SpecStats)
    spec: SpecControl = field(default_factory=lambda: SpecControl(gamma=0))
    verify_failures: int = 0  # consecutive failed forwards of this sequence's batch
    first_token_time: float | None = None
    stop_cut: int | None = None  # where a stop string cuts the output text
    _stop_scan: int = 0  # where the next stop-string search starts
    _text: IncrementalText = field(default_factory=IncrementalText, compare=False, repr=False)
    # what a scheduler-side drafter keeps for this sequence (the n-gram drafter: a numpy buffer)
    drafter_state: object = field(default=None, compare=False, repr=False)
    # the llguidance matcher of a constrained sequence (tandem.grammar), at the end of its
    # output: it advances by emitted tokens only
    grammar: object = field(default=None, compare=False, repr=False)
    # params.logprobs: (logprob, top N as (id, logprob) pairs) of each output token
    output_logprobs: list[tuple[float, tuple]] | None = field(default=None, compare=False, repr=False)
    # params.prompt_logprobs: the same of each prompt token (None for the first), once its prefill scored it
    prompt_logprobs: list[tuple[float, tuple] | None] | None = field(default=None, compare=False, repr=False)
    built_logprobs: list = field(default_factory=list, compare=False, repr=False)  # tandem.due_outputs' TokenLogprobs

    def __post_init__(self) -> None:
        if self.params.logprobs is not None and self.output_logprobs is None:
            self.output_logprobs = []
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None] * len(self.prompt_ids)

    # ---- derived ------------------------------------------------------------------------

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def committed_ids(self) -> "JoinedIds":
        """The ids whose KV is committed (all_ids[:kv_len]), read a slice at a time, uncopied:
        the KV manager takes them every tick and reads only the blocks that just filled."""
        return JoinedIds(self.prompt_ids, self.output_ids, self.kv_len)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def kv_len(self) -> int:
        """Tokens whose KV is committed: all but the last, which is row 0 of the next verify."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def budget(self) -> int:
        """How many more tokens this sequence may emit (max_tokens and the context)."""
        by_tokens = self.params.max_tokens - len(self.output_ids)
        by_context = self.max_model_len - (len(self.prompt_ids) + len(self.output_ids))
        return max(0, min(by_tokens, by_context))

    def output_text(self, detok: Detokenizer, stable: bool = False, upto: int | None = None) -> str:
        """The text of the first `upto` output tokens (all by default); stable: without a
        trailing partial character (what a running sequence reports)."""
        out, ids = self._text, self.output_ids if upto is None else self.output_ids[:upto]
        text = out.stable(detok, ids) if stable else out.whole(detok, ids)
        return text[: self.stop_cut] if self.stop_cut is not None else text

    @functools.cached_property
    def prompt_key(self) -> tuple[int, ...]:
        """The prompt as a key: sequences of one prompt are twins (tandem.scheduler.twin_key)."""
        return tuple(self.prompt_ids)

    @property
    def scores_prompt(self) -> bool:
        """Whether its next prefill scores the prompt (the first, before any output)."""
        return self.prompt_logprobs is not None and not self.output_ids

    @property
    def sampling(self) -> SamplingSpec:
        p = self.params
        return SamplingSpec(temperature=float(p.temperature), top_p=float(p.top_p), top_k=int(p.top_k), seed=self.seed,
                            min_p=float(p.min_p), rules=self.logit_rules, logprobs=p.logprobs)

    @functools.cached_property
    def logit_rules(self) -> LogitRules | None:
        """What the rank applies to this sequence's logits; constant over its life."""
        p = self.params
        if not p.has_logit_rules:
            return None
        stops = () if p.ignore_eos else tuple(sorted(self.eos_ids))
        return LogitRules(
            prompt_len=len(self.prompt_ids), presence_penalty=float(p.presence_penalty),
            frequency_penalty=float(p.frequency_penalty), repetition_penalty=float(p.repetition_penalty),
            logit_bias=tuple((t, float(b)) for t, b in p.logit_bias), min_tokens=p.min_tokens,
            min_tokens_ids=tuple(sorted(set(stops) | set(p.stop_token_ids))),
        )

    # ---- transitions --------------------------------------------------------------------

    def emit(self, token: int, detok: Detokenizer | None, logprob: tuple[float, tuple] | None = None) -> None:
        """Append one token (with its logprob entry, when the request asked) and apply the
        stop conditions; nothing is emitted past them."""
        assert not self.finished, "emit after finish"
        self.output_ids.append(token)
        if self.output_logprobs is not None:
            self.output_logprobs.append(logprob if logprob is not None else (float("nan"), ()))
        p = self.params
        if self.grammar is not None and self._grammar_ends(token):
            return
        if not p.ignore_eos and token in self.eos_ids:
            self.finish(FinishReason.STOP)
        elif token in p.stop_token_ids:
            self.finish(FinishReason.STOP)
        elif p.stop and detok is not None and self._hit_stop_string(detok):
            self.finish(FinishReason.STOP)
        elif self.budget == 0:
            self.finish(FinishReason.LENGTH)

    def _grammar_ends(self, token: int) -> bool:
        """The grammar takes the token; a complete one (nothing more it allows) ends the output."""
        if not self.grammar.consume_token(token):
            self.finish(FinishReason.ERROR, error=f"the grammar refused token {token}: {self.grammar.get_error()}")
        elif self.grammar.is_stopped():
            self.finish(FinishReason.STOP)
        return self.finished

    def _hit_stop_string(self, detok: Detokenizer) -> bool:
        text = self._text.stable(detok, self.output_ids)
        cut = find_stop(text, self.params.stop, self._stop_scan)
        if cut is None:
            # a stop string may still end in a later token: rescan the overlap next time
            self._stop_scan = max(0, len(text) - max(len(s) for s in self.params.stop) + 1)
            return False
        self.stop_cut = cut
        return True

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        if self.finished:
            return
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.error = error
        self.drafts = []


def logprob_entry(rows, row: int, draft: bool = False) -> tuple[float, tuple]:
    """Row `row` of a RowLogprobs as a Sequence's logprob entry: the logprob of the row's pick
    (or, draft=True, of the draft it checked) and the row's top N."""
    return (rows.drafts[row] if draft else rows.chosen[row]), rows.top(row)


def record_prompt_logprobs(seq: Sequence, start: int, rows) -> None:
    """A scored prefill chunk from `start`: its rows give the logprobs of prompt tokens start + 1 on."""
    if rows is None:
        return
    for r in range(len(rows.chosen)):
        if start + 1 + r < len(seq.prompt_logprobs):
            seq.prompt_logprobs[start + 1 + r] = logprob_entry(rows, r)


class JoinedIds:
    """The first `length` ids of prompt + output, sliced without building the joined list."""

    __slots__ = ("prompt", "output", "length")

    def __init__(self, prompt: list[int], output: list[int], length: int):
        self.prompt, self.output, self.length = prompt, output, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> list[int]:
        start, stop, step = index.indices(self.length)
        assert step == 1, "a step slice of joined ids"
        p = len(self.prompt)
        if stop <= p:
            return self.prompt[start:stop]
        if start >= p:
            return self.output[start - p : stop - p]
        return self.prompt[start:] + self.output[: stop - p]
