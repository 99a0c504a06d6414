"""`tandem generate` on the default model: the JSON-lines format."""
from __future__ import annotations

import json
import subprocess
import sys


def test_generate_prints_one_json_object_per_prompt(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n1, 2, 3, 4,\n")
    out = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "generate", "--prompt-file", str(prompts), "--max-tokens", "8",
         "--drafter", "ngram", "--batch", "2", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["prompt"] for r in rows] == ["The capital of France is", "1, 2, 3, 4,"]
    for r in rows:
        assert set(r) >= {"prompt", "prompt_token_ids", "text", "token_ids", "finish_reason", "num_drafts",
                          "num_draft_tokens", "num_accepted_tokens"}
        assert 1 <= len(r["token_ids"]) <= 8 and r["finish_reason"] in ("stop", "length")
        assert r["num_accepted_tokens"] <= r["num_draft_tokens"]


def test_generate_refuses_an_unknown_drafter():
    out = subprocess.run([sys.executable, "-m", "tandem.cli", "generate", "hi", "--drafter", "medusa"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "drafter" in out.stderr
