"""Every launch profile's ``vllm serve`` arguments, parsed by vLLM 0.32's own parser.

The profiles (``gateway.kv.profiles``) are what the Kubernetes and compose files
run; a flag vLLM does not know, a value outside its choices (the INT8 KV cache
is ``int8_per_token_head``, there is no plain ``int8``) or a malformed
``--kv-events-config`` would only show on a GPU node at start-up. Here vLLM's
``serve`` subcommand parser (with its validation) and ``AsyncEngineArgs``
read them in the vLLM-on-CPU venv, no GPU and no weights needed.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from gateway.kv.profiles import PROFILES

from .conftest import setup_or_skip

pytestmark = pytest.mark.e2e

PARSE = r"""
import json, sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm")
command = ServeSubcommand()
command.subparser_init(parser.add_subparsers(dest="subcommand"))
out = {}
for name, argv in json.loads(sys.stdin.read()).items():
    args = parser.parse_args(["serve", *argv])
    command.validate(args)
    if args.model_tag is not None:  # what ServeSubcommand.cmd does first
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    kv = engine.kv_events_config
    out[name] = {
        "model": engine.model, "served_model_name": engine.served_model_name,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "max_model_len": engine.max_model_len,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "kv_cache_dtype": engine.kv_cache_dtype, "quantization": engine.quantization,
        "enable_prompt_tokens_details": args.enable_prompt_tokens_details,
        "host": args.host, "port": args.port,
        "kv_events": {"enable_kv_cache_events": kv.enable_kv_cache_events,
                      "publisher": kv.publisher, "endpoint": kv.endpoint,
                      "replay_endpoint": kv.replay_endpoint, "topic": kv.topic},
    }
print(json.dumps(out))
"""


def test_vllm_parses_every_profile() -> None:
    setup = setup_or_skip()
    argv = {p.name: p.serve_args() for p in PROFILES}
    done = subprocess.run([str(setup.python), "-c", PARSE], input=json.dumps(argv),
                          capture_output=True, text=True, timeout=300, check=False,
                          env={"VLLM_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    for profile in PROFILES:
        got = parsed[profile.name]
        assert got == {
            "model": profile.model_path, "served_model_name": [profile.served_model_name],
            "tensor_parallel_size": profile.tensor_parallel_size,
            "gpu_memory_utilization": profile.gpu_memory_utilization,
            "max_model_len": profile.max_model_len, "enable_prefix_caching": True,
            "kv_cache_dtype": profile.kv_cache_dtype or "auto",
            "quantization": profile.quantization, "enable_prompt_tokens_details": True,
            "host": "0.0.0.0", "port": 8000, "kv_events": profile.kv_events_config(),
        }, profile.name
