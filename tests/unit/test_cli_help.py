"""``prefixgate --help``, unknown commands, and every flag's help text, as a user reads them."""

from __future__ import annotations

import argparse

import pytest

from engine.sim import cli as sim_cli
from gateway import cli, demo_cli, serve_cli
from gateway.kv import plan_cli as kv_plan_cli
from gateway.kv import profiles_cli
from gateway.kv import quality_cli as kv_quality_cli
from gateway.lint import cli as lint_cli
from gateway.replay import cli as replay_cli
from gateway.replay import fit_cli


def test_help_lists_each_command_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: prefixgate") and "``" not in out  # argparse, not RST
    lines = out.splitlines()
    for name, _, summary in cli.COMMANDS:
        [line] = [line for line in lines if line.split()[:1] == [name]]
        assert line.split(None, 1)[1] == summary  # the whole summary, on that line


def test_an_unknown_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["bogus"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'bogus'" in err and "serve" in err


def test_no_command_prints_the_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "commands:" in capsys.readouterr().err


def _actions(name: str, parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found += _actions(f"{name} {sub}", subparser)
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            found.append((name, action))
    return found


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {"serve": serve_cli.build_parser(), "sim": sim_cli.build_parser(),
               "lint": lint_cli._parser(), "plan": kv_plan_cli._parser(),
               "kv-quality": kv_quality_cli._parser(), "profiles": profiles_cli._parser(),
               "demo": demo_cli._parser(), "fit": fit_cli._parser(),
               "replay": replay_cli._parser()}
    assert set(parsers) == {name for name, _, _ in cli.COMMANDS}
    return parsers


def test_every_flag_of_every_command_says_what_it_does() -> None:
    parsers = _parsers()
    silent = [f"{name} {action.option_strings or action.dest}"
              for name, parser in parsers.items() for name, action in _actions(name, parser)
              if not action.help]
    assert not silent


def test_serve_takes_flags_named_in_full_and_names_the_nearest(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--replicas URL`` (a natural guess) was read as ``--replicas-from URL``: a DNS
    name that resolves to nothing, a gateway with no replica and no word why."""
    with pytest.raises(SystemExit) as stopped:
        serve_cli.build_parser().parse_args(["--replicas", "http://127.0.0.1:8001"])
    assert stopped.value.code == 2
    assert "unrecognized arguments: --replicas" in (err := capsys.readouterr().err)
    assert "did you mean --replica?" in err


def test_no_command_takes_a_flag_by_a_prefix_of_its_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix that names one flag today can name another after a release; each command
    (and each subcommand) takes its flags in full, and says which one was meant."""
    def every(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        subs = [sub for action in parser._actions
                if isinstance(action, argparse._SubParsersAction)
                for sub in action.choices.values()]
        return [parser, *(p for sub in subs for p in every(sub))]

    for name, parser in _parsers().items():
        for each in every(parser):
            assert not each.allow_abbrev, f"{name}: {each.prog}"
    with pytest.raises(SystemExit):
        _parsers()["sim"].parse_args(["--time-scal", "2"])
    assert "did you mean --time-scale?" in capsys.readouterr().err
