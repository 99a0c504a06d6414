"""The README's configuration tables say what the code does: every builder field and every
`tandem serve` / `tandem generate` option, with its default (scripts/config_table.py)."""
from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _config_table():
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "scripts" / "config_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(name: str) -> str:
    m = re.search(rf"<!-- generated: {name} -->\n(.*?)<!-- end: {name} -->", README, re.S)
    assert m, f"README.md has no generated block {name!r}"
    return m.group(1)


def _rows(block: str) -> dict[str, list[str]]:
    """First cell -> the other cells, for each table row."""
    rows = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


def test_every_builder_field_is_in_the_readme_with_its_default():
    from tandem.serve.args import TandemServeArgs

    rows = _rows(_block("serve-args"))
    for name, field in TandemServeArgs.model_fields.items():
        assert f"`{name}`" in rows, f"README's configuration table lacks the builder field {name!r}"
        default = "`None`" if field.default is None else f"`{field.default}`"
        assert rows[f"`{name}`"][1] == default, f"README gives {name!r} the default {rows[f'`{name}`'][1]}, the code {default}"


def test_every_tandem_serve_flag_is_in_the_readme():
    from tandem.serve.cli import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    documented = _block("serve-args") + _block("serve-only-flags")
    for action in parser._actions:
        for flag in action.option_strings:
            assert f"`{flag}`" in documented, f"README's configuration tables lack the tandem serve flag {flag}"


def test_every_tandem_generate_option_and_engine_field_is_in_the_readme():
    import dataclasses

    from tandem.cli_generate import add_arguments
    from tandem.config import EngineConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    generate = _block("generate-options")
    for action in parser._actions:
        for flag in action.option_strings:
            assert f"`{flag}`" in generate, f"README lacks the tandem generate option {flag}"
    engine = _rows(_block("engine-config"))
    for f in dataclasses.fields(EngineConfig):
        assert f"`{f.name}`" in engine, f"README lacks the EngineConfig field {f.name!r}"
        assert f.metadata.get("help"), f"EngineConfig.{f.name} has no help text for the README"


def test_the_generated_tables_are_what_the_code_says_now():
    module = _config_table()
    assert module.render_into(README) == README, "README.md's tables are stale: python scripts/config_table.py --write"
