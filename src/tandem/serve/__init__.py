"""The Ray Serve app: an OpenAI-compatible HTTP API in front of the scheduler actor.

`tandem.serve:build_app` is the builder a Serve YAML config (or KubeRay's
serveConfigV2) names as its import_path.
"""
from tandem.serve.args import TandemServeArgs

__all__ = ["TandemServeArgs", "build_app"]


def build_app(args: dict | TandemServeArgs):
    """Serve builder: args (validated as TandemServeArgs) -> the bound application."""
    from tandem.serve.app import build_app as _build

    return _build(args)
