"""Request intake: checks and tokenizes new requests and keeps them in an inbox that the
next tick empties into the scheduler. It owns the registry of live requests by id.

Only a short lock of its own, never the tick's: requests sent during a tick wait in the
inbox, and the next tick takes every waiting one at once (one prefill for a burst).
"""
from __future__ import annotations

import secrets
import threading
from collections import deque
from dataclasses import dataclass

from tandem.adaptive import AdaptiveSpec
from tandem.chat_template import render_chat
from tandem.clock import Clock
from tandem.errors import EngineUnavailableError, InvalidRequestError
from tandem.grammar.compiler import GrammarCompiler
from tandem.sampling_params import SamplingParams
from tandem.scheduler import Scheduler
from tandem.sequence import Sequence
from tandem.shard.commands import ShardLimits


@dataclass(frozen=True, slots=True)
class Request:
    """One request to start: a prompt (text or token ids) or chat messages."""

    prompt: str | list[int] | None
    params: SamplingParams | None = None
    request_id: str | None = None  # None: the engine names it
    messages: list[dict] | None = None  # rendered with the tokenizer's chat template
    tools: list[dict] | None = None  # OpenAI tool definitions, rendered with the messages

    def __reduce__(self):
        # bursts of them cross Ray and the scheduler actor's socket: pickled as their
        # fields, a third of the time of a frozen dataclass's default state
        return (Request, (self.prompt, self.params, self.request_id, self.messages, self.tools))


@dataclass(frozen=True, slots=True)
class Admission:
    """What became of one Request: its id once taken, or the error it was refused with."""

    request_id: str | None = None
    error: Exception | None = None

    def __reduce__(self):
        return (Admission, (self.request_id, self.error))  # as Request's

    @property
    def taken(self) -> bool:
        return self.error is None


class RequestIntake:
    def __init__(self, tokenizer, eos_ids: frozenset[int], limits: ShardLimits, adaptive: AdaptiveSpec, clock: Clock,
                 grammars: GrammarCompiler | None = None):
        self.tokenizer = tokenizer
        self.grammars = grammars or GrammarCompiler(tokenizer, limits.vocab_size, eos_ids)
        self.eos_ids = eos_ids
        self.limits = limits
        self.adaptive = adaptive
        self.clock = clock
        self.requests: dict[str, Sequence] = {}  # every live request, by id
        self.recovering = False  # while set, every request is refused
        self._lock = threading.Lock()  # guards `requests` and `_inbox`; held briefly
        self._inbox: deque[Sequence] = deque()  # added since the last tick began
        self._ids = 0

    def add(self, requests: list[Request]) -> list[Admission]:
        """Per request its Admission (one bad request harms none of the others). All that
        are taken land in the inbox together."""
        if self.recovering:
            return [Admission(error=EngineUnavailableError("the shard group is recovering; retry shortly")) for _ in requests]
        prompts = [self._prompt_of(r) for r in requests]
        # one tokenizer call for all text prompts: a third of the time of one call each
        # (a text that is no Unicode, such as a lone surrogate, would fail the whole call: it
        # is left out of it, and refused alone in _prompt_ids)
        texts = [p for p in prompts if _tokenizable(p)]
        encoded = iter(self.tokenizer(texts).input_ids if texts else [])
        prepared: list[tuple | Exception] = []
        for r, prompt in zip(requests, prompts):
            if isinstance(prompt, Exception):
                prepared.append(prompt)
                continue
            params = r.params or SamplingParams()
            try:
                ids = self._prompt_ids(prompt, next(encoded) if _tokenizable(prompt) else None)
                if not isinstance(params, SamplingParams):
                    raise InvalidRequestError("params", f"expected SamplingParams, got {type(params).__name__}")
                if any(t >= self.limits.vocab_size for t, _ in params.logit_bias):
                    raise InvalidRequestError("logit_bias", f"token ids must be in [0, {self.limits.vocab_size})")
                # compiled before admission: a bad grammar is this request's 400, nothing else's
                grammar = self.grammars.matcher(params.structured) if params.structured is not None else None
                prepared.append((prompt, ids, params, r.request_id, grammar))
            except InvalidRequestError as e:
                prepared.append(e)
        with self._lock:
            return [self._enqueue(item) for item in prepared]

    def _enqueue(self, item: tuple | Exception) -> Admission:
        if isinstance(item, Exception):
            return Admission(error=item)
        prompt, ids, params, request_id, grammar = item
        if request_id is None:
            self._ids += 1
            request_id = f"req-{self._ids}"
        elif request_id in self.requests:
            return Admission(error=InvalidRequestError("request_id", f"{request_id!r} is already running"))
        total = len(ids) + params.max_tokens
        if total > self.limits.max_model_len and not params.max_tokens_is_default:
            return Admission(error=InvalidRequestError(
                "max_tokens", f"the prompt's {len(ids)} tokens + max_tokens {params.max_tokens} = {total} exceed "
                f"max_model_len {self.limits.max_model_len}"))
        seq = Sequence(
            request_id=request_id,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else secrets.randbits(63),
            eos_ids=self.eos_ids,
            max_model_len=self.limits.max_model_len,
            arrival=self.clock.now(),
            grammar=grammar,
        )
        seq.spec = self.adaptive.new_state()
        self.requests[request_id] = seq
        self._inbox.append(seq)
        return Admission(request_id=request_id)

    def _prompt_of(self, r: Request):
        """The prompt, with chat messages rendered; or the error they failed with."""
        if r.messages is None:
            return InvalidRequestError("tools", "tools go with messages, not a prompt") if r.tools else r.prompt
        try:
            return self.chat_prompt(r.messages, r.tools)
        except Exception as e:  # noqa: BLE001 - that request's error alone
            return e

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None, *,
                    add_generation_prompt: bool = True) -> str:
        """Messages (and tools) rendered with the tokenizer's chat template, ready to generate from."""
        return render_chat(self.tokenizer, messages, tools, add_generation_prompt=add_generation_prompt)

    def _prompt_ids(self, prompt, encoded: list[int] | None = None) -> list[int]:
        """The prompt's token ids, checked; `encoded`: a text prompt's ids, tokenized already."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "must not be empty")
            if not _tokenizable(prompt):
                raise InvalidRequestError("prompt", "is not valid Unicode text (it holds a lone UTF-16 surrogate)")
            ids = encoded if encoded is not None else self.tokenizer(prompt).input_ids
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            vocab = self.limits.vocab_size
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise InvalidRequestError("prompt", f"token ids must be integers in [0, {vocab})")
        else:
            raise InvalidRequestError("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InvalidRequestError("prompt", "must not be empty")
        limit = self.limits.max_model_len
        if len(ids) >= limit:
            raise InvalidRequestError("prompt", f"{len(ids)} tokens do not fit the context of {limit} (max_model_len) with room to generate")
        return ids

    def drain_into(self, scheduler: Scheduler) -> None:
        """The tick's start: every request in the inbox goes to the scheduler's queue."""
        with self._lock:
            while self._inbox:
                scheduler.add(self._inbox.popleft())

    @property
    def pending(self) -> bool:
        return bool(self._inbox)

    def live(self) -> list[tuple[str, Sequence]]:
        with self._lock:
            return list(self.requests.items())

    def forget(self, request_id: str) -> None:
        with self._lock:
            del self.requests[request_id]


def _tokenizable(prompt) -> bool:
    """A non-empty text that encodes to UTF-8 (what the tokenizer takes)."""
    if not isinstance(prompt, str) or not prompt:
        return False
    if prompt.isascii():
        return True
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
