"""``prefixgate profiles``: the named vLLM launch profiles (``gateway.kv.profiles``).

    prefixgate profiles [--json]                      the profiles, one a line
    prefixgate profiles show NAME [--json] [--plan CONFIG]

``show`` prints the profile as the ``vllm serve`` command line, as the
``replicas:`` entry of an in-process replica (its ``vllm:`` block) and of a
remote one, and with ``--plan`` the KV capacity ``prefixgate plan`` computes
for it from the model's ``config.json``. Exit status 0, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from engine.cli_args import CommandParser
from gateway.kv.model import ModelShape, PlanError, load_config
from gateway.kv.plan import KvPlan, plan
from gateway.kv.profiles import PROFILES, Profile, UnknownProfile, get_profile


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="prefixgate profiles",
                                description="Named vLLM launch profiles.")
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="action")
    show = sub.add_parser("show", help="one profile as a command line and gateway config")
    show.add_argument("name", help="profile name (see `prefixgate profiles`)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.add_argument("--plan", metavar="CONFIG",
                      help="the model's config.json (or its folder): add the KV capacity")
    return p


def command_text(profile: Profile) -> str:
    """The command line, one flag per line, ready to paste into a shell."""
    words = profile.command()
    lines, current = [], shlex.join(words[:2])
    for word in words[2:]:
        if word.startswith("--"):
            lines.append(current)
            current = word
        else:
            current += " " + shlex.quote(word)
    return " \\\n    ".join([*lines, current])


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip()


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def capacity_line(p: KvPlan) -> str:
    return (f"{p.num_blocks:,} blocks of {p.inputs.block_size} = {p.kv_capacity_tokens:,} "
            f"tokens per replica ({p.kv_bytes_per_token_per_gpu:,} B per token per GPU, "
            f"{p.max_concurrency:.1f} sequences of {p.max_model_len:,} tokens)")


def render(profile: Profile, capacity: KvPlan | None) -> str:
    i = profile.plan_input()
    parts = [
        f"{profile.name}: {profile.summary}",
        (f"  {profile.gpus} GPU(s) of {profile.gpu_memory_gib:g} GiB; weights {profile.hf_repo} "
        f"in {profile.model_path}"),
        "", "vLLM command line:", _indent(command_text(profile)),
        "", "in-process replica (gateway config):",
        _indent(_yaml({"replicas": [profile.inprocess_replica()]})),
        "", "remote replica (gateway config; HOST: the server's address):",
        _indent(_yaml({"replicas": [profile.remote_replica("HOST")]})),
        "", "replicas from DNS (gateway config; NAME: e.g. a headless Service's name):",
        _indent(_yaml({"replicas_from": [profile.discovery_source("NAME")]})),
        "", "capacity:",
        (f"  prefixgate plan CONFIG --tensor-parallel-size {i.tensor_parallel_size} "
        f"--kv-cache-dtype {i.kv_cache_dtype} --weight-dtype {i.weight_dtype} "
        f"--gpu-memory-gb {i.gpu_memory_gib:g} --gpu-memory-utilization "
        f"{i.gpu_memory_utilization} --max-model-len {i.max_model_len}"),
    ]
    if capacity is not None:
        parts.append("  " + capacity_line(capacity))
        parts += [f"  {w.severity.upper()}: {w.message}" for w in capacity.warnings]
    return "\n".join(parts)


def run(argv: Sequence[str], out: TextIO) -> int:
    args = _parser().parse_args(argv)
    if args.action is None:
        if args.json:
            print(json.dumps({"profiles": [p.as_dict() for p in PROFILES]}, indent=2), file=out)
        else:
            width = max(len(p.name) for p in PROFILES)
            for p in PROFILES:
                print(f"{p.name:<{width}}  {p.gpus} GPU(s)  {p.summary}", file=out)
        return 0
    try:
        profile = get_profile(args.name)
        capacity = (plan(ModelShape.from_config(load_config(args.plan)), profile.plan_input())
                    if args.plan else None)
    except (UnknownProfile, PlanError) as exc:
        print(f"prefixgate profiles: {exc}", file=sys.stderr)
        return 2
    if args.json:
        body = profile.as_dict()
        if capacity is not None:
            body["plan"] = capacity.as_dict()
        print(json.dumps(body, indent=2), file=out)
    else:
        print(render(profile, capacity), file=out)
    return 0


def main(argv: Sequence[str]) -> int:
    return run(argv, sys.stdout)
