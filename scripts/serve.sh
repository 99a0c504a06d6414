#!/usr/bin/env bash
# Install (first run only), then start a local Ray cluster and the OpenAI-compatible
# server on the default model at http://127.0.0.1:8000. Extra arguments go to `tandem serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/tandem serve "$@"
