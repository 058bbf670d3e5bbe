"""The embedded vLLM-on-CPU default waits longer for a first token, unless told otherwise."""

from __future__ import annotations

from gateway.config import load_settings
from gateway.serve_cli import EMBEDDED_CPU_FIRST_BYTE, embedded_timeouts


def test_vllm_on_cpu_gets_the_longer_first_byte_and_keeps_the_rest() -> None:
    timeouts = load_settings(overrides={"timeouts": {"connect": 2.0}}, env={}).timeouts
    out = embedded_timeouts(timeouts, "vllm-cpu")
    assert out.first_byte == EMBEDDED_CPU_FIRST_BYTE > timeouts.first_byte
    assert out.connect == 2.0
    assert (out.response, out.idle, out.probe) == (timeouts.response, timeouts.idle,
                                                   timeouts.probe)


def test_a_first_byte_the_user_set_stands() -> None:
    timeouts = load_settings(overrides={"timeouts": {"first_byte": 10.0}}, env={}).timeouts
    assert embedded_timeouts(timeouts, "vllm-cpu").first_byte == 10.0


def test_simulated_replicas_keep_the_default() -> None:
    timeouts = load_settings(overrides={}, env={}).timeouts
    assert embedded_timeouts(timeouts, "sim") == timeouts
