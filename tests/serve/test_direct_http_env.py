"""The environment `tandem serve` gives its local Ray cluster: one ingress replica on the
user's port itself, or HAProxy there in front of several, each on a port of its own."""
from __future__ import annotations

from tandem.serve.direct_http import direct_http_env, free_port


def test_one_replica_serves_the_port_itself_without_haproxy():
    env = direct_http_env(8123)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0"  # a setting left from an earlier call must not linger
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == ("8123", "8124")


def test_several_replicas_get_haproxy_on_the_port_and_ports_of_their_own_apart_from_its_others(monkeypatch):
    monkeypatch.delenv("RAY_SERVE_HAPROXY_NBTHREAD", raising=False)
    port = free_port()
    for _ in range(20):  # the ports are drawn at random: draw often
        env = direct_http_env(port, 3)
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
        replicas = range(int(env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]), int(env["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]))
        assert len(replicas) >= 3 and port not in replicas
        others = [int(env[f"RAY_SERVE_{name}_PORT"]) for name in ("HAPROXY_STATS", "HAPROXY_METRICS",
                                                                    "FALLBACK_PROXY_HTTP", "FALLBACK_PROXY_GRPC")]
        assert len({*others, port}) == 5 and not any(p in replicas for p in others)
        assert env["RAY_SERVE_HAPROXY_NBTHREAD"] == "2"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_NBTHREAD", "6")
    assert direct_http_env(port, 2)["RAY_SERVE_HAPROXY_NBTHREAD"] == "6"  # the user's setting wins


def _shows_argv(pid: int, arg: str) -> bool:
    """Whether /proc lists `arg` in the process's command line: Popen returns once the
    exec has begun, before the kernel has set the new command line up (it reads empty)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return arg.encode() in f.read().split(b"\0")


def test_stop_haproxy_kills_the_haproxy_of_that_node_only(tmp_path):
    import os
    import subprocess
    import sys

    from polling import wait_for
    from tandem.serve.direct_http import stop_haproxy

    haproxy = tmp_path / "haproxy"  # a stand-in that lists as haproxy in /proc
    os.symlink(sys.executable, haproxy)
    sleep = "import time; time.sleep(60)"
    configs = {node: f"/tmp/haproxy-serve/{node}/haproxy.cfg" for node in ("node-a", "node-b")}
    ours, other = (subprocess.Popen([str(haproxy), "-c", sleep, "-f", cfg]) for cfg in configs.values())
    try:
        for p, cfg in zip((ours, other), configs.values()):
            wait_for(lambda p=p, cfg=cfg: _shows_argv(p.pid, cfg), 30, f"stand-in {p.pid} to list {cfg} in /proc")
        assert stop_haproxy("node-a") == 1
        assert ours.wait(10) != 0 and other.poll() is None
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
