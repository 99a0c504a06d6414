"""Text that ships in the Python packages installed where the DFlash training script runs
(sysconfig's stdlib and purelib: Python sources, C/C++ headers, package READMEs in
dist-info METADATA, pydoc's topic texts), cut into passages: raw completion prompts, and
the passages that rewrite / summarise / explain / review requests are built around
(scripts/dflash_general_prompts.py)."""
from __future__ import annotations

import os
import random
import re
import sysconfig


def source_files(max_files: int = 3000, seed: int = 0) -> dict[str, list[str]]:
    """Paths by type (py, h, md, doc) under the stdlib and site-packages of the running
    Python, a fixed random sample of each type (sorted walk, seeded)."""
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and os.path.isdir(p) and p not in roots:
            roots.append(p)
    found = {"py": [], "h": [], "md": [], "doc": []}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "test", "tests") and not d.startswith("."))
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                if f == "topics.py" and "pydoc_data" in dirpath:
                    found["doc"].append(path)
                elif f.endswith(".py"):
                    found["py"].append(path)
                elif f.endswith((".h", ".hpp", ".cuh", ".c", ".cpp", ".cc")):
                    found["h"].append(path)
                elif f in ("METADATA", "PKG-INFO") or f.endswith((".md", ".rst")):
                    found["md"].append(path)
    r = random.Random(seed)
    for k in found:
        r.shuffle(found[k])
        found[k] = found[k][:max_files]
    return found


def _read(path: str, limit: int = 200_000) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(limit)
    except (OSError, UnicodeDecodeError):
        return ""


def _text(path: str) -> str:
    """A file's readable text: pydoc's topics (a dict literal of strings) as the texts."""
    if path.endswith("topics.py") and "pydoc_data" in path:
        import ast

        try:
            tree = ast.parse(_read(path, 10_000_000))
            d = next(n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict))
            return "\n\n".join(v.value for v in d.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        except (SyntaxError, StopIteration):
            return ""
    return _read(path)


def passages(files: dict[str, list[str]], seed: int = 0, per_file: int = 3) -> dict[str, list[str]]:
    """Passages cut at line boundaries: "code" (Python and C/C++ sources, 3-60 lines),
    "prose" (README / docstring paragraphs of 1-12 lines that read as text)."""
    r = random.Random(seed + 3)
    out = {"code": [], "prose": []}
    for kind in ("py", "h"):
        for path in files[kind]:
            lines = _read(path).splitlines()
            if len(lines) < 8:
                continue
            for _ in range(per_file):
                n = int(round(3 * (20 ** r.random())))  # 3..60 lines, log-uniform
                s = r.randrange(0, max(1, len(lines) - n))
                text = "\n".join(lines[s : s + n]).strip("\n")
                if 40 <= len(text) <= 3500 and text.count("\n") >= 2:
                    out["code"].append(text)
    for path in files["md"] + files["doc"]:
        text = _text(path)
        if path.endswith(("METADATA", "PKG-INFO")):
            text = text.split("\n\n", 1)[-1]  # the long description, past the headers
        paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        prose = [p for p in paras if len(p) >= 120 and sum(c.isalpha() or c == " " for c in p) / len(p) > 0.8]
        r.shuffle(prose)
        for p in prose[: per_file * 4]:
            if len(p) <= 3000:
                out["prose"].append(p)
    r.shuffle(out["code"])
    r.shuffle(out["prose"])
    return out


def raw_excerpts(files: dict[str, list[str]], count: int, seed: int = 0) -> list[str]:
    """Raw completion prompts: a file's text from a random line, 1-120 lines
    (log-uniform), at most ~3000 characters (~800 tokens)."""
    r = random.Random(seed + 5)
    weights = {"py": 4, "h": 2, "md": 3, "doc": 1}
    pool = [(p, k) for k in ("py", "h", "md", "doc") for p in files[k]]
    out = []
    tries = 0
    while len(out) < count and tries < count * 5 and pool:
        tries += 1
        path, k = pool[r.randrange(len(pool))]
        if r.random() * 4 > weights[k]:
            continue
        lines = _text(path).splitlines(keepends=True)
        if len(lines) < 3:
            continue
        n = max(1, int(round(120 ** r.random())))
        s = r.randrange(0, max(1, len(lines) - 1))
        text = "".join(lines[s : s + n])[:3000]
        if len(text.strip()) >= 20:
            out.append(text)
    return out


