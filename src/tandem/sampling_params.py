"""SamplingParams: what a request asks of generation, checked when built."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.errors import InvalidRequestError
from tandem.grammar.constraint import GrammarConstraint

INT32_MAX = 2**31 - 1  # top_k and token ids travel to the shard ranks as int32
MAX_LOGPROBS = 20  # the most top logprobs a token may carry (tandem.sampling.logprobs)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # max_tokens is a default the client did not ask for: a prompt too long for it to fit
    # the context generates what the context leaves (finish_reason "length") instead of a 400
    max_tokens_is_default: bool = False
    # penalties and biases (vLLM's definitions: tandem.sampling.logit_processors)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]); a dict is taken too
    min_tokens: int = 0
    min_p: float = 0.0
    # the output must match this grammar (tandem.grammar); compiled at intake
    structured: GrammarConstraint | None = None
    # the target's raw log-probability of every output token, with its row's top N
    # (0..20); None = none. prompt_logprobs: the same for the prompt's tokens (the first has none)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # Normalise list inputs so the params stay hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            pairs = [(_bias_id(t), b) for t, b in bias]
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", "must map token ids to biases") from None
        object.__setattr__(self, "logit_bias", tuple(sorted(pairs)))
        self._check()

    def _check(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError("max_tokens", f"must be an integer, got {self.max_tokens!r}")
        if self.max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be > 0, got {self.max_tokens}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature):
            raise InvalidRequestError("temperature", f"must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k <= INT32_MAX:
            raise InvalidRequestError("top_k", f"must be an integer in [0, {INT32_MAX}] (0 = off), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequestError("seed", f"must be an integer, got {self.seed!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError("stop", f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT32_MAX:
                raise InvalidRequestError("stop_token_ids", f"must be token ids in [0, {INT32_MAX}], got {t!r}")
        self._check_rules()
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LOGPROBS):
                raise InvalidRequestError(name, f"must be an integer in [0, {MAX_LOGPROBS}] or None, got {v!r}")
        if self.structured is not None and not isinstance(self.structured, GrammarConstraint):
            raise InvalidRequestError("structured", f"expected a GrammarConstraint, got {type(self.structured).__name__}")

    def _check_rules(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise InvalidRequestError(name, f"must be a number in [-2, 2], got {v!r}")
        rp = self.repetition_penalty
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not (0.0 < rp and math.isfinite(rp)):
            raise InvalidRequestError("repetition_penalty", f"must be a finite number > 0, got {rp!r}")
        for t, b in self.logit_bias:
            if not 0 <= t <= INT32_MAX:
                raise InvalidRequestError("logit_bias", f"token ids must be in [0, {INT32_MAX}], got {t}")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100.0 <= b <= 100.0:
                raise InvalidRequestError("logit_bias", f"biases must be numbers in [-100, 100], got {b!r} for token {t}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= INT32_MAX:
            raise InvalidRequestError("min_tokens", f"must be an integer in [0, {INT32_MAX}], got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError("min_tokens", f"{self.min_tokens} is over max_tokens {self.max_tokens}")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p", f"must be a number in [0, 1], got {self.min_p!r}")

    @property
    def has_logit_rules(self) -> bool:
        """Whether the rank must process this request's logits (tandem.sampling.logit_processors)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _bias_id(t) -> int:
    """A logit_bias key: an int, or a string of one (JSON object keys are strings)."""
    if isinstance(t, str) and t.strip().lstrip("-").isdigit():
        return int(t)
    if isinstance(t, bool) or not isinstance(t, int):
        raise InvalidRequestError("logit_bias", f"keys must be token ids, got {t!r}")
    return t
