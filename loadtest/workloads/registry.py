"""Workload names, their typed parameters, and the command-line flags for them.

Each workload is a builder taking one frozen parameter dataclass. The flags
are derived from the dataclasses' fields (``system_len`` -> ``--system-len``)
so a new parameter needs no CLI code; a flag given for a workload that has no
such parameter is an error naming the flag, never silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loadtest.workloads import (
    agent,
    burst,
    flattened,
    mooncake,
    multi_turn,
    rag,
    shared_prefix,
    shared_prefix_completions,
)
from loadtest.workloads.base import Workload


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    params_type: type
    build: Callable[[Any], Workload]
    summary: str


def workload_specs() -> dict[str, WorkloadSpec]:
    specs = [
        WorkloadSpec("shared-prefix", shared_prefix.SharedPrefixParams, shared_prefix.build,
                     "G apps x P questions behind long per-app system prompts"),
        WorkloadSpec("multi-turn", multi_turn.MultiTurnParams, multi_turn.build,
                     "users whose growing history is the next turn's prefix"),
        WorkloadSpec("mooncake", mooncake.MooncakeParams, mooncake.build,
                     "replay of a Mooncake-format trace (hash_ids -> fixed text blocks)"),
        WorkloadSpec("dynamic-prefix", shared_prefix.SharedPrefixParams,
                     shared_prefix.build_dynamic,
                     "shared-prefix with the current time at the start of the system prompt"),
        WorkloadSpec("shared-prefix-completions", shared_prefix.SharedPrefixParams,
                     shared_prefix_completions.build,
                     "shared-prefix sent to /v1/completions as text prompts"),
        WorkloadSpec("rag", rag.RagParams, rag.build,
                     "long shared documents, each request one message: document + question"),
        WorkloadSpec("flattened", flattened.FlattenedParams, flattened.build,
                     "conversations sent as ONE user message that grows each turn"),
        WorkloadSpec("agent", agent.AgentParams, agent.build,
                     "tool-call loops: system + tools, scripted tool calls, ending on results"),
        WorkloadSpec("burst", burst.BurstParams, burst.build,
                     "N requests at once behind new shared prefixes (vllm bench serve's default)"),
    ]
    return {spec.name: spec for spec in specs}


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _field_type(annotation: Any) -> type:
    text = str(annotation)
    for name, kind in (("float", float), ("int", int), ("str", str)):
        if text.startswith(name):
            return kind
    raise TypeError(f"unsupported parameter annotation {annotation!r}")


def add_workload_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--workload NAME`` and one flag per parameter of any workload."""
    specs = workload_specs()
    parser.add_argument("--workload", required=required, choices=sorted(specs))
    group = parser.add_argument_group("workload parameters (defaults depend on the workload)")
    seen: dict[str, type] = {}
    for spec in specs.values():
        for field in dataclasses.fields(spec.params_type):
            kind = _field_type(field.type)
            if field.name in seen:
                if seen[field.name] is not kind:
                    raise TypeError(f"parameter {field.name} has two types")
                continue
            seen[field.name] = kind
            group.add_argument(_flag(field.name), dest=f"wl_{field.name}", type=kind,
                               default=argparse.SUPPRESS, metavar=kind.__name__.upper())


def workload_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The workload flags actually given on the command line."""
    return {key[3:]: value for key, value in vars(args).items() if key.startswith("wl_")}


def build_workload(name: str, overrides: Mapping[str, Any]) -> Workload:
    specs = workload_specs()
    if name not in specs:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(sorted(specs))}")
    spec = specs[name]
    fields = {f.name for f in dataclasses.fields(spec.params_type)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"workload {name} has no parameter(s) {', '.join(_flag(u) for u in unknown)}"
        )
    return spec.build(spec.params_type(**overrides))
