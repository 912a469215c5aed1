"""The KubeRay manifest, offline: valid against the RayService CRD, and its Serve config is this app's.

The CRD (`ray.io_rayservices.yaml`) lives in the project's shared folder (`../shared/k8s-schemas`
beside the checkout, or `$RTV_SHARED_DIR/k8s-schemas`); the schema tests skip when it is absent.
Its OpenAPI v3 schema is checked the way the API server would: JSON Schema (2020-12) for types,
required fields, enums and patterns, plus what OpenAPI/Kubernetes add on top: unknown fields are
rejected (kubectl's strict field validation), int32/int64 ranges, list-map keys unique.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "k8s" / "rayservice.yaml"
DOCKERFILE = REPO / "k8s" / "Dockerfile"
LAPTOP_CONFIG = REPO / "serve_config.yaml"
CRD_NAME = "ray.io_rayservices.yaml"
UPGRADE_TYPES = {"NewCluster", "NewClusterWithIncrementalUpgrade", "None"}  # KubeRay's RayServiceUpgradeType
GPU = "nvidia.com/gpu"


def shared_dir() -> Path | None:
    candidates = [REPO.parent / "shared"]
    if os.environ.get("RTV_SHARED_DIR"):
        candidates.append(Path(os.environ["RTV_SHARED_DIR"]))
    for candidate in candidates:
        if (candidate / "k8s-schemas" / CRD_NAME).is_file():
            return candidate
    return None


# --- the manifest ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    assert len(docs) == 1, "k8s/rayservice.yaml holds exactly one object"
    return docs[0]


@pytest.fixture(scope="module")
def serve_config(manifest) -> dict[str, Any]:
    raw = manifest["spec"]["serveConfigV2"]
    assert isinstance(raw, str), "serveConfigV2 is a YAML string, not a mapping"
    return yaml.safe_load(raw)


@pytest.fixture(scope="module")
def app_entry(serve_config) -> dict[str, Any]:
    (app,) = serve_config["applications"]
    return app


@pytest.fixture(scope="module")
def app_config(app_entry):
    from deployments.config import AppConfig

    return AppConfig.model_validate(app_entry["args"])


def gpu_groups(manifest) -> list[dict[str, Any]]:
    groups = [g for g in manifest["spec"]["rayClusterConfig"].get("workerGroupSpecs", []) if pod_gpus(g)]
    assert groups, "no worker group asks for nvidia.com/gpu"
    return groups


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def pod_gpus(group: dict[str, Any]) -> int:
    return sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in containers(group))


def cpu_quantity(value: str | float) -> float:
    text = str(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


# --- the CRD schema, made as strict as the API server ----------------------------------------

INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def strict(node: Any) -> Any:
    """Walk a structural schema: objects with declared properties reject unknown ones; nullable allows null."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "properties" in node:
        node["properties"] = {name: strict(sub) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = strict(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [strict(sub) for sub in node[key]]
    if node.pop("nullable", False):
        node = {"anyOf": [{"type": "null"}, node]}
    return node


def _list_map_keys(validator, keys, instance, schema):
    from jsonschema import ValidationError

    if not validator.is_type(instance, "array") or schema.get("x-kubernetes-list-type") != "map":
        return
    seen = set()
    for item in instance:
        if isinstance(item, dict):
            key = tuple(repr(item.get(k)) for k in keys)
            if key in seen:
                yield ValidationError(f"duplicate entry for list-map keys {keys}: {item}")
            seen.add(key)


def _list_type(validator, kind, instance, schema):
    from jsonschema import ValidationError

    if kind == "set" and validator.is_type(instance, "array"):
        items = [repr(item) for item in instance]
        if len(items) != len(set(items)):
            yield ValidationError(f"duplicate items in a list-type set: {instance}")


@pytest.fixture(scope="module")
def crd_validator():
    shared = shared_dir()
    if shared is None:
        pytest.skip(
            f"RayService CRD not found: looked for {REPO.parent / 'shared' / 'k8s-schemas' / CRD_NAME} "
            f"and $RTV_SHARED_DIR/k8s-schemas/{CRD_NAME}"
        )
    import jsonschema
    from jsonschema import Draft202012Validator, FormatChecker

    crd = yaml.safe_load((shared / "k8s-schemas" / CRD_NAME).read_text())
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "RayService"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])

    formats = FormatChecker()
    for name, (low, high) in INT_RANGES.items():
        formats.checks(name)(lambda value, low=low, high=high: not isinstance(value, int) or low <= value <= high)
    formats.checks("int-or-string")(lambda value: isinstance(value, (int, str)) and not isinstance(value, bool))
    formats.checks("date-time")(lambda value: not isinstance(value, str) or bool(re.match(r"\d{4}-\d\d-\d\dT", value)))

    Validator = jsonschema.validators.extend(
        Draft202012Validator,
        {"x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _list_type},
    )
    Validator.check_schema(schema)
    return Validator(schema, format_checker=formats)


def errors_of(validator, document) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(document)]


def test_manifest_validates_against_the_rayservice_crd(crd_validator, manifest):
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    assert errors_of(crd_validator, manifest) == []


