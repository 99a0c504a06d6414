"""ONE served app for the whole session, on the session's Ray cluster (tests/conftest.py);
starting it takes most of these tests' time: the default model, one shard actor, n-gram
drafting."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from polling import wait_for

APP_ENGINE_NAME = "tandem-test-app"
MAX_TOKENS_LIMIT = 256


@dataclass
class Server:
    base_url: str  # http://127.0.0.1:PORT
    model: str

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


@pytest.fixture(scope="session")
def server(ray_cluster) -> Server:
    from ray import serve

    from tandem.serve import build_app
    from tandem.serve.direct_http import start_serve

    port = ray_cluster
    start_serve("127.0.0.1", port)
    app = build_app({
        "model": "smollm2",
        "drafter": "ngram",
        "max_num_seqs": 8,
        "max_model_len": 4608,  # a 4,000-token prompt fits (tests/serve/test_long_context.py)
        "max_tokens_limit": MAX_TOKENS_LIMIT,
        "rpc_deadline_s": 10.0,
        "engine_actor_name": APP_ENGINE_NAME,
    })
    serve.run(app, name="tandem", route_prefix="/", blocking=False)
    served = Server(f"http://127.0.0.1:{port}", "smollm2")
    wait_healthy(served, 300)
    yield served
    serve.delete("tandem")


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def wait_healthy(server: Server, timeout_s: float = 180.0) -> None:
    wait_for(lambda: _healthy(server), timeout_s, f"the app at {server.base_url} to answer /health with 200",
             every_s=0.5)


def _healthy(server: Server) -> bool:
    import httpx

    try:
        return httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:  # not listening yet
        return False
