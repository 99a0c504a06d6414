"""The README's openai-client example against the served app (real Ray Serve, real HTTP)."""
from __future__ import annotations

import contextlib
import io

from docs_examples import example


def test_the_openai_client_example_runs_against_the_server(server):
    code = example("HTTP, with the openai client").replace("http://127.0.0.1:8000/v1", server.v1)
    assert server.v1 in code, "the example no longer names the default address"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    out = printed.getvalue()
    assert out.strip(), "the example printed nothing"
    assert "\n" in out.strip(), "the example printed the chat answer or the stream, not both"
