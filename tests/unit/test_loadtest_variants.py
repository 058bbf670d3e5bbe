"""A prefixgate contender's ``?`` part: policy options, gateway settings, another tree."""

from __future__ import annotations

from pathlib import Path

from loadtest.contenders import variant_options


def test_plain_keys_are_policy_options_and_at_keys_gateway_settings(tmp_path: Path) -> None:
    options, settings, tree = variant_options(
        f"scorer=threshold&running_request_seconds=0.002&@lint={{enabled: false}}"
        f"&@tree={tmp_path}")
    assert options == {"scorer": "threshold", "running_request_seconds": 0.002}
    assert settings == {"lint": {"enabled": False}}
    assert tree == str(tmp_path.resolve())


def test_an_empty_query_changes_nothing() -> None:
    assert variant_options("") == ({}, {}, None)
