"""LangChain's ChatOpenAI (PyPI langchain-openai) pointed at the running app, as its
users use it: invoke and stream. Its bind_tools is in test_qwen_tools.py (a model whose
template renders tools)."""
from __future__ import annotations

import pytest

langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (the test extra has it)")


def test_chat_openai_invokes_and_streams_the_same_greedy_answer(server):
    llm = langchain_openai.ChatOpenAI(model=server.model, base_url=server.v1, api_key="unused", temperature=0,
                                      max_tokens=8, max_retries=0, timeout=120)
    answer = llm.invoke("Name a fruit.")
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    streamed = "".join(chunk.content for chunk in llm.stream("Name a fruit."))
    assert streamed == answer.content
