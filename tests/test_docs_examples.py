"""The README's embedded-engine example runs as written, and prints what it says."""
from __future__ import annotations

import contextlib
import io
import re

from docs_examples import example


def test_the_embedded_engine_example_runs_and_prints_its_text():
    code = example("Embedded, no Ray (the engine core)")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    out = printed.getvalue()
    # the whole output (its text may hold newlines), its finish reason and acceptance length
    m = re.search(r" (stop|length) (\d+\.\d+)\n", out)
    assert m, f"no finish reason and acceptance length in: {out!r}"
    assert float(m.group(2)) == 0.0 or float(m.group(2)) >= 1.0
    assert out[m.end():].strip(), "the streamed example printed no text"
