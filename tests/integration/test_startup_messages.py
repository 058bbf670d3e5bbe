"""What ``prefixgate serve`` says when something is wrong at start-up: it says it.

A replica that cannot be reached is named (once), start-up says it is
waiting, requests get 503 with Retry-After (not "model does not exist"),
and the recovery is logged; a taken port and a configured tokenizer folder
that is not one stop start-up with one clear line and a non-zero exit,
before anything says "serving on" or "ready".
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from policies.block_table import default_backend
from tests.integration.conftest import MODEL, gateway_settings, running_sims, sim_args
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until


def serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", *args], check=False,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_an_unreachable_replica_is_named_waited_for_and_answered_503() -> None:
    port = free_port()
    gateway = GatewayProcess({"replicas": [{"id": "r0", "url": f"http://127.0.0.1:{port}"}],
                              "health_interval": 0.2})
    sim = SimProcess(sim_args(0), port=port)
    try:
        gateway.start(wait_ready=False)
        wait_until(lambda: "waiting for replicas" in gateway.log(), 30, "the waiting line")
        log = gateway.log()
        assert f"replica r0 at http://127.0.0.1:{port} cannot be reached" in log
        assert f"block table: {default_backend()}" in log  # compiled, or the python fallback
        assert not re.search(r"\bready\b", log.replace("/ready", ""))
        chat = httpx.post(gateway.url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503, chat.text  # not 404 "does not exist"
        assert chat.headers["retry-after"]
        assert "not answered yet" in chat.json()["error"]["message"]
        sim.start()
        wait_until(lambda: "replica r0 is healthy" in gateway.log(), 30, "the recovery line")
        wait_until(lambda: ", ready:" in gateway.log(), 10, "the ready line")
        answered = httpx.post(gateway.url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert answered.status_code == 200
        assert gateway.log().count("cannot be reached") == 1  # said once, not per probe
    finally:
        gateway.stop()
        sim.close()


def test_a_taken_port_is_one_clear_error_and_no_ready() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--port", str(port), "--replica", f"http://127.0.0.1:{free_port()}",
                       "--model", MODEL)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out and "already in use" in out.lower()
    assert "serving on" not in out and not re.search(r"\bready\b", out)


def test_a_configured_tokenizer_that_is_not_one_stops_start_up(tmp_path: Path) -> None:
    replica = f"http://127.0.0.1:{free_port()}"
    missing = serve("--replica", replica, "--model", MODEL, "--tokenizer", "/nonexistent/tok")
    assert missing.returncode == 2
    assert "tokenizer folder /nonexistent/tok does not exist" in missing.stderr
    empty = serve("--replica", replica, "--tokenizer", str(tmp_path))
    assert empty.returncode == 2
    assert f"tokenizer folder {tmp_path} is not a tokenizer" in empty.stderr
    missing_template = serve("--replica", replica, "--model", MODEL, "--chat-template",
                             "/nonexistent/template.jinja")
    assert missing_template.returncode == 2
    assert ("chat template file /nonexistent/template.jinja does not exist "
            "(--chat-template / models[].chat_template)") in missing_template.stderr



def _state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent (from /proc); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
            and (state := _state(int(entry.name))) is not None and state[1] == pid
            and state[0] != "Z"]


def _alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state[0] != "Z"


def test_a_sigterm_while_embedded_replicas_start_stops_them_too() -> None:
    """``docker stop`` or a supervisor's SIGTERM during the embedded replicas' start-up
    (a minute for vLLM on CPU) ended the gateway alone: its replicas, each in a session
    of its own, ran on holding their memory and ports."""
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--embedded", "sim",
                             "--port", str(free_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    children: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(children) < 2:  # both replicas spawned, still loading
            assert time.monotonic() < deadline and proc.poll() is None, "no replicas started"
            time.sleep(0.02)
            children = _children(proc.pid)
        proc.terminate()
        output = proc.communicate(timeout=30)[0].decode()
        assert "serving on" not in output  # it was still starting them
        wait_until(lambda: not any(_alive(pid) for pid in children), 15,
                   "the replicas stopped with the gateway")
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_replica_serving_another_name_than_configured_is_said_once() -> None:
    """``--model qwen`` in front of a replica serving ``qwen2.5``: every request for
    ``qwen`` was a 404, and nothing at start-up said why."""
    with running_sims([sim_args(0)]) as sims:
        settings = gateway_settings(sims)
        settings["replicas"][0]["model"] = "other-name"
        gateway = GatewayProcess(settings).start(wait_ready=False)  # never ready: no
        try:                                                           # replica serves it
            wait_until(lambda: "serves" in gateway.log(), 30, "the mismatch named")
            assert (f"replica s0 serves {MODEL}, not the configured model 'other-name'"
                    in gateway.log())
            for _ in range(2):
                chat = httpx.post(gateway.url + "/v1/chat/completions", timeout=10, json={
                    "model": "other-name", "messages": [{"role": "user", "content": "hi"}]})
                assert chat.status_code == 404
            assert gateway.log().count("not the configured model") == 1
        finally:
            gateway.stop()
