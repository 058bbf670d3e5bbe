"""``python -m loadtest profile``: where a running gateway's time goes, by stage.

Samples a live gateway process with py-spy (a sampling profiler that reads
the interpreter's stacks from outside: nothing in the gateway changes, its
cost lands in py-spy's own process) and files every sample under the stage
of a request it belongs to:

    receive   the HTTP server reading requests and bodies (uvicorn, httptools, h11)
    parse     JSON and the request's schema (gateway.request.exchange, schemas)
    render    the chat template and the prompt's pieces (gateway.prompt, jinja2)
    tokenize  the tokenizer (tokenizers, piece reuse, the tokenize steps of render)
    hash      block hashes (policies.hashing, the gateway's hashers)
    decide    the policy and its index (policies, gateway.request.decider/dispatch)
    send      the request to the replica (httpx, httpcore, the proxy's attempt)
    relay     the answer back, chunk by chunk (gateway.request.streaming, the proxy's relay)
    record    the lifecycle's observers: recorder, response homes, fleet, trace
    lint      the live prompt linter (its worker thread, gateway.lint, and the count of
              requests being prepared it waits on)
    metrics   prometheus_client (observations and scrapes), the ops sampler
    loop      the event loop's own machinery (asyncio, uvloop) outside all of the above
    other     anything else (garbage collection shows up where it interrupts)

A sample goes to the stage of the deepest frame that matches a rule, so the
JSON decoding inside ``Exchange.parse`` is "parse" and the metric observed by
the recorder is "metrics". ``--gil`` (default) counts only samples of the
thread holding the interpreter: the split of the gateway's CPU time, the
serving loop's and the linter thread's together, which is what one core
spends. ``--idle`` adds waiting stacks, for where requests wait.

    python -m loadtest profile --pid PID --duration 30 --out DIR

writes ``DIR/profile.txt`` (py-spy's collapsed stacks), ``DIR/stages.json``
and ``DIR/stages.md`` (share of samples per stage, and the hottest frames of
each). Run it while a load runs (``python -m loadtest overhead``, ``compare``);
the figures are shares of one process's samples, not times, so they compare
across machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest import markdown

STAGES = ("receive", "parse", "render", "tokenize", "hash", "decide", "send", "relay",
          "record", "lint", "metrics", "loop", "other")


@dataclass(frozen=True, slots=True)
class Rule:
    stage: str
    path: str
    """A substring of the frame's file path ('/' separated)."""
    functions: tuple[str, ...] = ()
    """When given, the frame's function must be one of these."""
    weak: bool = False
    """A library any stage calls (JSON, h11, the event loop): it names the stage only
    when no frame of the sample matches a strong rule."""

    def matches(self, function: str, path: str) -> bool:
        """``function`` as py-spy names it (``Class.method.<locals>.<genexpr>``): any of
        its dotted parts may be the one named."""
        if self.path not in path:
            return False
        return not self.functions or any(part in self.functions for part in function.split("."))


RULES = (
    Rule("lint", "/gateway/lint/"),
    Rule("lint", "/gateway/server/live_lint.py"),
    Rule("metrics", "/prometheus_client/"),
    Rule("metrics", "/gateway/ops/"),
    Rule("record", "/gateway/request/recorder.py"),
    Rule("record", "/gateway/request/response_homes.py"),
    Rule("record", "/gateway/request/lifecycle.py"),
    Rule("record", "/gateway/trace/"),
    Rule("record", "/gateway/fleet/"),
    Rule("relay", "/gateway/request/streaming.py"),
    Rule("relay", "/gateway/request/proxy.py", ("_relay", "_first_chunk", "chunks")),
    Rule("relay", "/gateway/request/exchange.py", ("response_headers",)),
    Rule("relay", "/gateway/request/usage.py"),  # a stream's usage, read as it passes
    Rule("lint", "/gateway/request/preparing.py"),  # kept so the linter can wait for idle
    Rule("send", "/httpx/"),
    Rule("send", "/httpcore/"),
    Rule("send", "/gateway/request/proxy.py"),
    Rule("send", "/engine/backends/"),
    Rule("send", "/gateway/request/forwarding.py"),
    Rule("decide", "/policies/"),
    Rule("decide", "/gateway/request/decider.py"),
    Rule("decide", "/gateway/request/dispatch.py"),
    Rule("decide", "/engine/pool/"),
    Rule("hash", "/policies/hashing.py"),
    Rule("hash", "/gateway/prompt/hashers.py"),
    Rule("render", "/gateway/prompt/"),
    Rule("render", "/engine/chat_template.py"),
    Rule("render", "/jinja2/"),
    Rule("render", "/gateway/request/prompt_shapes.py"),
    Rule("tokenize", "/tokenizers/"),
    Rule("render", "/engine/tokenizer.py", ("render_chat",)),
    Rule("tokenize", "/engine/tokenizer.py"),
    Rule("tokenize", "/gateway/prompt/piece_reuse.py", ("tokenize",)),
    Rule("tokenize", "/gateway/prompt/render.py",
         ("tokenize", "tokenize_missing", "_tokenize_pieces")),
    Rule("tokenize", "/gateway/prompt/in_flight.py"),
    Rule("parse", "/gateway/request/exchange.py", ("parse",)),
    Rule("parse", "/gateway/request/schemas.py"),
    Rule("parse", "/json/", weak=True),
    Rule("parse", "/orjson", weak=True),
    Rule("parse", "/pydantic", weak=True),
    Rule("receive", "/gateway/request/body.py"),
    Rule("receive", "/uvicorn/protocols/"),
    Rule("receive", "/uvicorn/middleware/"),
    Rule("receive", "/httptools/"),
    Rule("receive", "/h11/", weak=True),
    Rule("receive", "/starlette/", weak=True),
    Rule("receive", "/gateway/request/front.py", ("__call__", "_relayed")),
    Rule("receive", "/gateway/server/http.py", ("GuardedHttpTools",)),  # not serve_app
    Rule("relay", "/aiohttp/client_proto.py", weak=True),  # the replica's answer arriving
    Rule("send", "/aiohttp/", weak=True),
    Rule("loop", "/asyncio/", weak=True),
    Rule("loop", "/uvloop/", weak=True),
    Rule("loop", "/selectors.py", weak=True),
)
"""For one frame the most specific rule decides: one naming functions, then one naming
a file, then a folder's (policies/hashing.py is "hash", the rest of policies/ "decide")."""

