"""``prefixgate --help`` loads no subcommand: the web stack, the tokenizer libraries and the
linter's dictionaries are imported only by the command that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

from gateway import cli

HEAVY = ("transformers", "tokenizers", "huggingface_hub", "jinja2", "fastapi", "starlette",
         "uvicorn", "pydantic", "httpx", "aiohttp", "redis", "zmq", "prometheus_client",
         "jieba", "fugashi", "faker", "numpy", "torch", "vllm", "yaml")
"""Third-party packages no subcommand's listing needs."""
OURS = ("gateway.server", "gateway.request", "gateway.prompt", "gateway.lint", "gateway.kv",
        "gateway.replicas", "gateway.config", "engine", "policies")
"""Our own packages behind the subcommands."""

PROBE = """
import json, sys
from gateway import cli
cli._parser().format_help()
try:
    cli.main(["--help"])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by_help() -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, timeout=60)
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


def test_help_imports_no_subcommand() -> None:
    modules = _loaded_by_help()
    heavy = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
    ours = sorted(m for m in modules if m.startswith(OURS))
    assert not heavy and not ours, (
        f"`prefixgate --help` imported {heavy + ours}: gateway/cli.py must name each command's "
        "module (COMMANDS) and import it only when that command runs")


def test_each_command_names_a_module_with_a_main() -> None:
    for command in cli.COMMANDS:
        assert callable(cli.command_main(command)), command.module
