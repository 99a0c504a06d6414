"""Offline validation of the Kubernetes manifests under k8s/ and of Serve configs.

Every YAML document is checked by its (apiVersion, kind):
  ray.io/v1 RayService, RayCluster   the KubeRay v1.7.0 JSON Schemas vendored in
                                     tests/k8s/schemas (unknown fields refused); the
                                     parts those schemas leave open (the CR's metadata,
                                     the pod templates, the serve Service) also go
                                     through kubernetes-validate
  anything else                      kubernetes-validate, strict (unknown fields refused),
                                     against Kubernetes K8S_VERSION; a kind it does not
                                     know is an error, not a skip
A Serve config (serve_config.yaml, or a RayService's serveConfigV2) must validate as
Ray's ServeDeploySchema with no field Ray does not know, name an import_path that
imports to a one-parameter builder, carry args that the builder's pydantic model
accepts, and override only deployments that the built app has.

Each check returns a list of error strings (empty = valid), so a test can assert both
that a good manifest passes and that a broken one is refused. Also a command line:
    python tests/k8s/k8s_checks.py k8s/*.yaml serve_config.yaml
"""
from __future__ import annotations

import functools
import inspect
import json
import sys
import typing
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from pydantic import BaseModel, ValidationError

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "k8s"
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
# CI checks out the repo with shared/ beside it; the vendored copies must equal these.
SHARED_SCHEMA_DIR = REPO_ROOT.parent / "shared" / "k8s-schemas"

# The Kubernetes version built-in kinds are validated against. kubernetes-validate 1.N
# bundles the schemas of 1.25 .. 1.N; pyproject asks for kubernetes-validate >= 1.30, so
# 1.30 is always there, and validating against it keeps the manifests to fields that
# every cluster from 1.30 on knows.
K8S_VERSION = "1.30.0"

KUBERAY_SCHEMAS = {
    ("ray.io/v1", "RayService"): "rayservice-ray-v1.json",
    ("ray.io/v1", "RayCluster"): "raycluster-ray-v1.json",
}


# ---------------------------------------------------------------------------------------
# YAML


class _NoDuplicateKeysLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_NoDuplicateKeysLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str) -> object:
    return yaml.load(text, Loader=_NoDuplicateKeysLoader)


def load_documents(path: Path) -> list[dict]:
    """The non-empty YAML documents of `path` (a duplicate key anywhere is an error)."""
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=_NoDuplicateKeysLoader) if d is not None]


def manifest_paths() -> list[Path]:
    return sorted(p for p in K8S_DIR.rglob("*") if p.suffix in (".yaml", ".yml"))


# ---------------------------------------------------------------------------------------
# Manifests


@functools.cache
def kuberay_validator(schema_file: str) -> jsonschema.Draft7Validator:
    with open(SCHEMA_DIR / schema_file) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _path(parts) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts) or "."


def builtin_errors(doc: dict, where: str = "") -> list[str]:
    """kubernetes-validate, strict, against K8S_VERSION."""
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}{_path(e.path)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{where}: {e.message} (not a built-in kind, and not a KubeRay kind this test knows)"]
    return []


def _wrapped_builtin_errors(rayservice_or_cluster: dict, where: str) -> list[str]:
    """Check the parts the KubeRay schemas leave loose with the built-in schemas: the CR's
    metadata (as a ConfigMap's), each pod template (as a PodTemplate's) and serveService."""
    errors = builtin_errors({"apiVersion": "v1", "kind": "ConfigMap", "metadata": rayservice_or_cluster.get("metadata", {})},
                            where)
    spec = rayservice_or_cluster.get("spec") or {}
    cluster, prefix = spec, f"{where}.spec"
    if rayservice_or_cluster.get("kind") == "RayService":
        cluster, prefix = spec.get("rayClusterConfig") or {}, f"{where}.spec.rayClusterConfig"
    groups = [("headGroupSpec", cluster.get("headGroupSpec") or {})]
    groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(cluster.get("workerGroupSpecs") or [])]
    for name, group in groups:
        if "template" in group:
            errors += builtin_errors(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "template"}, "template": group["template"]},
                f"{prefix}.{name}")
    if rayservice_or_cluster.get("kind") == "RayService" and "serveService" in spec:
        service = {"apiVersion": "v1", "kind": "Service", **spec["serveService"]}
        errors += builtin_errors(service, f"{where}.spec.serveService")
    return errors


