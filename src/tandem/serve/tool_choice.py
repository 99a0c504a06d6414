"""tool_choice "required" or a named function: the output is constrained (with the
structured-output masks, tandem.grammar) to one call block of the Qwen2.5 (Hermes) format,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

its name one of the tools (the named one), its arguments valid for that tool's parameters
schema. The JSON is laid out as the family writes it (", " and ": " separators, name first)
so the model's own likely tokens stay allowed. tandem.serve.tool_calls parses the block."""
from __future__ import annotations

import json

from tandem.errors import InvalidRequestError
from tandem.grammar.constraint import GrammarConstraint

_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def call_schema(name: str, parameters: dict | None) -> dict:
    """A JSON schema of one call of the function `name`."""
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_constraint(tools: list[dict], choice) -> GrammarConstraint | None:
    """tools: the request's tool definitions (dicts); choice: tool_choice ("required", a
    function's name, or anything else: unconstrained -> None)."""
    functions = [t["function"] for t in tools]
    if choice != "required":
        if not isinstance(choice, str) or choice in ("auto", "none"):
            return None
        functions = [f for f in functions if f["name"] == choice]
    schemas = [call_schema(f["name"], f.get("parameters")) for f in functions]
    if not schemas:
        raise InvalidRequestError("tool_choice", f"names {choice!r}, which is not one of the tools")
    schema = dict(schemas[0]) if len(schemas) == 1 else {"anyOf": schemas}
    schema["x-guidance"] = _LAYOUT
    lark = 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json ' + json.dumps(schema)
    return GrammarConstraint("grammar", lark, field="tool_choice")
