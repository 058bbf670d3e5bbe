"""The what-ifs a check asks, each as a real run and as a replay of the base recording.

* ``base``: the workload as recorded; its replay on two simulated replicas
  with the fitted model is the accuracy check itself;
* ``rate-2x``: the same requests at twice the pace. Real: the workload built
  again with its ``rate`` (Poisson arrivals, the same seed: every arrival time
  exactly halves) or ``time_scale`` (a trace) doubled. Replay: the base
  recording with ``--speed 2``;
* ``kv-half``: half the KV blocks per replica. Real: the replicas started
  with half of ``--num-gpu-blocks-override``. Replay: the base recording with
  ``--blocks`` half of what the fit read from the replicas.

A diagnostic replay rides along: ``recorded``, the base recording with
``--policy recorded`` (every request on the replica that served it), so a
difference between the base replay and the real run can be told apart into
the latency model's part and the routing's part. And a real run with no
replay of its own: ``repeat``, the base workload run again, whose difference
from the base run is the noise floor of a real comparison on this machine
(the replay of the base is its prediction too).

The replays run in this process through ``prefixgate replay``'s own entry
point with the arguments a user would type (:func:`replay_argv`).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.replay.cli import run as replay_run
from loadtest.workloads.base import Workload
from loadtest.workloads.registry import build_workload


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    speed: float = 1.0
    blocks_factor: float = 1.0
    policy: str | None = None
    """Replay only: a policy other than the recorded one (``recorded``: diagnostic)."""
    real: bool = True
    """Whether a real run of it is made (the diagnostic has none)."""
    replayed: bool = True
    """Whether it has a replay of its own (``repeat`` is predicted by the base's)."""

    def blocks(self, base_blocks: int) -> int:
        return max(2, round(base_blocks * self.blocks_factor))


SCENARIOS = (
    Scenario("base", "as recorded"),
    Scenario("rate-2x", "2x the request rate", speed=2.0),
    Scenario("kv-half", "half the KV blocks", blocks_factor=0.5),
)
RECORDED_ROUTING = Scenario("recorded", "as recorded, each request on its recorded replica",
                            policy="recorded", real=False)
REPEAT = Scenario("repeat", "the base workload run again: the noise floor", replayed=False)
WHAT_IFS = tuple(s for s in SCENARIOS if s.name != "base")


def scenario_workload(name: str, overrides: dict[str, Any], scenario: Scenario) -> Workload:
    """The workload of ``scenario``'s real run: the base one, faster by ``speed``."""
    if scenario.speed == 1.0:
        return build_workload(name, overrides)
    changed = dict(overrides)
    base = build_workload(name, overrides)
    if "rate" in base.params:
        if not base.params.get("rate"):
            raise ValueError(f"{name}: a rate what-if needs open-loop arrivals (--rate)")
        changed["rate"] = base.params["rate"] * scenario.speed
    elif "time_scale" in base.params:
        changed["time_scale"] = base.params["time_scale"] * scenario.speed
    else:
        raise ValueError(f"workload {name} has no rate or time_scale to speed up")
    return build_workload(name, changed)


def replay_argv(trace: str | Path, model_file: str | Path, scenario: Scenario,
                base_blocks: int, out: str | Path, replicas: int = 2) -> list[str]:
    argv = ["prefixgate", "replay", os.fspath(trace), "--latency-model", os.fspath(model_file),
            "--replicas", str(replicas)]
    if scenario.speed != 1.0:
        argv += ["--speed", f"{scenario.speed:g}"]
    if scenario.blocks_factor != 1.0:
        argv += ["--blocks", str(scenario.blocks(base_blocks))]
    if scenario.policy:
        argv += ["--policy", scenario.policy]
    return argv + ["--json", "--out", os.fspath(out), "--no-progress"]


class ReplayFailed(RuntimeError):
    pass


def run_replay(argv: list[str]) -> dict[str, Any]:
    """``prefixgate replay`` in this process; its JSON document."""
    out, err = io.StringIO(), io.StringIO()
    code = replay_run(argv[2:], out, err)
    if code not in (0, 1):
        raise ReplayFailed(f"{' '.join(argv)}: exit {code}: {err.getvalue().strip()}")
    document: dict[str, Any] = json.loads(out.getvalue())
    return document
