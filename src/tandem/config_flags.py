"""Command-line flags derived from config fields: one flag per field, named after it, with
its type, choices and help. A flag left out is absent from the parsed namespace, so the
config's own default applies (one set of defaults: the config's).

`tandem generate` takes EngineConfig's fields this way, `tandem serve` TandemServeArgs'.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    name: str
    annotation: object
    default: object  # dataclasses.MISSING: read from the environment by the config itself
    help: str
    metadata: dict = dataclasses.field(default_factory=dict)  # bounds (gt, ge, le), env


def add_flags(parser: argparse.ArgumentParser, options: list[Option], *, aliases: dict | None = None,
              notes: dict | None = None) -> None:
    """A flag for each option: `--name-with-dashes` (`--no-name` for a bool that defaults to
    True), plus its aliases; `notes` adds a sentence to an option's help."""
    aliases, notes = aliases or {}, notes or {}
    for o in options:
        help_text = f"{o.help} {notes[o.name]}" if o.name in notes else o.help
        common = {"dest": o.name, "default": argparse.SUPPRESS, "help": help_text}
        flag = "--" + o.name.replace("_", "-")
        names = (flag, *aliases.get(o.name, ()))
        kind = _inner(o.annotation)
        if kind is bool and o.default is True:
            parser.add_argument("--no-" + flag[2:], *aliases.get(o.name, ()), action="store_false", **common)
        elif kind is bool and o.default is False:
            parser.add_argument(*names, action="store_true", **common)
        elif kind is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(*names, choices=typing.get_args(kind), **common)
        else:
            parser.add_argument(*names, type=kind, **common)


def given(args: argparse.Namespace, options: list[Option]) -> dict:
    """The options the command line set."""
    return {o.name: getattr(args, o.name) for o in options if hasattr(args, o.name)}


def engine_options(exclude: tuple[str, ...] = ()) -> list[Option]:
    """EngineConfig's fields as options (the drafter as a choice of the registered ones)."""
    from tandem.config import EngineConfig

    return options_of(EngineConfig, exclude)


def options_of(config, exclude: tuple[str, ...] = ()) -> list[Option]:
    """A config dataclass's fields (their help and bounds in the metadata) as options."""
    hints = typing.get_type_hints(config)
    return [Option(f.name, hints[f.name], f.default, f.metadata["help"], dict(f.metadata))
            for f in dataclasses.fields(config) if f.name not in exclude]


def _inner(annotation):
    """X for X | None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation
