"""The ``prefixgate`` command: one subcommand per job, each with its own ``--help``.

The top level is an ``argparse`` parser whose subcommands (``COMMANDS``) each
hand the rest of the command line to their own module's ``main``, that module
imported only when its command runs: ``prefixgate --help`` lists them one per
line without loading any (``tests/unit/test_cli_imports.py``), and an unknown
one is named in the error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gateway.version import gateway_version


class Command(NamedTuple):
    name: str
    module: str
    """The module whose ``main(argv: list[str]) -> int`` runs the command: imported only
    when the command runs, so ``prefixgate --help`` loads none of them (the gateway's
    web stack, the linter's dictionaries, the tokenizer libraries)."""
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command("serve", "gateway.serve_cli", "run the gateway in front of vLLM replicas"),
    Command("demo", "gateway.demo_cli", "a prefix-cache hit and what breaks it, live"),
    Command("lint", "gateway.lint.cli", "find what in prompt files breaks prefix caching"),
    Command("sim", "engine.sim.cli", "run one simulated vLLM replica (no GPU, no model)"),
    Command("plan", "gateway.kv.plan_cli", "KV-cache capacity per GPU for a model and KV dtype"),
    Command("kv-quality", "gateway.kv.quality_cli", "quality gate for a quantized KV cache"),
    Command("profiles", "gateway.kv.profiles_cli", "named vLLM launch profiles"),
    Command("fit", "gateway.replay.fit_cli", "fit the simulator's latency model to live replicas"),
    Command("replay", "gateway.replay.cli", "replay a recorded trace on N simulated replicas"),
)


def command_main(command: Command) -> Callable[[list[str]], int]:
    """The command's ``main``, its module imported now."""
    entry: Callable[[list[str]], int] = importlib.import_module(command.module).main
    return entry


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixgate",
        description="Prefix-cache-aware OpenAI-compatible gateway for vLLM replicas.",
        epilog="`prefixgate COMMAND --help` describes a command's own options.")
    p.add_argument("-V", "--version", action="version",
                   version=f"prefixgate {gateway_version()}")
    commands = p.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name, _, summary in COMMANDS:
        # The command's own parser reads the rest: this one only names it.
        commands.add_parser(name, help=summary, add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    commands = {command.name: command for command in COMMANDS}
    if argv[0] not in commands and not argv[0].startswith("-"):
        parser.error(f"unknown command {argv[0]!r}; the commands are "
                     f"{', '.join(commands)} (prefixgate --help)")
    try:
        parser.parse_args(argv[:1])  # --help or --version: argparse answers
    except SystemExit as done:
        return int(done.code or 0)
    return int(command_main(commands[argv[0]])(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
