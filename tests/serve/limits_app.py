"""The served app's own engine behind a second ingress with small limits: the same
GenerationApp (create_app) over a handle on the real engine, served by uvicorn over real
HTTP in a thread, so a limit can be met without hundreds of requests (serve_asgi serves
any app so)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from .conftest import APP_ENGINE_NAME


@contextmanager
def serve_with_limits(limits):
    from tandem.actors import connect
    from tandem.serve.api import create_app

    app = create_app(connect(APP_ENGINE_NAME).multiplexed(), limits=limits)
    with serve_asgi(app) as v1:
        yield app, v1


@contextmanager
def serve_asgi(app):
    """`app` served by uvicorn over real HTTP in a thread; its /v1 URL."""
    import uvicorn

    from tandem.serve.direct_http import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(30)
