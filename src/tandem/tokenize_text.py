"""Tokenize and detokenize as a client asks (vLLM's /tokenize and /detokenize): the ids
tandem would generate from for a prompt or a conversation, and the text of ids."""
from __future__ import annotations

from tandem.chat_template import render_chat
from tandem.errors import InvalidRequestError

MAX_TOKENIZE_CHARS = 1 << 20  # a text longer than any context, sent only to load the tokenizer


def tokenize(tokenizer, *, prompt: str | None = None, messages: list[dict] | None = None,
             tools: list[dict] | None = None, add_generation_prompt: bool = True,
             add_special_tokens: bool = True) -> list[int]:
    """The token ids of `prompt`, or of `messages` (and `tools`) through the chat template,
    tokenized as the engine tokenizes a request's prompt (add_special_tokens=True)."""
    if (prompt is None) == (messages is None):
        raise InvalidRequestError("prompt", "give either a prompt or messages")
    text = prompt if messages is None else render_chat(tokenizer, messages, tools,
                                                       add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise InvalidRequestError("prompt", f"must be a string, got {type(text).__name__}")
    if len(text) > MAX_TOKENIZE_CHARS:
        raise InvalidRequestError("prompt", f"{len(text)} characters are over the limit of {MAX_TOKENIZE_CHARS}")
    return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


def detokenize(tokenizer, tokens: list[int], vocab_size: int) -> str:
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in tokens):
        raise InvalidRequestError("tokens", f"token ids must be integers in [0, {vocab_size})")
    return tokenizer.decode(tokens)
