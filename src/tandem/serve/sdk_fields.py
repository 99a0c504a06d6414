"""Fields that OpenAI SDKs and agent frameworks send which change nothing of what is
generated: accepted (so such clients work) and ignored, as OpenAI itself treats them for
a model they do not apply to. Every other unknown field is a 400 naming it."""
from __future__ import annotations

from pydantic import BaseModel, Field


class IgnoredChatFields(BaseModel):
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored (stored completions' tags).")
    store: bool | None = Field(None, description="Accepted and ignored: nothing is stored.")
    service_tier: str | None = Field(None, description="Accepted and ignored: one tier.")
    prompt_cache_key: str | None = Field(None, description="Accepted and ignored: the prefix cache keys on tokens.")
    safety_identifier: str | None = Field(None, description="Accepted and ignored.")
