"""The README's configuration tables, generated from the code that defines the options.

    python scripts/config_table.py            # print the tables
    python scripts/config_table.py --write    # rewrite them in README.md
    python scripts/config_table.py --check    # exit 1 if README.md's tables are stale

Each table sits in README.md between `<!-- generated: NAME -->` and `<!-- end: NAME -->`.
The sources: TandemServeArgs (the Serve builder's args, the YAML and `tandem serve`),
the `tandem serve` and `tandem generate` parsers, and EngineConfig (the embedded engine).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(value) -> str:
    if value is None:
        return "`None`"
    if value is dataclasses.MISSING:
        return "required"
    return f"`{value}`"


def _parser(add_arguments) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return p


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def _flags(action: argparse.Action) -> str:
    return ", ".join(f"`{s}`" for s in action.option_strings)


def serve_args_table() -> str:
    """One row per builder field (the engine's first), with the `tandem serve` flag that sets it."""
    from tandem.serve.args import ENGINE_FIELDS, TandemServeArgs
    from tandem.serve.cli import NOTES, add_arguments

    by_dest = {a.dest: a for a in _options(_parser(add_arguments))}
    fields = TandemServeArgs.model_fields
    rows = ["| field (Serve YAML, builder) | `tandem serve` flag | default | what it does |", "|---|---|---|---|"]
    for name in (*ENGINE_FIELDS, *(n for n in fields if n not in ENGINE_FIELDS)):
        field, action = fields[name], by_dest.get(name)
        flag = _flags(action) if action else "—"
        text = (field.description or "") + (f" {NOTES[name]}" if name in NOTES else "")
        rows.append(f"| `{name}` | {flag} | {_default(field.default)} | {_cell(text)} |")
    return "\n".join(rows)


def serve_only_table() -> str:
    """The `tandem serve` flags that are not builder fields: the local cluster and its HTTP."""
    from tandem.serve.args import TandemServeArgs
    from tandem.serve.cli import add_arguments

    rows = ["| `tandem serve` flag | default | what it does |", "|---|---|---|"]
    for a in _options(_parser(add_arguments)):
        if a.dest not in TandemServeArgs.model_fields:
            rows.append(f"| {_flags(a)} | {_default(a.default)} | {_cell(a.help or '')} |")
    return "\n".join(rows)


def generate_table() -> str:
    """Its own options with their defaults, then the engine's with EngineConfig's."""
    from tandem.cli_generate import add_arguments

    rows = ["| `tandem generate` option | default | what it does |", "|---|---|---|"]
    for a in _parser(add_arguments)._actions:
        names = _flags(a) if a.option_strings else f"`{a.dest}` (positional)"
        default = _engine_default(a.dest) if a.default is argparse.SUPPRESS else _default(a.default)
        rows.append(f"| {names} | {default} | {_cell(a.help or '')} |")
    return "\n".join(rows)


def _engine_default(name: str) -> str:
    from tandem.config import EngineConfig

    f = {f.name: f for f in dataclasses.fields(EngineConfig)}[name]
    return f"`${f.metadata['env']}`" if "env" in f.metadata else _default(f.default)


def engine_config_table() -> str:
    from tandem.config import EngineConfig

    rows = ["| `EngineConfig` field | default | what it does |", "|---|---|---|"]
    for f in dataclasses.fields(EngineConfig):
        rows.append(f"| `{f.name}` | {_engine_default(f.name)} | {_cell(f.metadata.get('help', ''))} |")
    return "\n".join(rows)


TABLES = {
    "serve-args": serve_args_table,
    "serve-only-flags": serve_only_table,
    "generate-options": generate_table,
    "engine-config": engine_config_table,
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"<!-- generated: {name} -->\n.*?<!-- end: {name} -->", re.S)


def render_into(text: str) -> str:
    """`text` with every generated table replaced by what the code says now."""
    for name, build in TABLES.items():
        pattern = _block(name)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no '<!-- generated: {name} -->' block")
        block = f"<!-- generated: {name} -->\n{build()}\n<!-- end: {name} -->"
        text = pattern.sub(lambda _: block, text)
    return text


def main(argv: list[str]) -> int:
    if "--write" in argv or "--check" in argv:
        old = README.read_text(encoding="utf-8")
        new = render_into(old)
        if "--check" in argv:
            if new != old:
                print("README.md's configuration tables are stale: run python scripts/config_table.py --write")
                return 1
            return 0
        README.write_text(new, encoding="utf-8")
        return 0
    for name, build in TABLES.items():
        print(f"<!-- generated: {name} -->\n{build()}\n<!-- end: {name} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
