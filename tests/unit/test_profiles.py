"""The vLLM launch profiles: the flags the guide names, and config the gateway accepts."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

import pytest

from gateway.cli import main as cli_main
from gateway.config import ReplicaSettings, Settings
from gateway.kv.model import ModelShape
from gateway.kv.plan import plan, resolve_kv_dtype
from gateway.kv.plan_cli import run as plan_run
from gateway.kv.profiles import KV_EVENTS_PORT, KV_REPLAY_PORT, PROFILES, get_profile
from gateway.kv.profiles_cli import run
from gateway.replicas.inprocess import engine_args
from tests.unit.test_kv_plan import QWEN25_72B


def flags(args: list[str]) -> dict[str, str | bool]:
    """``--name value`` / ``--switch`` pairs of a vLLM argument list."""
    out: dict[str, str | bool] = {}
    for i, word in enumerate(args):
        if word.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else "--"
            out[word] = True if nxt.startswith("--") else nxt
    return out


def test_the_three_profiles_carry_the_guides_flags() -> None:
    base = flags(get_profile("qwen2.5-72b-tp4").serve_args())
    assert {k: base[k] for k in ("--tensor-parallel-size", "--gpu-memory-utilization",
                                 "--max-model-len", "--enable-prefix-caching")} == {
        "--tensor-parallel-size": "4", "--gpu-memory-utilization": "0.92",
        "--max-model-len": "32768", "--enable-prefix-caching": True}
    assert get_profile("qwen2.5-72b-tp4").serve_args()[0] == "/models/Qwen2.5-72B-Instruct"
    assert "--kv-cache-dtype" not in base and "--quantization" not in base
    fp8 = flags(get_profile("qwen2.5-72b-tp4-fp8").serve_args())
    assert (fp8["--kv-cache-dtype"], fp8["--quantization"], fp8["--tensor-parallel-size"]) == \
        ("fp8", "fp8", "4")
    awq = flags(get_profile("qwen2.5-72b-awq-tp2-int8kv").serve_args())
    assert (awq["--quantization"], awq["--tensor-parallel-size"]) == ("awq", "2")
    # vLLM's name for the INT8 KV cache, the one the planner resolves "int8" to
    assert awq["--kv-cache-dtype"] == resolve_kv_dtype("int8") == "int8_per_token_head"


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_kv_events_published_where_the_gateway_subscribes(profile) -> None:
    events_config = flags(profile.serve_args())["--kv-events-config"]
    assert isinstance(events_config, str)  # a flag with a value, not a switch
    config = json.loads(events_config)
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
                      "replay_endpoint": f"tcp://*:{KV_REPLAY_PORT}", "topic": "kv"}
    settings = Settings.model_validate({"replicas": [profile.remote_replica("10.0.0.5")]})
    kv = settings.replicas[0].kv_events
    assert kv is not None and (kv.endpoint, kv.replay_endpoint, kv.topic) == (
        f"tcp://10.0.0.5:{KV_EVENTS_PORT}", f"tcp://10.0.0.5:{KV_REPLAY_PORT}", config["topic"])
    assert settings.policy_name() == "precise"  # auto: every replica publishes events
    discovered = Settings.model_validate({"replicas_from": [profile.discovery_source("vllm")]})
    assert discovered.policy_name() == "precise"
    assert discovered.replicas_from[0].kv_events.port == KV_EVENTS_PORT  # type: ignore[union-attr]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_inprocess_block_starts_the_same_engine_as_the_command_line(profile) -> None:
    cfg = ReplicaSettings.model_validate(profile.inprocess_replica())
    args, _ = engine_args(profile.name, cfg)
    served = flags(profile.serve_args())
    inprocess = flags(args)
    for key in ("--host", "--port", "--kv-events-config"):  # the gateway picks its own sockets
        served.pop(key)
        inprocess.pop(key, None)
    assert inprocess.pop("--model") == profile.serve_args()[0] == profile.model_path
    assert inprocess == served


def test_command_line_round_trips_through_a_shell_parser() -> None:
    profile = get_profile("qwen2.5-72b-tp4-fp8")
    code, text = capture(["show", profile.name])
    assert code == 0
    block = text.split("vLLM command line:\n", 1)[1].split("\n\n", 1)[0]
    assert shlex.split(block.replace("\\\n", " ")) == profile.command()


def capture(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return run(argv, out), out.getvalue()


def test_list_and_json(capsys) -> None:
    assert cli_main(["profiles"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [p.name for p in PROFILES]
    code, text = capture(["--json"])
    body = json.loads(text)
    assert code == 0 and [p["name"] for p in body["profiles"]] == [p.name for p in PROFILES]
    assert body["profiles"][2]["command"][:2] == ["vllm", "serve"]


def test_show_with_plan_matches_prefixgate_plan(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_72B))
    profile = get_profile("qwen2.5-72b-tp4-fp8")
    expected = plan(ModelShape.from_config(QWEN25_72B), profile.plan_input())
    code, text = capture(["show", profile.name, "--plan", str(tmp_path)])
    assert code == 0
    assert f"{expected.num_blocks:,} blocks of 16 = {expected.kv_capacity_tokens:,} tokens" in text
    code, text = capture(["show", profile.name, "--plan", str(tmp_path), "--json"])
    assert json.loads(text)["plan"]["num_blocks"] == expected.num_blocks


def test_unknown_profile_and_missing_config(tmp_path: Path, capsys) -> None:
    assert capture(["show", "qwen-nope"])[0] == 2
    assert "unknown profile 'qwen-nope': use one of qwen2.5-72b-tp4" in capsys.readouterr().err
    assert capture(["show", "qwen2.5-72b-tp4", "--plan", str(tmp_path / "none.json")])[0] == 2


def test_printed_plan_command_gives_the_same_capacity(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_72B))
    for profile in PROFILES:
        _, text = capture(["show", profile.name])
        words = text.split("capacity:\n  prefixgate plan CONFIG ", 1)[1].splitlines()[0].split()
        out = io.StringIO()
        plan_run([str(tmp_path), *words, "--json"], out)
        expected = plan(ModelShape.from_config(QWEN25_72B), profile.plan_input())
        assert json.loads(out.getvalue())["num_blocks"] == expected.num_blocks
