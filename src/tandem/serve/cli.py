"""`tandem serve`: a local Ray cluster sized for this machine and the OpenAI app on it.

    tandem serve                         # the default model at http://127.0.0.1:8000
    tandem serve --shards 2 --port 9000 --api-key secret

Ctrl-C or SIGTERM stops Serve and Ray, then exits 0. To join an existing cluster, give
--address (as for ray.init); a cluster runs the app from serve_config.yaml instead.
"""
from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time

from pydantic import ValidationError

from tandem.config_flags import Option, add_flags, given
from tandem.serve.args import EngineAutoscaling, TandemServeArgs

log = logging.getLogger("tandem.serve")


ALIASES = {"tensor_parallel_size": ("--shards",), "shard_num_gpus": ("--gpus-per-shard",)}
NOTES = {"shard_num_gpus": "Not given, tandem serve takes 1 where this machine has a GPU (and --device is not cpu), else 0."}


def _autoscaling(text: str) -> EngineAutoscaling:
    try:
        return EngineAutoscaling.parse(text)
    except ValidationError as e:  # argparse shows the message
        raise argparse.ArgumentTypeError(validation_message(e)) from None
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _options() -> list[Option]:
    # a nested block (autoscaling) is one flag, parsed from its own short form or JSON
    kinds = {"autoscaling": _autoscaling}
    return [Option(name, kinds.get(name, f.annotation), f.default, f.description or "")
            for name, f in TandemServeArgs.model_fields.items()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A flag for every TandemServeArgs field, then the local cluster's own."""
    add_flags(p, _options(), aliases=ALIASES, notes=NOTES)
    p.add_argument("--host", default="127.0.0.1", help="Address the HTTP server binds (0.0.0.0 to listen on all interfaces).")
    p.add_argument("--port", type=int, default=8000, help="HTTP port. Held only by a stopped server's closed connections (TIME_WAIT), it is waited for, up to 120 s; a port another process listens on is an error.")
    p.add_argument("--address", default=None, help="Join this Ray cluster instead of starting a local one.")
    p.add_argument("--num-cpus", type=int, default=None, help="Logical CPUs of the local Ray cluster (default: twice the cores, at least 4).")


def serve_args(args: argparse.Namespace) -> TandemServeArgs:
    """The app's arguments from the command line: what it set, the model's defaults for the rest."""
    fields = given(args, _options())
    if "shard_num_gpus" not in fields:
        import torch

        gpu = torch.cuda.is_available() and fields.get("device", "auto") != "cpu"
        fields["shard_num_gpus"] = 1.0 if gpu else 0.0
    return TandemServeArgs(**fields)


def validation_message(e: ValidationError) -> str:
    """Every bad argument on one line, each naming its field."""
    parts = []
    for err in e.errors():
        field = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from tandem.actors.cluster import init_local_ray
    from tandem.serve.app import build_app
    from tandem.serve.direct_http import haproxy_ports, start_serve, stop_haproxy, use_direct_http
    from tandem.serve.port_wait import wait_for_port

    try:
        app_args = serve_args(args)  # validate before starting anything
    except ValidationError as e:
        print(f"tandem serve: {validation_message(e)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    if args.address is None:
        problem = wait_for_port(args.host, args.port)
        if problem is not None:
            print(f"tandem serve: {problem}", file=sys.stderr)
            return 2
        # the cluster we start serves HTTP from the replica itself, or from HAProxy in front of several
        use_direct_http(args.port, app_args.ingress_replicas)
    started = init_local_ray(address=args.address, num_cpus=args.num_cpus)
    node_id = ray.get_runtime_context().get_node_id()
    # after ray.init, which installs its own SIGTERM handler
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        start_serve(args.host, args.port)
        serve.run(build_app(app_args), name="tandem", route_prefix="/", blocking=False)
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        print(f"tandem: serving {app_args.model or 'smollm2'} at http://{shown}:{args.port}/v1 (Ctrl-C to stop)", flush=True)
        if args.address is None and app_args.ingress_replicas > 1:
            print(f"tandem: {app_args.ingress_replicas} ingress replicas behind HAProxy; its stats page and metrics listen "
                  f"on all interfaces, ports {haproxy_ports()}", flush=True)
        while not stop.wait(0.5):
            pass
        print("tandem: stopping", flush=True)
        return 0
    finally:
        _shutdown_serve(ray.get_runtime_context().gcs_address if started else None)
        if started:
            ray.shutdown()
            stop_haproxy(node_id)  # what Serve's shutdown did not get to
        for s, h in previous.items():
            signal.signal(s, h)


def _shutdown_serve(own_gcs: str | None, limit_s: float = 60.0) -> None:
    """serve.shutdown(), but not waiting on a local cluster that is gone: a SIGTERM to the
    whole process group (`timeout`, a supervisor) stops the cluster's own processes too,
    and Serve would then wait 30 s for a controller that no longer answers."""
    from ray import serve

    def shutdown() -> None:
        try:
            serve.shutdown()
        except Exception as e:  # noqa: BLE001 - stop Ray regardless
            log.warning("serve shutdown: %s", e)

    worker = threading.Thread(target=shutdown, name="serve-shutdown", daemon=True)
    worker.start()
    deadline = time.monotonic() + limit_s
    while worker.is_alive() and time.monotonic() < deadline:
        worker.join(0.2)
        if own_gcs is not None and not _reachable(own_gcs):
            log.info("the local Ray cluster is already stopping: not waiting for Serve")
            return


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
