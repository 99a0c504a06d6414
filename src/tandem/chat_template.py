"""Chat messages (and tool definitions) through the tokenizer's chat template."""
from __future__ import annotations

from tandem.errors import InvalidRequestError


def renders_tools(tokenizer) -> bool:
    """Whether the model's template lays tool definitions out (Qwen2.5's does, SmolLM2's
    does not: a template without them would drop the tools silently)."""
    return "tools" in (tokenizer.chat_template or "")


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, *,
                add_generation_prompt: bool = True) -> str:
    if not tokenizer.chat_template:
        raise InvalidRequestError("messages", "this model has no chat template")
    if tools and not renders_tools(tokenizer):
        raise InvalidRequestError("tools", "this model's chat template does not render tools")
    try:
        return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - a template's own refusal (raise_exception), or bad messages for it
        raise InvalidRequestError("messages", f"the chat template failed: {type(e).__name__}: {e}") from None
