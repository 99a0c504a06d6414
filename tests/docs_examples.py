"""The README's Python examples, as a user would copy them: the code block under a heading."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def example(heading: str) -> str:
    """The first ```python block after the '### heading' line of the README."""
    text = README.read_text(encoding="utf-8")
    start = text.find(f"### {heading}\n")
    assert start >= 0, f"README.md has no '### {heading}' section"
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m, f"README.md's '### {heading}' section has no python example"
    return m.group(1)
