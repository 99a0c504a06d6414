"""The request fields of tools on chat (OpenAI's tools, tool_choice, parallel_tool_calls)
and of the messages a tool conversation carries (an assistant's tool_calls, a tool's
answer), checked, and what the chat template gets of them."""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.errors import InvalidRequestError
from tandem.serve.tool_choice import tool_call_constraint

MAX_TOOLS = 128  # OpenAI's own limit


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The function's name, as the model calls it.")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON schema of its arguments.")
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Strict):
    name: str
    arguments: str = Field(description="The arguments as JSON text.")


class MessageToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolFields(BaseModel):
    """Mixed into the chat request."""

    tools: list[ToolDef] | None = Field(None, max_length=MAX_TOOLS, description=(
        "Functions the model may call, rendered by the model's chat template (a template without tools is a 400)."))
    tool_choice: ToolChoice | None = Field(None, description=(
        '"auto" (the default with tools), "none" (tools not rendered, output not parsed), "required" (one call of '
        'one of the tools) or a named function (one call of it): the last two constrain the output to a call block '
        'whose arguments match the tool\'s parameters schema.'))
    parallel_tool_calls: bool = Field(True, description="false: at most the first tool call is returned.")

    def template_tools(self) -> list[dict] | None:
        """The tool definitions for the chat template, or None (none given, or tool_choice "none")."""
        if self.tool_choice is not None and not self.tools:
            raise InvalidRequestError("tool_choice", "only allowed when tools are given")
        if not self.tools or self.tool_choice == "none":
            return None
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in self.tools}:
            raise InvalidRequestError("tool_choice", f"names {choice.function.name!r}, which is not one of the tools")
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def tool_call_constraint(self):
        """tool_choice "required" / a named function: the grammar of the call block the
        output must be (tandem.serve.tool_choice); None otherwise."""
        if not self.tools or self.tool_choice in (None, "auto", "none"):
            return None
        choice = self.tool_choice if self.tool_choice == "required" else self.tool_choice.function.name
        return tool_call_constraint([t.model_dump(exclude_none=True) for t in self.tools], choice)


def template_tool_calls(calls: list[MessageToolCall]) -> list[dict]:
    """An assistant message's tool calls as chat templates read them: the arguments as an
    object (templates such as Qwen2.5's write them with tojson)."""
    out = []
    for i, c in enumerate(calls):
        try:
            args = json.loads(c.function.arguments)
        except ValueError:
            raise InvalidRequestError(f"tool_calls[{i}].function.arguments", "is not valid JSON") from None
        out.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
    return out
