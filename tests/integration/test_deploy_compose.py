"""The compose deployment and the gateway's Dockerfile, checked without a container runtime:
the files they reference exist, their commands parse with the gateway's own parser, and the
vLLM services run their launch profile."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import serve_cli
from gateway.config import Settings, load_settings
from gateway.kv.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
SERVICE_KEYS = {"image", "build", "command", "entrypoint", "environment", "volumes", "ports",
                "depends_on", "restart", "healthcheck", "labels", "deploy", "shm_size", "ipc",
                "stop_grace_period"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text(encoding="utf-8"))


def binds(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each relative bind mount."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = (COMPOSE_DIR / source).resolve()
    return out


def test_compose_structure_and_referenced_files(compose: dict[str, Any]) -> None:
    assert set(compose) - {"name", "services", "volumes", "networks"} <= \
        {k for k in compose if k.startswith("x-")}
    for name, service in compose["services"].items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        for target, source in binds(service).items():
            assert source.is_file(), f"{name}: {source} (for {target}) missing"
        for other in service.get("depends_on", []):
            assert other in compose["services"]
    build = compose["services"]["gateway"]["build"]
    assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def vllm_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "prefixgate.io/profile" in
            s.get("labels", {})}


def test_vllm_services_run_their_profile_on_their_own_gpus(compose: dict[str, Any]) -> None:
    services = vllm_services(compose)
    assert len(services) == 2
    gpus: list[str] = []
    for service in services.values():
        profile = get_profile(service["labels"]["prefixgate.io/profile"])
        assert [*service["entrypoint"], *service["command"]] == profile.command()
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert sum(len(d["device_ids"]) for d in devices) == profile.gpus
        gpus += [g for d in devices for g in d["device_ids"]]
        assert service["shm_size"] and any(v.endswith(":/models:ro") for v in service["volumes"])
    assert len(gpus) == len(set(gpus)), "two replicas share a GPU"


def gateway_settings(compose: dict[str, Any]) -> tuple[Settings, Any]:
    gateway = compose["services"]["gateway"]
    args = serve_cli.build_parser().parse_args(gateway["command"])  # exits on an unknown flag
    config = binds(gateway)[args.config]
    env = {k: str(v) for k, v in gateway["environment"].items()}
    return load_settings(str(config), serve_cli.overrides(args), env=env), gateway


def test_gateway_config_points_at_the_vllm_services(compose: dict[str, Any]) -> None:
    settings, gateway = gateway_settings(compose)
    services = vllm_services(compose)
    expected = [get_profile(s["labels"]["prefixgate.io/profile"]).remote_replica(name, name)
                for name, s in services.items()]
    got = [r.model_dump(include={"id", "url", "model", "kv_events"}) for r in settings.replicas]
    assert got == expected
    assert settings.policy_name() == "precise"
    assert settings.host == "0.0.0.0"
    assert [p.split(":")[-1] for p in gateway["ports"]] == [str(settings.port)]
    # the healthcheck asks the probe port, which the clients' connections cannot fill
    assert f"localhost:{settings.health_port}/health" in " ".join(gateway["healthcheck"]["test"])
    # every PREFIXGATE_* variable is one the settings read
    for name, value in gateway["environment"].items():
        if name.startswith("PREFIXGATE_"):
            assert load_settings(env={name: str(value)}) != load_settings(env={}), name
    assert settings.redis_url == "redis://redis:6379/0"
    grace = int(gateway["stop_grace_period"].removesuffix("s"))
    assert grace > settings.drain_seconds


def test_prometheus_and_grafana_use_the_repositorys_files(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = binds(prometheus)
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    for rule_file in config["rule_files"]:
        assert mounts[f"/etc/prometheus/{rule_file}"] == ROOT / "deploy/prometheus/alerts.yml"
    targets = {t for job in config["scrape_configs"] for c in job["static_configs"]
               for t in c["targets"]}
    settings, _ = gateway_settings(compose)
    assert targets == {f"gateway:{settings.port}"} | {f"{n}:8000" for n in vllm_services(compose)}
    grafana = binds(compose["services"]["grafana"])
    dashboards = [p for t, p in grafana.items() if t.startswith("/var/lib/grafana/dashboards/")]
    assert dashboards == [ROOT / "deploy/grafana/prefixgate.json"]
    json.loads(dashboards[0].read_text(encoding="utf-8"))
    sources = yaml.safe_load(next(p for t, p in grafana.items() if "datasources" in t).read_text())
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"


# -- Dockerfile ------------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/"))
               or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_dockerfile_copies_what_exists_and_runs_prefixgate_serve_unprivileged() -> None:
    steps = instructions(ROOT / "Dockerfile")
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    stages = [rest.split(" AS ")[-1] for word, rest in steps if word == "FROM" and " AS " in rest]
    copied: set[str] = set()
    for word, rest in steps:
        if word != "COPY":
            continue
        words = shlex.split(rest)
        if words[0].startswith("--from="):
            assert words[0].removeprefix("--from=") in stages
            continue
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: missing"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
            copied.add(source)
    # every package the distribution installs is in the build context
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for pattern in find["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied, pattern
    for required in ("pyproject.toml", "setup.py", "policies/_blocktable.c"):
        assert not ignored(required, patterns)
    final = [w for w in steps if w[0] == "FROM"][-1]
    tail = steps[steps.index(final):]
    user = [rest for word, rest in tail if word == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    entrypoint = json.loads(next(rest for word, rest in tail if word == "ENTRYPOINT"))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["prefixgate", "serve"] and scripts["prefixgate"] == "gateway.cli:main"
    cmd = json.loads(next(rest for word, rest in tail if word == "CMD"))
    assert serve_cli.build_parser().parse_args(cmd).host == "0.0.0.0"
    exposed = next(rest for word, rest in tail if word == "EXPOSE")
    assert exposed == str(Settings().port)
