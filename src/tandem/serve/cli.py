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

from tandem.serve.args import TandemServeArgs

log = logging.getLogger("tandem.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    fields = TandemServeArgs.model_fields
    p.add_argument("--model", default=None, help=fields["model"].description)
    p.add_argument("--served-model-name", default=None, help=fields["served_model_name"].description)
    p.add_argument("--drafter", default="ngram", choices=["none", "ngram", "draft-model", "dflash"], help=fields["drafter"].description)
    p.add_argument("--draft-model", default=None, help=fields["draft_model"].description)
    p.add_argument("--dflash-checkpoint", default=None, metavar="PATH", help=fields["dflash_checkpoint"].description)
    p.add_argument("--num-speculative-tokens", type=int, default=None, help=fields["num_speculative_tokens"].description)
    p.add_argument("--shards", "--tensor-parallel-size", dest="shards", type=int, default=1, help=fields["tensor_parallel_size"].description)
    p.add_argument("--max-num-seqs", type=int, default=32, help=fields["max_num_seqs"].description)
    p.add_argument("--max-seq-len", type=int, default=1024, help=fields["max_seq_len"].description)
    p.add_argument("--max-tokens-limit", type=int, default=1024, help=fields["max_tokens_limit"].description)
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, metavar="BYTES", help=fields["max_body_bytes"].description)
    p.add_argument("--max-prompt-chars", type=int, default=None, metavar="N", help=fields["max_prompt_chars"].description)
    p.add_argument("--max-stop-strings", type=int, default=4, metavar="N", help=fields["max_stop_strings"].description)
    p.add_argument("--max-stop-chars", type=int, default=256, metavar="N", help=fields["max_stop_chars"].description)
    p.add_argument("--max-waiting-requests", type=int, default=128, metavar="N", help=fields["max_waiting_requests"].description)
    p.add_argument("--device", default="auto", help=fields["device"].description)
    p.add_argument("--dtype", default="auto", help=fields["dtype"].description)
    p.add_argument("--in-process-target", action="store_true", help=fields["in_process_target"].description)
    p.add_argument("--no-session-socket", dest="session_socket", action="store_false", help=fields["session_socket"].description)
    p.add_argument("--session-spin-us", type=int, default=None, metavar="US", help=fields["session_spin_us"].description)
    p.add_argument("--ingress-replicas", type=int, default=1, metavar="N", help=fields["ingress_replicas"].description)
    p.add_argument("--gpus-per-shard", type=float, default=None, help="GPUs per shard actor (default: 1 when this machine has a GPU, else 0).")
    p.add_argument("--host", default="127.0.0.1", help="Address the HTTP server binds (0.0.0.0 to listen on all interfaces).")
    p.add_argument("--port", type=int, default=8000, help="HTTP port.")
    p.add_argument("--api-key", default=None, help=fields["api_key"].description)
    p.add_argument("--address", default=None, help="Join this Ray cluster instead of starting a local one.")
    p.add_argument("--num-cpus", type=int, default=None, help="Logical CPUs of the local Ray cluster (default: twice the cores, at least 4).")


def serve_args(args: argparse.Namespace) -> TandemServeArgs:
    gpus = args.gpus_per_shard
    if gpus is None:
        import torch

        gpus = 1.0 if torch.cuda.is_available() and args.device != "cpu" else 0.0
    return TandemServeArgs(
        model=args.model,
        served_model_name=args.served_model_name,
        drafter=args.drafter,
        draft_model=args.draft_model,
        dflash_checkpoint=args.dflash_checkpoint,
        num_speculative_tokens=args.num_speculative_tokens,
        tensor_parallel_size=args.shards,
        max_num_seqs=args.max_num_seqs,
        max_seq_len=args.max_seq_len,
        max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes,
        max_prompt_chars=args.max_prompt_chars,
        max_stop_strings=args.max_stop_strings,
        max_stop_chars=args.max_stop_chars,
        max_waiting_requests=args.max_waiting_requests,
        device=args.device,
        dtype=args.dtype,
        api_key=args.api_key,
        shard_num_gpus=gpus,
        in_process_target=args.in_process_target,
        session_socket=args.session_socket,
        session_spin_us=args.session_spin_us,
        ingress_replicas=args.ingress_replicas,
    )


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

    try:
        app_args = serve_args(args)  # validate before starting anything
    except ValidationError as e:
        print(f"tandem serve: {validation_message(e)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    if args.address is None:
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
