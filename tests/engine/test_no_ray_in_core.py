"""The engine core runs embedded: nothing outside tandem.actors / tandem.serve imports Ray."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import tandem

RAY_PARTS = {"actors", "serve"}
ROOT = pathlib.Path(tandem.__file__).parent


def _core_files():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in RAY_PARTS:
            yield path


def test_no_core_module_imports_ray():
    offenders = []
    for path in _core_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n == "ray" or n.startswith("ray.")]
    assert not offenders, offenders
    assert any(True for _ in _core_files())


def test_importing_the_engine_loads_no_ray():
    code = (
        "import sys, tandem.engine, tandem.cli_generate, tandem.shard.local_group, tandem.drafters.ngram;"
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
