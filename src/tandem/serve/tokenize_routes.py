"""POST /tokenize and /detokenize, as vLLM's server has them.

    /tokenize    {"prompt": text, "add_special_tokens": true}
                 or {"messages": [...], "add_generation_prompt": true, "tools": [...]}
                 -> {"tokens": [ids], "count": n, "max_model_len": m}
    /detokenize  {"tokens": [ids]} -> {"prompt": text}

"model" is optional (vLLM's); given, it must be the served one. The ids are those a
generation request of the same prompt or messages would run on.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from tandem.serve.openai_protocol import INT32_MAX, ChatMessage
from tandem.serve.tool_fields import ToolDef


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = Field(None, description="The served model's id (optional).")


class TokenizeCompletionRequest(_Strict):
    prompt: str = Field(description="The text to tokenize.")
    add_special_tokens: bool = Field(True, description="Add the tokenizer's special tokens (BOS), as generation does.")


class TokenizeChatRequest(_Strict):
    messages: list[ChatMessage] = Field(min_length=1, description="A conversation, through the chat template.")
    add_generation_prompt: bool = Field(True, description="End with the assistant turn's opening, as chat generation does.")
    add_special_tokens: bool = Field(True, description="Add the tokenizer's special tokens (BOS), as generation does.")
    tools: list[ToolDef] | None = Field(None, description="Tool definitions, rendered by the chat template.")


class DetokenizeRequest(_Strict):
    tokens: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] = Field(description="Token ids to turn into text.")


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize_model(raw: dict) -> type[BaseModel]:
    """The request's shape: a chat one when it has messages."""
    return TokenizeChatRequest if "messages" in raw else TokenizeCompletionRequest


def tokenize_call(req: BaseModel) -> tuple[str | None, dict]:
    """The backend's atokenize arguments: the prompt and its keyword options."""
    if isinstance(req, TokenizeChatRequest):
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        messages = [m.as_template_input() for m in req.messages]
        return None, {"messages": messages, "tools": tools, "add_generation_prompt": req.add_generation_prompt,
                      "add_special_tokens": req.add_special_tokens}
    return req.prompt, {"add_special_tokens": req.add_special_tokens}
