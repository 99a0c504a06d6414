"""serve_config.yaml names the builder and args it validates (what `serve run` and
KubeRay's serveConfigV2 read)."""
from __future__ import annotations

import importlib
import pathlib

import yaml

from tandem.serve import TandemServeArgs

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "serve_config.yaml"


def test_serve_config_builds_the_app_from_its_import_path_and_args():
    from ray.serve.deployment import Application

    config = yaml.safe_load(CONFIG.read_text())
    assert config["http_options"]["host"] == "127.0.0.1"
    (app,) = config["applications"]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    TandemServeArgs.model_validate(app["args"])
    assert isinstance(builder(app["args"]), Application)


def test_every_builder_argument_is_described():
    for name, field in TandemServeArgs.model_fields.items():
        assert field.description, name