def _worker(doc):
    return doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]


def _set(path_fn, key, value):
    def mutate(doc):
        path_fn(doc)[key] = value

    return mutate


def _delete(path_fn, key):
    def mutate(doc):
        del path_fn(doc)[key]

    return mutate


def _duplicate_port(doc):
    ports = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    ports.append(dict(ports[-1], name="serve-again"))


BROKEN = {
    "string for an integer": (_set(_worker, "minReplicas", "2"), "minReplicas"),
    "required field missing": (_delete(_worker, "groupName"), "workerGroupSpecs/0"),
    "integer for a string map value": (
        _set(lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"], "num-gpus", 0),
        "rayStartParams/num-gpus",
    ),
    "unknown field (typo)": (_set(lambda d: d["spec"]["rayClusterConfig"], "workerGroupSpec", []), "rayClusterConfig"),
    "below minimum": (_set(lambda d: d["spec"], "rayClusterDeletionDelaySeconds", -1), "rayClusterDeletionDelaySeconds"),
    "int32 overflow": (_set(lambda d: d["spec"], "rayClusterDeletionDelaySeconds", 2**31), "rayClusterDeletionDelaySeconds"),
    "bad quantity": (
        _set(lambda d: containers(_worker(d))[0]["resources"]["limits"], GPU, "four"),
        f"limits/{GPU}",
    ),
    "duplicate list-map key": (_duplicate_port, "ports"),
    "bad enum": (_set(lambda d: d["spec"]["rayClusterConfig"]["autoscalerOptions"], "version", "v3"), "version"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_manifests_are_rejected(crd_validator, manifest, case):
    mutate, where = BROKEN[case]
    broken = copy.deepcopy(manifest)
    mutate(broken)
    errors = errors_of(crd_validator, broken)
    assert errors, f"{case}: the schema accepted a broken manifest"
    assert any(where in error for error in errors), errors


# --- serveConfigV2: Ray's own schema, this app's config ----------------------------------------


def test_serve_config_v2_parses_with_serve_deploy_schema(serve_config):
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(serve_config)
    assert [app.name for app in schema.applications] == ["realtime-video"]
    # request_timeout_s also bounds WebSockets: it must stay unset.
    assert schema.http_options.request_timeout_s is None
    assert schema.http_options.port == 8000 and schema.http_options.host == "0.0.0.0"


def test_laptop_serve_config_parses_and_validates():
    from ray.serve.schema import ServeDeploySchema

    from deployments.config import AppConfig

    config = yaml.safe_load(LAPTOP_CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(config)
    for app in schema.applications:
        AppConfig.model_validate(app.args)


def test_both_configs_carry_the_same_application(serve_config):
    laptop = yaml.safe_load(LAPTOP_CONFIG.read_text())

    def identity(config):
        return [(a["name"], a["import_path"], a.get("route_prefix", "/")) for a in config["applications"]]

    assert identity(serve_config) == identity(laptop)
    assert identity(serve_config)[0][1] == "deployments.app:build_app"


def test_import_path_imports(app_entry):
    module, _, attr = app_entry["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_args_are_the_gpu_config(app_config):
    assert app_config.accelerator == "gpu" and app_config.dtype == "bfloat16"
    assert app_config.build_tiny_models is False
    assert (app_config.height, app_config.width, app_config.fps) == (480, 832, 16)
    assert app_config.tensor_parallel_size == 2
    assert app_config.model.startswith("/") and app_config.understanding_model.startswith("/")
    assert app_config.chat_min_new_tokens is None  # the floor is for random tiny weights only


def test_world_model_placement_is_one_gpu_bundle_per_rank_strict_pack(app_config):
    from deployments.app import world_model_options

    options = world_model_options(app_config, gpus=True)
    bundles = options["placement_group_bundles"]
    gpu_bundles = [b for b in bundles if b.get("GPU")]
    assert len(gpu_bundles) == app_config.tensor_parallel_size
    assert all(b == {"GPU": 1} for b in gpu_bundles)
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["ray_actor_options"]["num_gpus"] == 0  # the GPUs belong to the rank bundles


def test_sessions_outlive_no_drain(manifest, app_config, app_entry):
    """A draining replica, and the old cluster after an upgrade, stay up as long as a session may last."""
    longest = app_config.max_session_seconds
    assert app_config.graceful_shutdown_timeout_s >= longest
    for entry in app_entry.get("deployments", []):
        if "graceful_shutdown_timeout_s" in entry:
            assert entry["graceful_shutdown_timeout_s"] >= longest, entry
    spec = manifest["spec"]
    assert spec.get("upgradeStrategy", {}).get("type", "NewCluster") in UPGRADE_TYPES
    if spec.get("upgradeStrategy", {}).get("type", "NewCluster") == "NewCluster":
        assert spec.get("rayClusterDeletionDelaySeconds", 60) >= longest


@pytest.mark.slow
def test_deployment_overrides_name_real_deployments_and_keep_sessions(app_entry, app_config):
    """Build the app graph (no Ray needed on CPU) and apply the config's per-deployment overrides."""
    from ray.serve._private.build_app import build_app as serve_build

    from deployments.app import build_app

    built = serve_build(build_app(app_config.model_copy(update={"accelerator": "cpu"})), name=app_entry["name"])
    deployments = {d.name: d for d in built.deployments}
    overrides = {entry["name"]: entry for entry in app_entry.get("deployments", [])}
    assert set(overrides) <= set(deployments), f"unknown deployments {set(overrides) - set(deployments)}"
    for name, deployment in deployments.items():
        override = overrides.get(name, {})
        config = deployment._deployment_config
        if "num_replicas" in override:
            assert config.autoscaling_config is None, f"{name}: num_replicas override on an autoscaling deployment"
        graceful = override.get("graceful_shutdown_timeout_s", config.graceful_shutdown_timeout_s)
        assert graceful >= app_config.max_session_seconds, f"{name} drains in {graceful}s: it would cut sessions"


# --- the Ray cluster ---------------------------------------------------------------------------


def test_head_has_no_gpu_and_a_dashboard(manifest):
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    for container in head["template"]["spec"]["containers"]:
        assert GPU not in container.get("resources", {}).get("limits", {})
    ports = {p.get("name"): p["containerPort"] for c in head["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert ports.get("dashboard") == 8265 and ports.get("serve") == 8000


def test_gpu_workers_fit_tensor_parallel_and_the_replicas(manifest, app_config, app_entry):
    tp = app_config.tensor_parallel_size
    groups = gpu_groups(manifest)
    for group in groups:
        spec = group["template"]["spec"]
        assert pod_gpus(group) >= tp, "STRICT_PACK puts a replica's tensor-parallel ranks on one pod"
        for container in containers(group):
            resources = container["resources"]
            if GPU in resources.get("limits", {}):
                assert resources.get("requests", {}).get(GPU) == resources["limits"][GPU]
                assert {"cpu", "memory"} <= set(resources.get("requests", {}))
        assert any(t.get("key") == GPU for t in spec.get("tolerations", [])), "no toleration for GPU taints"
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for c in containers(group) for m in c.get("volumeMounts", [])}
        assert volumes[mounts["/dev/shm"]].get("emptyDir", {}).get("medium") == "Memory"
        model_mounts = [path for path, name in mounts.items() if "persistentVolumeClaim" in volumes.get(name, {})]
        for model in (app_config.model, app_config.understanding_model):
            assert any(Path(model).is_relative_to(path) for path in model_mounts), f"{model} is on no mounted PVC"

    # Place the replicas the manifest asks for on the pods that always exist (minReplicas), first fit.
    overrides = {entry["name"]: entry for entry in app_entry.get("deployments", [])}
    world = overrides.get("WorldModel", {}).get("num_replicas", app_config.num_replicas)
    chat = overrides.get("Understanding", {}).get("num_replicas", app_config.num_understanding_replicas)
    pods = [
        [pod_gpus(g), sum(cpu_quantity(c["resources"]["limits"]["cpu"]) for c in containers(g))]
        for g in groups
        for _ in range(g["minReplicas"])
    ]
    for need_gpus in [tp] * world + [1] * chat:
        pod = next((p for p in pods if p[0] >= need_gpus and p[1] >= app_config.replica_cpus), None)
        assert pod is not None, f"no pod left for a replica needing {need_gpus} GPU(s): {pods}"
        pod[0] -= need_gpus
        pod[1] -= app_config.replica_cpus


def _serve_env_var_names() -> tuple[set[str], set[str]]:
    from ray.serve._private import constants, constants_utils

    text = Path(constants.__file__).read_text()
    read = set(re.findall(r"(?:get_env_\w+|os\.environ\.get|os\.getenv)\(\s*\"(RAY_SERVE_\w+)\"", text))
    return read, set(getattr(constants_utils, "_fully_deprecated_env_vars", {}))


def test_ray_serve_env_vars_are_real(manifest):
    read, deprecated = _serve_env_var_names()
    assert "RAY_SERVE_ENABLE_HA_PROXY" in read  # the scan itself works
    groups = [manifest["spec"]["rayClusterConfig"]["headGroupSpec"], *manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"].startswith("RAY_SERVE_"):
                    assert env["name"] in read, f"{env['name']} is not read by Ray Serve {_ray_version()}"
                    assert env["name"] not in deprecated, f"{env['name']} is deprecated: use the Serve config"


def _ray_version() -> str:
    import ray

    return ray.__version__


def test_image_and_ray_version_agree(manifest):
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == _ray_version()
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {c["image"] for g in groups for c in g["template"]["spec"]["containers"]}
    assert len(images) == 1 and not next(iter(images)).endswith(":latest")
    dockerfile = DOCKERFILE.read_text()
    assert f"ARG RAY_VERSION={_ray_version()}" in dockerfile
    assert re.search(r"rayproject/ray:\$\{RAY_VERSION\}-py311-(gpu|cu\d+)", dockerfile)
    assert "constraints/cpu.txt" not in re.sub(r"#.*", "", dockerfile)
