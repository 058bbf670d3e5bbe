"""``python -m loadtest profile``: py-spy's stacks filed under the request's stages."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.cli import main
from loadtest.profile import breakdown, stack_stage

SITE = "/srv/.venv/lib/python3.11/site-packages"
REPO = "/srv/prefixgate"


def frame(function: str, path: str, line: int = 1) -> str:
    return f"{function} ({path}:{line})"


SERVE = [frame("run", "/usr/lib/python3.11/asyncio/runners.py"),
         frame("_run_once", "/usr/lib/python3.11/asyncio/base_events.py"),
         frame("run_asgi", f"{SITE}/uvicorn/protocols/http/httptools_impl.py"),
         frame("__call__", f"{REPO}/gateway/request/front.py"),
         frame("_relayed", f"{REPO}/gateway/request/front.py"),
         frame("_exchange", f"{REPO}/gateway/request/front.py")]


def test_the_deepest_frame_of_ours_names_the_stage() -> None:
    parse = [*SERVE, frame("parse", f"{REPO}/gateway/request/exchange.py"),
             frame("loads", "/usr/lib/python3.11/json/__init__.py"),
             frame("decode", "/usr/lib/python3.11/json/decoder.py")]
    assert stack_stage(parse) == "parse"  # json inside Exchange.parse
    render = [*SERVE, frame("decide", f"{REPO}/gateway/request/dispatch.py"),
              frame("plan", f"{REPO}/gateway/prompt/render.py"),
              frame("render", f"{SITE}/jinja2/environment.py")]
    assert stack_stage(render) == "render"
    tokenize = [*SERVE, frame("decide", f"{REPO}/gateway/request/dispatch.py"),
                frame("_tokenize_pieces", f"{REPO}/gateway/prompt/render.py"),
                frame("encode_batch", f"{SITE}/tokenizers/implementations/base.py")]
    assert stack_stage(tokenize) == "tokenize"
    hashing = [*SERVE, frame("decide", f"{REPO}/gateway/request/dispatch.py"),
               frame("block_hashes", f"{REPO}/policies/hashing.py")]
    assert stack_stage(hashing) == "hash"  # policies/hashing.py before the rest of policies/
    deciding = [*SERVE, frame("decide", f"{REPO}/gateway/request/dispatch.py"),
                frame("choose", f"{REPO}/policies/prefix.py")]
    assert stack_stage(deciding) == "decide"
    sending = [*SERVE, frame("forward", f"{REPO}/gateway/request/proxy.py"),
               frame("send", f"{SITE}/httpcore/_async/http11.py"),
               frame("send", f"{SITE}/h11/_connection.py")]
    assert stack_stage(sending) == "send"  # h11 under httpcore is the client's
    observed = [*SERVE, frame("on_complete", f"{REPO}/gateway/request/recorder.py"),
                frame("observe", f"{SITE}/prometheus_client/metrics.py")]
    assert stack_stage(observed) == "metrics"


def test_libraries_alone_fall_back_to_what_they_are() -> None:
    reading = [frame("run_asgi", f"{SITE}/uvicorn/protocols/http/httptools_impl.py"),
               frame("receive", f"{SITE}/starlette/requests.py")]
    assert stack_stage(reading) == "receive"
    assert stack_stage(SERVE[:2]) == "loop"
    assert stack_stage([frame("<module>", "/tmp/x.py")]) == "other"


def test_the_linters_thread_is_lint() -> None:
    thread = [frame("_bootstrap", "/usr/lib/python3.11/threading.py"),
              frame("_run", f"{REPO}/gateway/server/live_lint.py"),
              frame("check_now", f"{REPO}/gateway/lint/service.py"),
              frame("findall", "/usr/lib/python3.11/re/__init__.py")]
    assert stack_stage(thread) == "lint"


def test_a_recording_is_read_into_shares_and_files(tmp_path: Path, capsys) -> None:
    parse = ";".join([*SERVE, frame("parse", f"{REPO}/gateway/request/exchange.py")])
    decide = ";".join([*SERVE, frame("choose", f"{REPO}/policies/prefix.py")])
    lines = [f"process 12:\"python\";thread (0x7f);{parse} 30", f"{decide} 10", "garbage", ""]
    result = breakdown(lines)
    assert result.samples == 40 and result.by_stage == {"parse": 30, "decide": 10}
    assert result.share("parse") == 0.75
    assert result.hottest["decide"] == [("choose (/srv/prefixgate/policies/prefix.py:1)", 10)]

    stacks = tmp_path / "stacks.txt"
    stacks.write_text("\n".join(lines))
    out = tmp_path / "out"
    assert main(["profile", "--stacks", str(stacks), "--out", str(out)]) == 0
    document = json.loads((out / "stages.json").read_text())
    assert document["share"] == {"parse": 0.75, "decide": 0.25}
    assert "| parse | 75.0% | 30 |" in (out / "stages.md").read_text()
    assert "40 samples" in capsys.readouterr().out


def test_without_a_process_or_a_recording_it_says_what_to_give(tmp_path: Path, capsys) -> None:
    assert main(["profile", "--out", str(tmp_path)]) == 2
    assert "--pid" in capsys.readouterr().err
