"""``--replicas KIND:N`` for ``python -m loadtest compare``: parsing, the vLLM-on-CPU
fleet's settings, the adapter contenders see, and the checked cache reset (a
fake replica over ``httpx.MockTransport``; no engine is started)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from engine.vllm.local import ReplicaInfo
from loadtest.cli import parser
from loadtest.compare import build_fleet
from loadtest.fleet import ReplicaChoice, SimFleet, parse_replicas
from loadtest.vllm_fleet import VllmCpuFleet, contender_replica, reset_verified


def test_parse_replicas_reads_kind_and_count() -> None:
    assert parse_replicas("vllm-cpu:2") == ReplicaChoice("vllm-cpu", 2)
    assert parse_replicas("sim:4") == ReplicaChoice("sim", 4)


@pytest.mark.parametrize("text", ["vllm-cpu", "vllm-cpu:", "vllm-cpu:0", "vllm-cpu:two",
                                  "gpu:2", "sim:-1", ":2"])
def test_parse_replicas_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="sim:N or vllm-cpu:N"):
        parse_replicas(text)


def _compare_args(*extra: str) -> list[str]:
    return ["compare", "--workload", "shared-prefix", "--out", "x", *extra]


def test_vllm_cpu_fleet_from_the_command_line(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PREFIXGATE_CACHE", str(tmp_path))
    args = parser().parse_args(_compare_args(
        "--replicas", "vllm-cpu:2", "--vllm-model", "qwen2-tiny", "--vllm-blocks", "200",
        "--replica-args", "--max-num-seqs 8"))
    fleet = build_fleet(args)
    assert fleet == VllmCpuFleet(count=2, model="qwen2-tiny", num_blocks=200,
                                 extra_args=("--max-num-seqs", "8"))
    assert fleet.capacity_blocks() == 400  # what the ideal bound replays with
    assert fleet.block_size == 32
    assert fleet.tokenizer_path() == str(tmp_path / "models" / "qwen2-tiny")
    spec = fleet.replica_spec()
    assert spec.num_gpu_blocks_override == 200
    assert spec.kv_events and spec.kv_topic == "kv"
    assert ("VLLM_SERVER_DEV_MODE", "1") in spec.extra_env
    assert spec.max_model_len == 4096
    spec.check()


def test_vllm_cpu_context_shrinks_to_fit_small_caches() -> None:
    spec = VllmCpuFleet(count=2, num_blocks=40).replica_spec()
    assert spec.max_model_len == 39 * 32  # vLLM keeps one block back
    spec.check()


def test_vllm_cpu_defaults_and_unknown_model() -> None:
    fleet = build_fleet(parser().parse_args(_compare_args("--replicas", "vllm-cpu:2")))
    assert fleet == VllmCpuFleet(count=2, model="qwen2-small", num_blocks=320)
    with pytest.raises(SystemExit):
        parser().parse_args(_compare_args("--replicas", "vllm-cpu:2", "--vllm-model", "gpt-9"))


def test_sim_fleet_is_unchanged() -> None:
    fleet = build_fleet(parser().parse_args(_compare_args(
        "--replicas", "sim:4", "--replica-args", "--num-blocks 768 --time-scale 1")))
    assert isinstance(fleet, SimFleet)
    assert fleet.spec.count == 4 and fleet.capacity_blocks() == 4 * 768
    assert fleet.label() == "4 sims"


def _info(topic: str = "kv") -> ReplicaInfo:
    return ReplicaInfo(replica_id="r1", model="qwen2-small", base_url="http://replica",
                       kv_events_endpoint="tcp://127.0.0.1:21001",
                       kv_replay_endpoint="tcp://127.0.0.1:21002", kv_topic=topic,
                       block_size=32, core=1, pid=1, log_path=Path("r1.log"))


def test_contender_replica_carries_the_kv_ports() -> None:
    replica = contender_replica(_info(), num_blocks=320)
    assert (replica.id, replica.url, replica.block_size, replica.num_blocks) == (
        "r1", "http://replica", 32, 320)
    assert (replica.kv_events_port, replica.kv_replay_port) == (21001, 21002)
    with pytest.raises(ValueError, match="topic"):
        contender_replica(_info(topic="other"), num_blocks=320)


class FakeReplica:
    """A prefix cache of whole prompts, counted the way vLLM's /metrics counts them."""

    def __init__(self, reset_empties: bool = True, refusals: int = 0) -> None:
        self.cached: set[str] = set()
        self.hits = self.queries = 0
        self.reset_empties = reset_empties
        self.refusals = refusals
        self.resets = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=f"vllm:prefix_cache_hits_total {self.hits}\n"
                                            f"vllm:prefix_cache_queries_total {self.queries}\n")
        if request.url.path == "/reset_prefix_cache":
            self.resets += 1
            if self.refusals:
                self.refusals -= 1
                return httpx.Response(200, json={"success": False})
            if self.reset_empties:
                self.cached.clear()
            return httpx.Response(200, json={"success": True})
        prompt = json.loads(request.content)["prompt"]
        tokens = len(prompt.split())
        self.queries += tokens
        self.hits += 128 if prompt in self.cached else 0
        self.cached.add(prompt)
        return httpx.Response(200, json={"choices": [{"text": "x"}]})


def _client(replica: FakeReplica) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(replica.handle))


def test_reset_verified_leaves_an_empty_cache() -> None:
    replica = FakeReplica()
    assert reset_verified(_client(replica), _info())
    assert replica.cached == set()


def test_reset_that_keeps_the_cache_is_caught() -> None:
    replica = FakeReplica(reset_empties=False)
    assert not reset_verified(_client(replica), _info())


def test_refused_reset_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loadtest.vllm_fleet.RESET_RETRY_SECONDS", 0.0)
    replica = FakeReplica(refusals=2)
    assert reset_verified(_client(replica), _info())
    assert replica.resets == 4 and replica.cached == set()
