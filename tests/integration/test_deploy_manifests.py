"""The Kubernetes manifests, checked offline in seconds: rendered, schema-valid, in step
with the gateway's flags and config and with the vLLM launch profiles.

Every overlay is rendered with ``kubectl kustomize`` where kubectl is installed,
else with ``tests/support/kustomize.py`` (and the two must agree where both
run). The result is validated against the Kubernetes schemas bundled in the
``kubernetes-validate`` wheel (strict: an unknown field fails); the Prometheus
Operator's ServiceMonitor and PrometheusRule, which those schemas lack, against a
minimal local schema of the fields we use.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway import serve_cli
from gateway.config import Settings, load_settings
from gateway.kv.profiles import PROFILES, get_profile
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBERNETES_VERSION = "1.30.0"
KUBECTL = shutil.which("kubectl")

Resource = dict[str, Any]


def _generate_module() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kubectl_render(folder: Path) -> list[Resource]:
    assert KUBECTL
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Resource]]:
    make = kubectl_render if KUBECTL else render
    return {name: make(K8S / "overlays" / name) for name in OVERLAYS}


def by_kind(resources: list[Resource], kind: str) -> list[Resource]:
    return [r for r in resources if r["kind"] == kind]


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in by_kind(resources, kind) if r["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def key(resource: Resource) -> tuple[str, str, str]:
    meta = resource["metadata"]
    return resource["kind"], meta.get("namespace", ""), meta["name"]


def test_an_overlay_per_profile() -> None:
    assert OVERLAYS == sorted(p.name for p in PROFILES)


def test_generated_files_are_current() -> None:
    assert _generate_module().stale_files() == [], "run deploy/kubernetes/generate.py"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed: the Python renderer alone")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_python_renderer_agrees_with_kubectl(overlay: str) -> None:
    ours = {key(r): r for r in render(K8S / "overlays" / overlay)}
    theirs = {key(r): r for r in kubectl_render(K8S / "overlays" / overlay)}
    assert sorted(ours) == sorted(theirs)
    assert [k for k in ours if ours[k] != theirs[k]] == []


CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "spec": {
                "type": "object", "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": {"type": "object"},
                    "namespaceSelector": {"type": "object"},
                    "endpoints": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                       "interval": {"type": "string"},
                                       "scheme": {"enum": ["http", "https"]}}}},
                }},
        }},
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "spec": {"type": "object", "required": ["groups"], "additionalProperties": False,
                     "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "required": ["name", "rules"],
                         "additionalProperties": False,
                         "properties": {"name": {"type": "string"},
                                        "interval": {"type": "string"},
                                        "rules": {"type": "array", "minItems": 1, "items": {
                                            "type": "object", "required": ["expr"],
                                            "additionalProperties": False,
                                            "properties": {
                                                "alert": {"type": "string"},
                                                "record": {"type": "string"},
                                                "expr": {"type": "string"},
                                                "for": {"type": "string"},
                                                "keep_firing_for": {"type": "string"},
                                                "labels": {"type": "object"},
                                                "annotations": {"type": "object"}}}}}}}}},
        }},
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_matches_its_schema(rendered: dict[str, list[Resource]],
                                           overlay: str) -> None:
    for resource in rendered[overlay]:
        if resource["kind"] in CRD_SCHEMAS:
            jsonschema.validate(resource, CRD_SCHEMAS[resource["kind"]])
        else:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_can_fail() -> None:
    deployment = one(render(K8S / "overlays" / OVERLAYS[0]), "Deployment", "prefixgate")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_vllm_runs_its_profile(rendered: dict[str, list[Resource]], overlay: str) -> None:
    profile = get_profile(overlay)
    stateful = one(rendered[overlay], "StatefulSet", "vllm-qwen")
    assert stateful["metadata"]["annotations"]["prefixgate.io/profile"] == profile.name
    pod = stateful["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert [*vllm["command"], *vllm["args"]] == profile.command()
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == profile.gpus
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"  # NCCL
    assert profile.model_path.startswith("/models/") and "persistentVolumeClaim" in \
        volumes[mounts["/models"]]
    ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
    service = one(rendered[overlay], "Service", "vllm-qwen")
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS record per ready pod
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    # the gateway discovers exactly these pods, at these ports
    config = gateway_config(rendered[overlay])
    assert len(config.replicas_from) == 1
    source = config.replicas_from[0]
    assert source.dns == service["metadata"]["name"] == stateful["spec"]["serviceName"]
    expected = profile.discovery_source(source.dns)
    assert source.model_dump(include={"dns", "port", "model", "kv_events"}) == expected
    assert (ports["http"], ports["kv-events"], ports["kv-replay"]) == (
        source.port, source.kv_events.port, source.kv_events.replay_port)  # type: ignore[union-attr]
    # a terminating vLLM pod keeps serving until the gateways have drained it
    pause = int(vllm["lifecycle"]["preStop"]["exec"]["command"][1])
    assert source.drain_seconds + settings_interval(config) < pause < \
        pod["terminationGracePeriodSeconds"]


def settings_interval(settings: Settings) -> float:
    """Re-resolve period plus the cluster DNS's cache TTL (CoreDNS: 5 s)."""
    return settings.health_interval + 5


