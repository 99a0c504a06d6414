"""GrammarConstraint: what a request's output must match, as SamplingParams carries it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tandem.errors import InvalidRequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GrammarConstraint:
    """kind: json (a JSON schema), json_object (any JSON object), regex, choice (one of
    the given strings) or grammar (Lark/EBNF, or GBNF with ::= rules). value: the schema
    as JSON text, the regex, the choices as a JSON list, or the grammar text.
    field: the request field named when the constraint is refused."""

    kind: str
    value: str = ""
    field: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.field:
            object.__setattr__(self, "field", f"structured_outputs.{self.kind}")
        if self.kind not in KINDS:
            raise InvalidRequestError("structured_outputs", f"unknown constraint kind {self.kind!r} (one of {', '.join(KINDS)})")
        if not isinstance(self.value, str):
            raise InvalidRequestError(self.field, f"must be given as text, got {type(self.value).__name__}")

    @classmethod
    def json_schema(cls, schema: dict | str | bool, field: str = "") -> "GrammarConstraint":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(field or "structured_outputs.json", f"is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError(field or "structured_outputs.json", f"must be a JSON schema object, got {type(schema).__name__}")
        return cls("json", json.dumps(schema, sort_keys=True), field)

    @classmethod
    def choice(cls, choices: list[str], field: str = "") -> "GrammarConstraint":
        f = field or "structured_outputs.choice"
        if not isinstance(choices, (list, tuple)) or not choices:
            raise InvalidRequestError(f, "must be a non-empty list of strings")
        if any(not isinstance(c, str) or not c for c in choices):
            raise InvalidRequestError(f, "every choice must be a non-empty string")
        return cls("choice", json.dumps(list(choices)), f)