_ORDER = sorted(range(len(RULES)), key=lambda i: (
    # a more specific rule (with functions, or a file) wins over a folder's
    -len(RULES[i].functions), -RULES[i].path.endswith(".py"), i))


def frame_rule(frame: str) -> Rule | None:
    """The rule of one py-spy frame, ``function (path:line)``; None when none matches."""
    function, _, rest = frame.partition(" (")
    path = rest.rsplit(":", 1)[0] if rest else ""
    path = path.replace("\\", "/")
    if not path.startswith("/"):  # py-spy names a module's file from its package down
        path = "/" + path
    for i in _ORDER:
        if RULES[i].matches(function.strip(), path):
            return RULES[i]
    return None


def stack_stage(frames: Sequence[str]) -> str:
    """The stage of a sample: its deepest frame (leaf last) that a strong rule matches,
    else its deepest that a weak one does, else "other"."""
    weak: str | None = None
    for frame in reversed(frames):
        rule = frame_rule(frame)
        if rule is None:
            continue
        if not rule.weak:
            return rule.stage
        weak = weak or rule.stage
    return weak or "other"


@dataclass(frozen=True, slots=True)
class Breakdown:
    samples: int
    by_stage: dict[str, int]
    hottest: dict[str, list[tuple[str, int]]]
    """Per stage, the leaf frames with the most samples."""

    def share(self, stage: str) -> float:
        return self.by_stage.get(stage, 0) / self.samples if self.samples else 0.0


def parse_collapsed(lines: Iterable[str]) -> Iterable[tuple[list[str], int]]:
    """py-spy's ``--format raw`` (Brendan Gregg's collapsed stacks): ``a;b;c COUNT``."""
    for line in lines:
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        yield frames, int(count)


def breakdown(lines: Iterable[str], top: int = 5) -> Breakdown:
    by_stage: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = {}
    total = 0
    for frames, count in parse_collapsed(lines):
        stage = stack_stage(frames)
        by_stage[stage] += count
        total += count
        if frames:
            leaves.setdefault(stage, Counter())[_short(frames[-1])] += count
    return Breakdown(total, dict(by_stage),
                     {s: c.most_common(top) for s, c in leaves.items()})


def _short(frame: str) -> str:
    """``function (.../site-packages/pkg/mod.py:12)`` -> ``function (pkg/mod.py:12)``."""
    function, _, rest = frame.partition(" (")
    if not rest:
        return frame
    path = rest.rstrip(")")
    for marker in ("site-packages/", "/work/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{function} ({path})"


def markdown_table(result: Breakdown, title: str = "") -> str:
    rows = [[stage, f"{result.share(stage):.1%}", str(result.by_stage.get(stage, 0)),
             ", ".join(f"`{name}` {n}" for name, n in result.hottest.get(stage, [])[:3])]
            for stage in STAGES if result.by_stage.get(stage)]
    head = f"{title}\n\n" if title else ""
    return head + markdown.table(["stage", "share", "samples", "hottest leaf frames"], rows) + \
        f"\n\n{result.samples} samples.\n"


def record(pid: int, duration: float, out: Path, rate: int, gil: bool, idle: bool) -> Path:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
    target = out / "profile.txt"
    command = [py_spy, "record", "--pid", str(pid), "--duration", str(int(duration)),
               "--rate", str(rate), "--format", "raw", "--output", str(target), "--nonblocking"]
    if gil:
        command.append("--gil")
    if idle:
        command.append("--idle")
    subprocess.run(command, check=True, capture_output=True, timeout=duration + 60)
    return target


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("profile", help="where a running gateway's time goes, by stage "
                                            "(py-spy)")
    p.add_argument("--pid", type=int, help="the gateway's process id")
    p.add_argument("--stacks", type=Path, help="read collapsed stacks from this file instead "
                                               "of recording")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--rate", type=int, default=100, help="samples per second")
    p.add_argument("--no-gil", dest="gil", action="store_false",
                   help="every thread's samples, not only the one holding the interpreter")
    p.add_argument("--idle", action="store_true", help="include waiting stacks")
    p.add_argument("--title", default="")
    p.add_argument("--out", type=Path, required=True)


def profile_command(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.stacks is not None:
        stacks = args.stacks
    elif args.pid is not None:
        stacks = record(args.pid, args.duration, out, args.rate, args.gil, args.idle)
    else:
        raise ValueError("give --pid (record now) or --stacks (read a recording)")
    result = breakdown(stacks.read_text().splitlines())
    (out / "stages.json").write_text(json.dumps({
        "samples": result.samples, "by_stage": result.by_stage,
        "share": {s: round(result.share(s), 4) for s in STAGES if result.by_stage.get(s)},
        "hottest": result.hottest}, indent=2) + "\n")
    table = markdown_table(result, args.title)
    markdown.write(out / "stages.md", table, "Where the gateway's time goes")
    print(table)
    return 0
