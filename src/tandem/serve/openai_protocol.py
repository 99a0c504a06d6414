"""The OpenAI request bodies tandem accepts, as strict pydantic models, and the
response / stream-chunk shapes it sends.

Strict: a number sent as a string, an unknown field or a missing one is a 400 naming
the field. Fields of the OpenAI API that tandem does not implement are accepted only
with their neutral value (suffix=null); fields SDKs send that change nothing
of the generation are accepted and ignored (tandem.serve.sdk_fields).
Extensions (as vLLM has them): top_k, ignore_eos, stop_token_ids, repetition_penalty,
min_tokens, min_p, structured_outputs.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Bounds of the numbers a request may carry: past them a number is a client's mistake (and
# would overflow the int32 / int64 fields it travels in to the shard ranks).
INT32_MAX = (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS = 1024  # entries of logit_bias (OpenAI allows 300)

from tandem.choices import MAX_CHOICES
from tandem.errors import InvalidRequestError
from tandem.outputs import RequestOutput
from tandem.sampling_params import MAX_LOGPROBS, SamplingParams
from tandem.serve.structured_fields import ResponseFormat, StructuredOutputs, constraint_of
from tandem.serve.sdk_fields import IgnoredChatFields
from tandem.serve.tool_fields import MessageToolCall, ToolFields, template_tool_calls


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = Field(False, description="Send a last chunk with the usage counts.")


class _Sampling(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str = Field(description="The served model's id, as GET /v1/models lists it.")
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="Most tokens to generate (at most the server's max_tokens_limit).")
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False, description="0 = greedy; default 1.")
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False, description="Nucleus sampling mass, in (0, 1].")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="Seed of the sampler, for reproducible sampling.")
    stop: str | list[str] | None = Field(None, description="Strings that end the generation (not included): up to the server's max_stop_strings (4), each non-empty and at most max_stop_chars (256) long.")
    stream: bool = Field(False, description="Send Server-Sent Events as tokens are produced.")
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES, description=(
        "Choices per prompt, admitted together; with a seed, choice j samples with seed + j."))
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False, description="Lowers the logit of every token already in the output by this much, in [-2, 2].")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False, description="Lowers a token's logit by this times its count in the output, in [-2, 2].")
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS, description="Token id (as a string) -> bias in [-100, 100] added to its logit.")
    user: str | None = None
    # extensions
    top_k: int = Field(0, ge=0, le=INT32_MAX, description="Sample from the k most likely tokens (0 = off).")
    ignore_eos: bool = Field(False, description="Keep generating past the end-of-sequence token.")
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] | None = Field(
        None, max_length=MAX_STOP_TOKEN_IDS, description="Token ids that end the generation.")
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False, description="vLLM's: a token in the prompt or output has a positive logit divided, a negative one multiplied by it (1 = off).")
    min_tokens: int = Field(0, ge=0, le=INT32_MAX, description="EOS and stop_token_ids cannot end the output before this many tokens.")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="Sample only tokens of at least min_p times the top token's probability (0 = off).")
    response_format: ResponseFormat | None = Field(None, description="json_object, or json_schema with a schema the output matches.")
    structured_outputs: StructuredOutputs | None = Field(None, description="One of json (schema), regex, choice, grammar.")

    def sampling_params(self, default_max_tokens: int, max_tokens_limit: int, *, max_stop_strings: int = 4,
                        max_stop_chars: int = 256) -> SamplingParams:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options", "only allowed with stream: true")
        max_tokens = given = self._max_tokens()
        if max_tokens is None:
            max_tokens = default_max_tokens
        if max_tokens > max_tokens_limit:
            raise InvalidRequestError("max_tokens", f"{max_tokens} is over this server's limit of {max_tokens_limit}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > max_stop_strings:
            raise InvalidRequestError("stop", f"at most {max_stop_strings} stop strings, got {len(stop)}")
        if any(len(s) > max_stop_chars for s in stop):
            raise InvalidRequestError("stop", f"a stop string is over this server's limit of {max_stop_chars} characters")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            max_tokens_is_default=given is None,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=tuple((_bias_key(t), b) for t, b in (self.logit_bias or {}).items()),
            min_tokens=self.min_tokens,
            min_p=self.min_p,
            structured=self._constraint(),
            **self._logprob_params(),
        )

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def _logprob_params(self) -> dict:
        return {}

    def _constraint(self):
        return constraint_of(self.response_format, self.structured_outputs)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _bias_key(key: str) -> int:
    if not (key.isascii() and key.isdigit()):
        raise InvalidRequestError("logit_bias", f"keys must be token ids, got {key!r}")
    return int(key)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(description=(
        "Text or token ids, or a list of prompts (texts or token-id lists): n choices of each, all admitted together."))
    echo: bool = Field(False, description="The choice's text (and logprobs) start with the prompt's.")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description=(
        "The log-probability of each output token (and, with echo, each prompt token) and the N most likely there."))
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES, description=(
        "Choices generated per prompt (>= n), the n of highest cumulative logprob returned; not with stream."))

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one or several."""
        p = self.prompt
        prompts = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
        if not p:
            raise InvalidRequestError("prompt", "must not be empty")
        if self.suffix:
            raise InvalidRequestError("suffix", "suffix is not supported")
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError("best_of", f"must be >= n ({self.n}), got {self.best_of}")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise InvalidRequestError("best_of", "best_of > n cannot be streamed: the best are known only at the end")
        return prompts

    def _logprob_params(self) -> dict:
        return {"logprobs": self.logprobs, "prompt_logprobs": self.logprobs if self.echo else None}


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = Field(None, description="An assistant's calls (then content may be null).")
    tool_call_id: str | None = Field(None, description="On a tool message: the call it answers.")

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls are an assistant's")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or ())

    def as_template_input(self) -> dict:
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text}
        if self.tool_calls:
            out["tool_calls"] = template_tool_calls(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(ToolFields, IgnoredChatFields, _Sampling):
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(None, description="Most tokens to generate (the newer name of max_tokens).")
    logprobs: bool = Field(False, description="The log-probability of each output token.")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="With logprobs: the N most likely tokens at each.")

    @model_validator(mode="after")
    def _one_max_tokens(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    def _logprob_params(self) -> dict:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs", "needs logprobs: true")
        return {"logprobs": (self.top_logprobs or 0) if self.logprobs else None}

    def _constraint(self):
        given = constraint_of(self.response_format, self.structured_outputs)
        forced = self.tool_call_constraint()
        if forced is not None and given is not None:
            raise InvalidRequestError("tool_choice", "a required or named tool call constrains the output already; "
                                      "give no response_format or structured_outputs with it")
        return forced or given

    def _max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict]:
        out = []
        for i, m in enumerate(self.messages):
            try:
                out.append(m.as_template_input())
            except InvalidRequestError as e:
                raise InvalidRequestError(f"messages[{i}].{e.field}", e.message) from None
        return out


# ---- responses --------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def finish_reason(out: RequestOutput) -> str | None:
    """OpenAI's finish_reason ("stop" | "length"); None while running."""
    if not out.finished:
        return None
    return "length" if out.finish_reason == "length" else "stop"


def usage(out: RequestOutput) -> dict:
    u = out.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens}


def completion_response(rid: str, model: str, out: RequestOutput) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": out.text, "logprobs": None, "finish_reason": finish_reason(out)}],
        "usage": usage(out),
    }


def completion_chunk(rid: str, model: str, created: int, text: str, reason: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }


def chat_response(rid: str, model: str, out: RequestOutput) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None, "finish_reason": finish_reason(out)}
        ],
        "usage": usage(out),
    }


def chat_chunk(rid: str, model: str, created: int, delta: dict, reason: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
    }


def usage_chunk(rid: str, model: str, created: int, obj: str, out: RequestOutput) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(out)}