def manifest_errors(doc: dict, where: str = "") -> list[str]:
    """Every problem found in one manifest document."""
    if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
        return [f"{where}: not a Kubernetes object (needs apiVersion and kind)"]
    where = f"{where}{doc['kind']}/{(doc.get('metadata') or {}).get('name', '?')}"
    schema_file = KUBERAY_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema_file is None:
        if doc["apiVersion"].startswith("ray.io/"):
            return [f"{where}: {doc['apiVersion']} {doc['kind']} has no vendored KubeRay schema"]
        return builtin_errors(doc, where)
    errors = [f"{where}{_path(e.absolute_path)}: {e.message}"
              for e in sorted(kuberay_validator(schema_file).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    errors += _wrapped_builtin_errors(doc, where)
    if doc["kind"] == "RayService":
        serve_config = (doc.get("spec") or {}).get("serveConfigV2")
        if serve_config is None:
            errors.append(f"{where}.spec.serveConfigV2: missing (tandem is started by its Serve config)")
        elif isinstance(serve_config, str):
            try:
                config = load_yaml(serve_config)
            except yaml.YAMLError as e:
                errors.append(f"{where}.spec.serveConfigV2: not YAML: {e}")
            else:
                errors += serve_config_errors(config, f"{where}.spec.serveConfigV2")
    return errors


def file_errors(path: Path) -> list[str]:
    try:
        docs = load_documents(path)
    except yaml.YAMLError as e:
        return [f"{path.name}: {e}"]
    if not docs:
        return [f"{path.name}: no YAML documents"]
    return [err for i, doc in enumerate(docs) for err in manifest_errors(doc, f"{path.name}#{i}: ")]


# ---------------------------------------------------------------------------------------
# Serve configs


def import_builder(import_path: str):
    """What Serve imports for `import_path` ("module:attr" or "module.attr")."""
    from ray._common.utils import import_attr  # the resolver Serve itself uses

    return import_attr(import_path)


def builder_args_model(builder) -> type[BaseModel] | None:
    """The pydantic model among the annotations of the builder's single parameter."""
    (param,) = inspect.signature(builder).parameters.values()
    hints = typing.get_type_hints(builder)
    models = [t for t in _flatten(hints.get(param.name, param.annotation))
              if isinstance(t, type) and issubclass(t, BaseModel)]
    return models[0] if len(models) == 1 else None


def _flatten(annotation):
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _flatten(arg)


def unknown_field_errors(model: type[BaseModel], data: dict, where: str) -> list[str]:
    """Keys of `data` (recursively, through nested models) that `model` has no field for.
    Ray's Serve schemas ignore unknown keys; a misspelt option would silently do nothing."""
    fields = {}
    for name, field in model.model_fields.items():
        fields[name] = field
        if field.alias:
            fields[field.alias] = field
    errors = []
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            errors.append(f"{where}.{key}: unknown field of {model.__name__}")
            continue
        errors += _nested_unknown(field.annotation, value, f"{where}.{key}")
    return errors


def _nested_unknown(annotation, value, where: str) -> list[str]:
    models = [t for t in _flatten(annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
    if isinstance(value, dict) and len(models) == 1:
        return unknown_field_errors(models[0], value, where)
    if isinstance(value, list):
        return [e for i, item in enumerate(value) for e in _nested_unknown(annotation, item, f"{where}[{i}]")]
    return []


def serve_config_errors(config: object, where: str = "serve config") -> list[str]:
    """Ray's schema, no unknown fields, import_path imports, args fit the builder's model."""
    from ray.serve.schema import ServeDeploySchema

    if not isinstance(config, dict):
        return [f"{where}: not a mapping"]
    try:
        ServeDeploySchema.model_validate(config)
    except ValidationError as e:
        return [f"{where}: {err['loc']}: {err['msg']}" for err in e.errors()]
    errors = unknown_field_errors(ServeDeploySchema, config, where)
    for i, app in enumerate(config.get("applications") or []):
        app_where = f"{where}.applications[{i}]"
        try:
            builder = import_builder(app["import_path"])
        except Exception as e:  # ImportError, AttributeError, ValueError for a bad path
            errors.append(f"{app_where}.import_path {app['import_path']!r} does not import: {type(e).__name__}: {e}")
            continue
        if not callable(builder) or len(inspect.signature(builder).parameters) != 1:
            errors.append(f"{app_where}.import_path {app['import_path']!r} is not a one-argument builder")
            continue
        model = builder_args_model(builder)
        if model is None:
            errors.append(f"{app_where}: the builder {app['import_path']!r} names no pydantic args model")
            continue
        try:
            model.model_validate(app.get("args") or {})
        except ValidationError as e:
            errors += [f"{app_where}.args.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            continue
        named = [d.get("name") for d in app.get("deployments") or []]
        if named:  # Serve refuses a config that overrides a deployment the app does not have
            built = deployment_names(builder(app.get("args") or {}))
            errors += [f"{app_where}.deployments: {name!r} is not a deployment of the app (it has {sorted(built)})"
                       for name in named if name not in built]
    return errors


def deployment_names(application) -> set[str]:
    """Names of the deployments of a bound Serve application (building one starts no Ray)."""
    from ray.serve.deployment import Application

    names, todo = set(), [application]
    while todo:
        deployment = todo.pop()._bound_deployment
        names.add(deployment.name)
        todo += [a for a in [*deployment.init_args, *deployment.init_kwargs.values()] if isinstance(a, Application)]
    return names


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or manifest_paths()
    failed = 0
    for path in paths:
        docs = load_documents(path)
        if len(docs) == 1 and "applications" in docs[0] and "kind" not in docs[0]:  # a Serve config file
            errors = serve_config_errors(docs[0], path.name)
        else:
            errors = file_errors(path)
        for err in errors:
            print(f"ERROR {err}")
        print(f"{'FAIL' if errors else 'ok  '} {path}")
        failed += bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
