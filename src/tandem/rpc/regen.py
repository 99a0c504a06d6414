"""Regenerate the committed gRPC stubs from protos/shard.proto (needs grpcio-tools).

    python -m tandem.rpc.regen          # rewrite src/tandem/rpc/generated/
    python -m tandem.rpc.regen --check  # exit 1 if the committed stubs differ (CI)

The stubs import each other package-relatively (`from . import shard_pb2`), so they
work inside tandem.rpc.generated wherever tandem is installed.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent / "generated"
PROTO_DIR = Path(__file__).resolve().parents[3] / "protos"
PROTO = "shard.proto"
OUTPUTS = ("shard_pb2.py", "shard_pb2.pyi", "shard_pb2_grpc.py")


def generate() -> dict[str, str]:
    """file name -> contents of freshly generated stubs."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", PROTO]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO}")
        files = {name: (Path(out) / name).read_text() for name in OUTPUTS}
    # protoc writes `import shard_pb2 as shard__pb2`; inside a package it must be relative.
    files["shard_pb2_grpc.py"] = re.sub(r"^import shard_pb2 as", "from . import shard_pb2 as", files["shard_pb2_grpc.py"], flags=re.M)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed stubs instead of writing them")
    args = parser.parse_args(argv)
    files = generate()
    if args.check:
        stale = [n for n, text in files.items() if not (PACKAGE_DIR / n).is_file() or (PACKAGE_DIR / n).read_text() != text]
        if stale:
            print(f"stale gRPC stubs: {', '.join(stale)}; run python -m tandem.rpc.regen", file=sys.stderr)
            return 1
        print("gRPC stubs are up to date")
        return 0
    for name, text in files.items():
        (PACKAGE_DIR / name).write_text(text)
    print(f"wrote {', '.join(OUTPUTS)} to {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
