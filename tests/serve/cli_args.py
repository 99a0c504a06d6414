"""`tandem serve`'s command line parsed as the CLI parses it (no GPUs asked for)."""
from __future__ import annotations

import argparse

from tandem.serve import cli as serve_cli


def cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(["--gpus-per-shard", "0", *argv])
