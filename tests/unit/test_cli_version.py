"""``prefixgate --version``: the installed package's version, as pip knows it."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from gateway.cli import main


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_installed_version(flag: str, capsys: pytest.CaptureFixture) -> None:
    assert main([flag]) == 0
    assert capsys.readouterr().out == f"prefixgate {version('prefixgate')}\n"
