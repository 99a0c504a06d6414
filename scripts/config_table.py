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
    """One row per builder field, with the `tandem serve` flag that sets it (if any)."""
    from tandem.serve.args import TandemServeArgs
    from tandem.serve.cli import add_arguments

    by_dest = {a.dest: a for a in _options(_parser(add_arguments))}
    rows = ["| field (Serve YAML, builder) | `tandem serve` flag | default | what it does |", "|---|---|---|---|"]
    for name, field in TandemServeArgs.model_fields.items():
        action = by_dest.get(name)
        flag = _flags(action) if action else "—"
        text = field.description or ""
        if action is not None and action.help and action.help != text:
            text += f" `tandem serve`: {action.help}"  # where the flag's default differs
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
    from tandem.cli_generate import add_arguments

    rows = ["| `tandem generate` option | default | what it does |", "|---|---|---|"]
    parser = _parser(add_arguments)
    for a in parser._actions:
        names = _flags(a) if a.option_strings else f"`{a.dest}` (positional)"
        rows.append(f"| {names} | {_default(a.default)} | {_cell(a.help or '')} |")
    return "\n".join(rows)


def engine_config_table() -> str:
    from tandem.config import EngineConfig

    rows = ["| `EngineConfig` field | default | what it does |", "|---|---|---|"]
    for f in dataclasses.fields(EngineConfig):
        default = f"`${f.metadata['env']}`" if "env" in f.metadata else _default(f.default)
        rows.append(f"| `{f.name}` | {default} | {_cell(f.metadata.get('help', ''))} |")
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
