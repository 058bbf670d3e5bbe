"""An outage as the operator sees it: every replica stops, the gateway answers 503, and
the 503s are in ``prefixgate_requests_total`` where the alert rules look for them.

The alert check replays the very series the running gateway exported (names and
labels as scraped, the request counts measured before and during the outage,
repeated once a minute) through ``promtool test rules`` with the shipped
``alerts.yml``: the error-ratio and no-healthy-replica alerts must fire for the
model, and not before the outage.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import running_gateway
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args
from .test_deploy_ops import PROMETHEUS, promtool, run

Labels = tuple[tuple[str, str], ...]


def scrape(url: str) -> dict[tuple[str, Labels], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def series(samples: dict, name: str) -> dict[Labels, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def selector(name: str, labels: Labels) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def alert_annotations(alert: str, model: str) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for ``model``."""
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    rule = next(r for g in groups for r in g["rules"] if r.get("alert") == alert)
    return {k: v.replace("{{ $labels.model }}", model) for k, v in rule["annotations"].items()}


def test_an_outage_is_counted_and_fires_the_alerts(tmp_path: Path) -> None:
    with running_sims([sim_args(i) for i in range(2)]) as sims, \
            running_gateway(gateway_settings(sims, retry_after_seconds=1)) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
        for _ in range(5):
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        before = scrape(gw.url)
        for sim in sims:
            sim.stop()
        wait_until(lambda: scrape(gw.url)[("prefixgate_healthy_replicas",
                                           (("model", MODEL),))] == 0, timeout=30)
        failures = 0
        for _ in range(6):
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
            assert raised.value.status_code == 503
            assert raised.value.response.json()["error"]["type"] == "ServiceUnavailableError"
            failures += 1
        during = scrape(gw.url)

    old = series(before, "prefixgate_requests_total")
    new = series(during, "prefixgate_requests_total")
    gateway_503 = (("model", MODEL), ("replica", "none"), ("status", "503"))
    assert new[gateway_503] - old.get(gateway_503, 0) == failures
    assert sum(v for labels, v in new.items() if dict(labels)["status"] == "200") == 5

    # Replay: ten minutes of the measured healthy traffic per minute, then ten of the outage.
    inputs = []
    for labels in new:
        healthy = old.get(labels, 0.0)
        outage = new[labels] - healthy
        values = f"0+{healthy:g}x10 {10 * healthy:g}+{outage:g}x10"
        inputs.append({"series": selector("prefixgate_requests_total", labels),
                       "values": values})
    for labels, value in series(during, "prefixgate_healthy_replicas").items():
        inputs.append({"series": selector("prefixgate_healthy_replicas", labels),
                       "values": f"{series(before, 'prefixgate_healthy_replicas')[labels]:g}x10"
                                 f" {value:g}x10"})
    checks: list[dict[str, object]] = []
    for alert in ("PrefixgateErrorRatioHigh", "PrefixgateNoHealthyReplica"):
        checks.append({"eval_time": "9m", "alertname": alert, "exp_alerts": []})
        checks.append({"eval_time": "16m", "alertname": alert, "exp_alerts": [
            {"exp_labels": {"severity": "critical", "model": MODEL},
             "exp_annotations": alert_annotations(alert, MODEL)}]})
    case = {"interval": "1m", "input_series": inputs, "alert_rule_test": checks}
    test_file = tmp_path / "outage_test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(PROMETHEUS / "alerts.yml")], "evaluation_interval": "1m",
        "tests": [case]}))
    run(promtool(), "test", "rules", str(test_file), cwd=tmp_path)
