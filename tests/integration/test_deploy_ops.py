"""The shipped Grafana dashboard and Prometheus rules fit the gateway that runs.

Every series a panel, a template variable or a rule names must be one the
running gateway exports (a histogram's ``_bucket/_sum/_count``, a counter's
``_total``), with labels it really carries; the rules and every panel query
must be valid PromQL (``promtool``, installed by ``scripts/setup-browser.sh``),
and the alert unit tests (``alerts_test.yml``) must pass.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import GatewayProcess

from .conftest import MODEL

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
GRAFANA = DEPLOY / "grafana" / "prefixgate.json"
PROMETHEUS = DEPLOY / "prometheus"
# A series name of ours, not part of a recording rule's level:metric:ops name.
SERIES = re.compile(r"(?<![\w:])(prefixgate_\w+)(?![\w:])")
SELECTOR = re.compile(r"(?<![\w:])(prefixgate_\w+)\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
RECORDED = re.compile(r"\b(\w+:\w+:\w+)\b")
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$replica": ".*",
                     "$model": ".*"}


def exported(gateway: GatewayProcess) -> tuple[set[str], dict[str, set[str]]]:
    """Series names the gateway exports, and the labels seen on each."""
    text = httpx.get(gateway.url + "/metrics").text
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "info": ("_info",),
                "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("_sum", "_count", "_created")}
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        for sample in family.samples:
            names.add(sample.name)
            labels.setdefault(sample.name, set()).update(sample.labels)
    return names, labels


@pytest.fixture(scope="module")
def gateway_series(gateway: GatewayProcess) -> tuple[set[str], dict[str, set[str]]]:
    # One streamed answer, so the histograms carry samples (and their labels).
    body = {"model": MODEL, "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello"}]}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        response.read()
    return exported(gateway)


def grafana_queries() -> list[str]:
    board = json.loads(GRAFANA.read_text())
    queries = []
    for panel in board["panels"]:
        queries += [t["expr"] for t in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def check_names(expr: str, names: set[str], labels: dict[str, set[str]]) -> list[str]:
    problems = [f"{name} is not exported" for name in SERIES.findall(expr) if name not in names]
    for name, matchers in SELECTOR.findall(expr):
        seen = labels.get(name)
        if seen is None:
            continue  # no sample yet (e.g. lint counters): the name check above holds
        problems += [f"{name} has no label {label!r}"
                     for label in MATCHER_LABEL.findall(matchers) if label not in seen]
    return problems


def test_grafana_dashboard_is_importable_json() -> None:
    board = json.loads(GRAFANA.read_text())
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 36
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + \
            panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()
    titles = " | ".join(p["title"] for p in board["panels"]).lower()
    for topic in ("predicted", "actual", "ttft", "tpot", "running", "kv cache", "health",
                  "status", "reason", "failover", "overhead", "lint", "drift"):
        assert topic in titles, f"no panel about {topic}"


def test_every_grafana_query_names_exported_series(gateway_series) -> None:
    names, labels = gateway_series
    problems = []
    for expr in grafana_queries():
        problems += [f"{p}  <- {expr}" for p in check_names(expr, names, labels)]
    assert not problems, "\n".join(problems)


def test_every_rule_names_exported_series_or_a_recorded_one(gateway_series) -> None:
    names, labels = gateway_series
    rules = alert_rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    problems = []
    for rule in rules:
        problems += check_names(rule["expr"], names, labels)
        problems += [f"{name} is not recorded" for name in RECORDED.findall(rule["expr"])
                     if name not in recorded]
    assert not problems, "\n".join(problems)
    alerts = {rule["alert"]: rule for rule in rules if "alert" in rule}
    assert {"PrefixgateTTFTHigh", "PrefixgateHitRateCollapsed", "PrefixgateKVCacheFull",
            "PrefixgateReplicaDown", "PrefixgateRoutingIndexStale"} <= set(alerts)
    for alert in alerts.values():
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert alert["annotations"]["summary"]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is missing: run scripts/setup-browser.sh (Debian package prometheus)")
    return path


def run(*args: str, cwd: Path) -> None:
    done = subprocess.run(args, check=False, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_config_and_alert_unit_tests_pass_promtool() -> None:
    tool = promtool()
    run(tool, "check", "rules", "alerts.yml", cwd=PROMETHEUS)
    run(tool, "check", "config", "prometheus.yml", cwd=PROMETHEUS)
    run(tool, "test", "rules", "alerts_test.yml", cwd=PROMETHEUS)


def test_every_grafana_query_is_valid_promql(tmp_path: Path) -> None:
    tool = promtool()
    rules = []
    for i, expr in enumerate(grafana_queries()):
        if expr.startswith("label_values("):
            expr = expr[len("label_values("):].rsplit(",", 1)[0]
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"grafana:query_{i}:check", "expr": expr})
    (tmp_path / "queries.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    run(tool, "check", "rules", "queries.yml", cwd=tmp_path)
