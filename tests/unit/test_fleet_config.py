"""Shared routing state's settings: file, environment and flags."""

from __future__ import annotations

import pytest

from gateway import serve_cli
from gateway.config import ConfigError, load_settings


def test_redis_is_off_unless_asked_for() -> None:
    settings = load_settings(env={})
    assert settings.redis_url is None and settings.redis_key_prefix == "prefixgate:"


def test_the_environment_and_the_flags_set_it_flags_winning() -> None:
    env = {"PREFIXGATE_REDIS_URL": "rediss://:pw@cache:6380/1",
           "PREFIXGATE_REDIS_KEY_PREFIX": "team-a:"}
    assert load_settings(env=env).redis_url == "rediss://:pw@cache:6380/1"
    args = serve_cli.build_parser().parse_args(["--redis-url", "redis://127.0.0.1:6379/0",
                                       "--redis-key-prefix", "team-b:"])
    settings = load_settings(overrides=serve_cli.overrides(args), env=env)
    assert (settings.redis_url, settings.redis_key_prefix) == ("redis://127.0.0.1:6379/0",
                                                               "team-b:")


@pytest.mark.parametrize("overrides", [{"redis_url": "http://cache:6379"},
                                       {"redis_url": "redis://x", "redis_key_prefix": ""}])
def test_a_wrong_redis_setting_is_an_error_naming_it(overrides: dict) -> None:
    with pytest.raises(ConfigError, match="redis_"):
        load_settings(overrides=overrides, env={})
