"""`tandem` command line: generate (embedded engine), shard (one gRPC shard process), serve (Ray)."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> module with add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "generate": ("tandem.cli_generate", "Generate text with the embedded engine (no Ray)."),
    "shard": ("tandem.shard_cli", "Run one gRPC shard server process (for runs without Ray)."),
    "serve": ("tandem.serve.cli", "Start a local Ray cluster and the OpenAI-compatible server."),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem", description="Speculative-decoding LLM serving.")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (INFO shows one line per verify batch).")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            modules[name] = importlib.import_module(module)
        except ImportError as e:  # a part whose extras are not installed (e.g. serve without Ray)
            modules[name] = e
            continue
        modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mod = modules[args.command]
    if isinstance(mod, ImportError):
        print(f"tandem {args.command}: unavailable ({mod}); install tandem[serve]", file=sys.stderr)
        return 2
    return int(mod.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
