"""The docs cover every settings key and every metric the code defines.

Settings: the reference page is generated from the settings model at build
time (``docs/hooks/settings_reference.py``), so what can go missing is a
field's description: every field, nested ones included, must have one, and
every ``prefixgate serve`` flag must land on a key of the reference.

Metrics: every series the gateway can export must be named in
``docs/metrics.md``, and every series that page names must exist. What the
gateway exports is read two ways: from the registry of a gateway built by
``create_app`` (fake replicas, client keys on) plus the Redis collector, and
from the metric definitions in the source (``Counter("prefixgate_...")``,
``GaugeMetricFamily("prefixgate_...")``, ...), which also catches a series
whose collector this configuration does not register.

The strict site build itself (broken links, pages left out of the nav) is
``mkdocs build --strict`` in ``scripts/test.sh``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from asgi_lifespan import LifespanManager

from gateway.config import load_settings
from gateway.fleet.metrics import FleetCollector
from gateway.fleet.sync import FleetSync
from gateway.server.app import create_app
from tests.support.api_keys import write_keys

from .fake_replica import FakeReplica

ROOT = Path(__file__).resolve().parents[2]
METRICS_PAGE = ROOT / "docs" / "metrics.md"
METRIC_SOURCES = [ROOT / "gateway", ROOT / "engine"]
NOT_OURS = {ROOT / "engine" / "sim"}
"""The simulator exports vLLM's own ``vllm:*`` series, documented by vLLM."""
CONSTRUCTORS = {
    "Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
    "Info": "info", "CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram", "SummaryMetricFamily": "summary",
    "InfoMetricFamily": "info",
}
SUFFIX = {"counter": "_total", "info": "_info"}
"""What the exposition format appends to a family's name."""


def _settings_reference() -> ModuleType:
    path = ROOT / "docs" / "hooks" / "settings_reference.py"
    spec = importlib.util.spec_from_file_location("settings_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_settings_key_has_a_description() -> None:
    reference = _settings_reference()
    keys = reference.every_key()
    assert len(keys) > 100, "the walk should reach the nested models"
    paths = {key.path for key in keys}
    assert {"limits.piece_memo_bytes", "replicas[].vllm.kv_cache_dtype",
            "replicas_from[].kv_events.replay_port", "breaker.slow.min_ttft"} <= paths
    undescribed = sorted(key.path for key in keys if not key.description.strip())
    assert not undescribed, (
        "settings without a description (add an attribute docstring in gateway/config.py; "
        f"it becomes the settings reference): {undescribed}")
    page = reference.render()
    for path in paths:
        assert f"`{path}`" in page, path


def test_every_serve_flag_lands_on_a_settings_key() -> None:
    from gateway import serve_cli

    reference = _settings_reference()
    paths = {key.path for key in reference.every_key()}
    for action in serve_cli.build_parser()._actions:
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        key = reference.FLAG_KEYS.get(action.dest, action.dest)
        assert key in paths, (f"{action.option_strings[0]} sets {key!r}, which is no settings "
                              "key: tell docs/hooks/settings_reference.py FLAG_KEYS")


def _exposed(name: str, kind: str) -> str:
    return name + SUFFIX.get(kind, "")


def defined_in_source() -> dict[str, str]:
    """Exposition name -> kind, for each metric constructed with a literal name."""
    out: dict[str, str] = {}
    for folder in METRIC_SOURCES:
        for path in folder.rglob("*.py"):
            if any(path.is_relative_to(skip) for skip in NOT_OURS):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                first = node.args[0]
                if (called in CONSTRUCTORS and isinstance(first, ast.Constant)
                        and isinstance(first.value, str) and first.value.startswith("prefixgate_")):
                    kind = CONSTRUCTORS[called]
                    out[_exposed(first.value, kind)] = kind
    return out


async def registered(tmp_path: Path) -> dict[str, str]:
    """Exposition name -> kind, for every family a wired gateway's registry yields."""
    replica = FakeReplica("a")
    keys = write_keys(tmp_path / "keys.yaml", [{"key": "sk-docs-check-1", "tenant": "t"}])
    settings = load_settings(overrides={
        "replicas": [{"id": "a", "url": "http://a", "model": "m"}], "health_interval": 3600.0,
        "policy": "prefix", "api_keys": keys}, env={})
    app = create_app(settings, transport=lambda _: replica.transport())
    out: dict[str, str] = {}
    async with LifespanManager(app):
        state = app.gateway
        # The Redis collector, as create_app registers it with redis_url set (built, never
        # connected: reading its counters needs no Redis).
        fleet = FleetSync("redis://127.0.0.1:1/0", "docs-check:", state.pool, state.decider.policy)
        for family in [*state.metrics.registry.collect(), *FleetCollector(fleet).collect()]:
            out[_exposed(family.name, family.type)] = family.type
    return out


def documented() -> set[str]:
    text = METRICS_PAGE.read_text(encoding="utf-8")
    return set(re.findall(r"\bprefixgate_[a-z0-9_]*[a-z0-9]", text))


async def test_every_metric_is_documented_and_every_documented_one_exists(
        tmp_path: Path) -> None:
    live = await registered(tmp_path)
    static = defined_in_source()
    assert "prefixgate_requests_total" in live and "prefixgate_redis_up" in live
    assert "prefixgate_memo_bytes" in static and "prefixgate_replica_info" in static
    defined = {**static, **live}
    names = documented()
    missing = sorted(set(defined) - names)
    assert not missing, f"metrics not named in docs/metrics.md: {missing}"
    series = set(defined)
    for name, kind in defined.items():
        if kind == "histogram":
            series |= {name + "_bucket", name + "_sum", name + "_count"}
    ghosts = sorted(names - series)
    assert not ghosts, f"docs/metrics.md names series the code does not define: {ghosts}"