def gateway_container(resources: list[Resource]) -> tuple[Resource, Resource]:
    pod = one(resources, "Deployment", "prefixgate")["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def gateway_config(resources: list[Resource]) -> Settings:
    pod, container = gateway_container(resources)
    args = serve_cli.build_parser().parse_args(container["args"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.config)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = one(resources, "ConfigMap", volume["configMap"]["name"])
    assert config_map["metadata"]["name"] == volume["configMap"]["name"]
    with tempfile.TemporaryDirectory() as folder:  # read as `serve --config` reads it
        path = Path(folder) / mount["subPath"]
        path.write_text(config_map["data"][mount["subPath"]], encoding="utf-8")
        return load_settings(str(path), serve_cli.overrides(args), env={})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_accepts_its_flags_config_and_environment(
        rendered: dict[str, list[Resource]], overlay: str) -> None:
    resources = rendered[overlay]
    pod, container = gateway_container(resources)
    args = serve_cli.build_parser().parse_args(container["args"])  # exits on an unknown flag
    settings = gateway_config(resources)
    assert settings.host == "0.0.0.0"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": settings.port, "probes": settings.health_port}
    # --api-keys names the file the Secret volume mounts
    keys = Path(args.api_keys)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(keys.parent))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert {i["path"] for i in volume["secret"]["items"]} == {keys.name}
    # each PREFIXGATE_* variable is one the settings read
    for env in container["env"]:
        if env["name"].startswith("PREFIXGATE_"):
            sample = {"PREFIXGATE_REDIS_URL": "redis://redis:6379/0",
                      "PREFIXGATE_TENANT_SALT_SECRET": "s3cret",
                      "PREFIXGATE_REPLICA_API_KEY": "k3y"}[env["name"]]
            assert load_settings(env={env["name"]: sample}) != load_settings(env={}), env
    # probes and graceful termination
    probes = {name: (container[name]["httpGet"]["path"], container[name]["httpGet"]["port"])
              for name in ("readinessProbe", "livenessProbe", "startupProbe")}
    # on the probe port: clients holding every client connection cannot fail them
    assert probes == {"readinessProbe": ("/ready", "probes"),
                      "livenessProbe": ("/health", "probes"),
                      "startupProbe": ("/health", "probes")}
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > settings.drain_seconds + pause


def test_redis_url_secret_and_the_in_cluster_redis(rendered: dict[str, list[Resource]]) -> None:
    resources = rendered[OVERLAYS[0]]
    _, container = gateway_container(resources)
    env = {e["name"]: e for e in container["env"]}
    assert env["PREFIXGATE_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redis-url"
    service = one(resources, "Service", "redis")
    assert service["spec"]["ports"][0]["port"] == 6379


def test_the_vllm_pods_and_the_gateway_take_one_optional_replica_key(
        rendered: dict[str, list[Resource]]) -> None:
    """vLLM's --api-key (VLLM_API_KEY) and the key the gateway sends its replicas come
    from one key of the Secret; without it there, neither asks for one."""
    for overlay, resources in rendered.items():
        _, gateway = gateway_container(resources)
        (vllm,) = one(resources, "StatefulSet", "vllm-qwen")["spec"]["template"]["spec"][
            "containers"]
        sent = {e["name"]: e for e in gateway["env"]}["PREFIXGATE_REPLICA_API_KEY"]
        taken = {e["name"]: e for e in vllm["env"]}["VLLM_API_KEY"]
        refs = [e["valueFrom"]["secretKeyRef"] for e in (sent, taken)]
        assert refs[0] == refs[1] == {"name": "prefixgate-secrets", "key": "replica-api-key",
                                      "optional": True}, overlay


def test_scaling_and_disruption(rendered: dict[str, list[Resource]]) -> None:
    resources = rendered[OVERLAYS[0]]
    deployment = one(resources, "Deployment", "prefixgate")
    assert deployment["spec"]["replicas"] >= 2
    labels = deployment["spec"]["selector"]["matchLabels"]
    pdb = one(resources, "PodDisruptionBudget", "prefixgate")
    assert pdb["spec"]["selector"]["matchLabels"] == labels and pdb["spec"]["minAvailable"] >= 1
    hpa = one(resources, "HorizontalPodAutoscaler", "prefixgate")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] >= 2
    service = one(resources, "Service", "prefixgate")
    assert service["spec"]["selector"] == labels
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]  # not the probe port
    monitor = one(resources, "ServiceMonitor", "prefixgate")
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http"}
    assert all(r["metadata"]["namespace"] == "prefixgate" for r in resources)


def test_alerts_and_dashboard_are_the_repositorys(rendered: dict[str, list[Resource]]) -> None:
    resources = rendered[OVERLAYS[0]]
    rule = one(resources, "PrometheusRule", "prefixgate")
    alerts = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == alerts["groups"]
    dashboard = one(resources, "ConfigMap", "prefixgate-dashboard")
    assert dashboard["data"]["prefixgate.json"] == \
        (ROOT / "deploy/grafana/prefixgate.json").read_text(encoding="utf-8")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
