"""The request fields of structured outputs: OpenAI's response_format and vLLM's
structured_outputs, both turned into one tandem.grammar.GrammarConstraint."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.errors import InvalidRequestError
from tandem.grammar.constraint import GrammarConstraint


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: str = Field(description="The schema's name.")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(True, alias="schema", description="The JSON schema the output must match.")
    strict: bool | None = Field(None, description="Accepted; the output always matches the schema.")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's names: exactly one of them."""

    model_config = ConfigDict(strict=True, extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json", description="A JSON schema (object or text).")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = Field(None, description="A Lark (EBNF) grammar, or GBNF with ::= rules.")


def constraint_of(response_format: ResponseFormat | None, structured: StructuredOutputs | None) -> GrammarConstraint | None:
    given = {k: v for k, v in (structured.model_dump(by_alias=True) if structured else {}).items() if v is not None}
    if response_format is not None and response_format.type != "text":
        if given:
            raise InvalidRequestError("structured_outputs", "give response_format or structured_outputs, not both")
        if response_format.type == "json_object":
            return GrammarConstraint("json_object", field="response_format")
        if response_format.json_schema is None:
            raise InvalidRequestError("response_format.json_schema", "is required with type json_schema")
        return GrammarConstraint.json_schema(response_format.json_schema.schema_, "response_format.json_schema.schema")
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequestError("structured_outputs", f"give one of json, regex, choice, grammar; got {', '.join(sorted(given))}")
    kind, value = next(iter(given.items()))
    if kind == "json":
        return GrammarConstraint.json_schema(value, "structured_outputs.json")
    if kind == "choice":
        return GrammarConstraint.choice(value)
    return GrammarConstraint(kind, value)
