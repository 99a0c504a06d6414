"""HTTP served by the ingress replica itself (Ray Serve's direct ingress).

Through Serve's HTTP proxy, every SSE chunk of every stream crosses one more process:
the proxy reads each response from the replica as a Ray streaming call of its own. At
64 streams that hop was the bottleneck (H200, random-weight SmolLM2: 3028 tok/s
through the proxy, 5000 straight from the replica; 6 ms more to the first token at one
client). Ray 2.60's throughput-optimized mode lets the ingress replica run the HTTP
server itself; we give it the user's port (a port range of one) and start Serve's
proxy, which Serve still wants, on a free port of its own.

Several ingress replicas (ingress_replicas > 1) cannot share a port that way: Serve's
HAProxy mode runs HAProxy on the user's port in front of them, each replica on a free
port of its own. HAProxy also opens its stats page and Prometheus exporter, on every
interface (Ray 2.60 does not let us choose), and Serve its proxy as HAProxy's backup;
we give them free ports.

The settings are environment variables that Serve's controller and replicas read when
they start, so they are set before the local Ray cluster starts (its processes inherit
them). A cluster started elsewhere (KubeRay, `--address`) keeps its own settings and
serves through its proxy.
"""
from __future__ import annotations

import os
import signal
import socket


def direct_http_env(port: int, ingress_replicas: int = 1) -> dict[str, str]:
    """The environment that has the ingress replica serve HTTP on `port` itself, or with
    several, HAProxy on `port` in front of them."""
    if ingress_replicas > 1:
        return haproxy_env(port, ingress_replicas)
    return {
        # direct ingress, user code on the replica's own event loop, fewer log writes
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),  # exclusive: exactly `port`
        # a replica that restarts takes the same port back at once
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        # no load balancer to deregister from: a stopping replica need not linger 30 s
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    }


def haproxy_env(port: int, ingress_replicas: int) -> dict[str, str]:
    """HAProxy on `port` in front of `ingress_replicas` direct-ingress replicas (the port
    itself goes to Serve's http_options: start_serve)."""
    replicas = range(port, port + 1)
    while port in replicas:
        first = free_port()
        replicas = range(first, first + 4 * ingress_replicas)  # room for one that restarts while the old one drains
    stats, metrics, fallback_http, fallback_grpc = free_ports(4, avoid=[*replicas, port])
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        # Serve's default of 4 threads is for a node of its own; here the engine, the
        # replicas and HAProxy share the cores, and two threads forward tens of thousands
        # of chunks a second
        "RAY_SERVE_HAPROXY_NBTHREAD": os.environ.get("RAY_SERVE_HAPROXY_NBTHREAD", "2"),
        # Serve skips a port of the range that turns out to be taken
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(replicas.start),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(replicas.stop),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics),
        # the head node's Serve proxy, HAProxy's backup server: by default on 8500 and
        # 9500, where a second cluster on the machine would fail to bind (its proxy then
        # fails its health checks and serve.start with it)
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(fallback_http),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(fallback_grpc),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
    }


def use_direct_http(port: int, ingress_replicas: int = 1) -> None:
    """Call before the local Ray cluster starts: its Serve replica will serve `port` (with
    several replicas, HAProxy will)."""
    os.environ.update(direct_http_env(port, ingress_replicas))


def haproxy_ports() -> str:
    """Where this process's HAProxy shows its stats page and metrics (haproxy_env)."""
    return f"{os.environ.get('RAY_SERVE_HAPROXY_STATS_PORT')} (stats), {os.environ.get('RAY_SERVE_HAPROXY_METRICS_PORT')} (metrics)"


def stop_haproxy(node_id: str) -> int:
    """Kill what HAProxy processes Serve started for the node `node_id` (their config lies
    in a folder named by it); how many. Serve stops HAProxy only when its own shutdown runs
    to the end: a cluster stopped sooner leaves it running, still on the user's port and
    on every interface. Call once the cluster is down."""
    marker = f"/{node_id}/".encode()
    killed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv[0].endswith(b"/haproxy") and any(marker in arg for arg in argv[1:]):
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def direct_http_port() -> int | None:
    """The port the ingress replica serves, when this process set one up."""
    if os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") != "1" or os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        return None
    port = os.environ.get("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT")
    return int(port) if port else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for the proxy, which no client needs to know)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, avoid: list[int]) -> list[int]:
    """n distinct free ports, none in `avoid`."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in avoid and port not in ports:
            ports.append(port)
    return ports


def start_serve(host: str, port: int) -> None:
    """serve.start for an app that answers on host:port. With direct HTTP set up
    (use_direct_http(port) before the cluster started) the replica answers there and the
    proxy gets a free port; otherwise the proxy (or HAProxy) answers there."""
    from ray import serve

    direct = direct_http_port() == port
    serve.start(http_options={"host": host, "port": free_port(host) if direct else port})
