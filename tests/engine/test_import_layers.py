"""The import layers, checked on the source (every import, at module level or inside a
function): the wire and the engine core stay apart from what they must not pull in."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tandem

ROOT = pathlib.Path(tandem.__file__).parent

# (the package or module, the modules it must not import, by prefix)
RULES = [
    ("rpc", ("tandem.model", "tandem.drafters", "tandem.shard.factory", "tandem.shard.model_shard")),
    ("verify", ("tandem.rpc",)),
    ("shard/commands.py", ("torch", "tandem.model", "tandem.drafters", "tandem.rpc")),
    ("shard/spec.py", ("torch", "tandem.model", "tandem.rpc")),
    ("rpc/codec.py", ("torch",)),
]


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _files(part: str):
    target = ROOT / part
    return [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))


def _hits(name: str, banned: tuple[str, ...]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


def test_every_layer_imports_only_what_it_may():
    offenders = []
    for part, banned in RULES:
        files = _files(part)
        assert files, part
        for path in files:
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in _imports(path) if _hits(n, banned)]
    assert not offenders, offenders


def test_the_wire_types_and_the_codec_load_no_torch():
    code = ("import sys, tandem.rpc.codec, tandem.shard.commands, tandem.shard.spec;"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('tandem.model', 'tandem.drafters.dflash'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
