"""Settings: sources, precedence, strictness."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, load_settings


def test_file_env_flags_precedence(tmp_path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("port: 9000\npolicy: round_robin\nreplicas:\n  - url: http://a:8000\n    id: a\n")
    s = load_settings(str(path), overrides={"policy": "least_load"},
                      env={"PREFIXGATE_PORT": "9100"})
    assert (s.port, s.policy) == (9100, "least_load")
    assert s.replica_ids() == ["a"]


def test_env_replicas_and_ids() -> None:
    s = load_settings(env={"PREFIXGATE_REPLICAS": "x=http://h1:1,http://h2:2",
                           "PREFIXGATE_MODEL": "qwen"})
    assert s.replica_ids() == ["x", "r1"]
    assert [r.model for r in s.replicas] == ["qwen", "qwen"]


def test_a_replica_given_as_its_openai_base_url_is_its_server() -> None:
    """``--replica http://host:8000/v1`` (the URL clients are given) probed
    ``/v1/health``, a 404 each time: the replica never joined."""
    s = load_settings(env={"PREFIXGATE_REPLICAS": "a=http://h1:8000/v1,b=http://h2:8000/v1/,"
                                                  "c=https://h3/vllm"})
    assert [r.url for r in s.replicas] == ["http://h1:8000", "http://h2:8000", "https://h3/vllm"]


def test_replicas_written_as_urls_in_the_file_are_replicas(tmp_path) -> None:
    """``replicas: [http://a:8000]``, the flags' form in the file, was "Input should be a
    valid dictionary"."""
    path = tmp_path / "gw.yaml"
    path.write_text("replicas:\n  - http://a:8000\n  - b=http://b:8000/v1\n")
    s = load_settings(str(path), env={})
    assert [(r.id, r.url) for r in s.replicas] == [(None, "http://a:8000"), ("b", "http://b:8000")]
    assert s.replica_ids() == ["r0", "b"]
    path.write_text("replicas: http://a:8000,http://c:8000\n")
    assert [r.url for r in load_settings(str(path), env={}).replicas] == [
        "http://a:8000", "http://c:8000"]


def test_the_replicas_api_key_goes_to_each_replica_without_its_own() -> None:
    s = load_settings(overrides={"replicas": ["http://a:1", {"url": "http://b:2", "api_key": "own"}],
                                 "replicas_from": [{"dns": "vllm.svc"}]},
                      env={"PREFIXGATE_REPLICA_API_KEY": "k"})
    assert [s.replica_key(r) for r in s.replicas] == ["k", "own"]
    assert [s.replica_key(source) for source in s.replicas_from] == ["k"]


@pytest.mark.parametrize("text,needle", [
    ("prot: 1\n", "prot: unknown key"),
    ("replicas:\n  - url: ftp://x\n", "replicas.0.url"),
    # a traceback from the app's start-up before: the url is said to be wrong instead
    ("replicas: 'http://a:1 http://b:2'\n", "holds a space: one url each"),
    ("replicas:\n  - url: http://a:port\n", "is not a url"),
    ("replicas:\n  - url: 'http://:8000'\n", "names no host"),
    ("timeouts:\n  conect: 1\n", "timeouts.conect: unknown key"),
    ("port: -1\n", "port"),
    ("- a\n", "mapping"),
    ("server:\n  header_timout: 1\n", "server.header_timout: unknown key"),
    ("breaker:\n  slow:\n    factor: 0.5\n", "breaker.slow.factor"),
    ("drain_seconds: -1\n", "drain_seconds"),
])
def test_bad_config_names_the_key(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), env={})
    assert needle in str(info.value)


def test_duplicate_replica_ids_rejected() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        load_settings(overrides={"replicas": [{"url": "http://a", "id": "x"},
                                              {"url": "http://b", "id": "x"}]}, env={})


def test_the_default_policy_is_precise_where_every_replica_publishes_kv_events() -> None:
    events = {"endpoint": "tcp://127.0.0.1:5557"}
    both = load_settings(overrides={"replicas": [
        {"url": "http://a:8000", "kv_events": events},
        {"url": "http://b:8000", "kv_events": events}]}, env={})
    one = load_settings(overrides={"replicas": [
        {"url": "http://a:8000", "kv_events": events}, {"url": "http://b:8000"}]}, env={})
    named = load_settings(overrides={"policy": "prefix", "replicas": [
        {"url": "http://a:8000", "kv_events": events}]}, env={})
    assert both.policy == "auto" and both.policy_name() == "precise"
    assert one.policy_name() == "prefix"  # one replica's cache would be invisible
    assert named.policy_name() == "prefix"
