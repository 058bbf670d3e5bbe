"""``agent``: tool-call loops, each request ending on a tool result.

``sessions`` agent runs, each behind the same system prompt of
``system_len`` tokens and the same ``tools`` list (six functions, see
:mod:`.agent_tools`; ``tool_choice`` is sent with them). A run starts with a
user task of ``task_len`` tokens and takes ``steps`` tool steps; request
``k`` (0-based) of a run is::

    system, user task,
    assistant(tool_calls=[call 0]), tool(result 0),
    ...
    assistant(tool_calls=[call k]), tool(result k)

so every request ends on a ``role: "tool"`` message and the next one resends
it all plus one more call and result. The assistant messages are scripted
(deterministic tool and JSON arguments per run and step; empty content),
not the server's answers, which are dropped (``history="scripted"``, see
:mod:`loadtest.transcript`): it is the history an agent framework resends,
and it does not depend on what the model said. Each result is
``result_len`` tokens; each request asks for ``output_len`` tokens.

The system prompt and tools are shared by every run; each run's history is
a prefix of its next request. ``tool_choice`` defaults to ``"none"``: the
tools stay in the prompt and any vLLM server accepts the request (``"auto"``
needs a server started with a tool-call parser); ``""`` sends none.

Defaults: 32 runs x 6 steps, 1024-token system prompt, 64-token task,
256-token results, 64-token answers, closed loop at concurrency 16 (or
Poisson run arrivals at ``rate``). Lengths are words, each one Qwen3 token
(see :mod:`.text`); the tools JSON and call arguments add their own tokens.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from loadtest.workloads.agent_tools import TOOLS, scripted_call
from loadtest.workloads.base import Conversation, Turn, Workload, paced, pacing_from
from loadtest.workloads.text import words


@dataclass(frozen=True, slots=True)
class AgentParams:
    sessions: int = 32
    steps: int = 6
    """Tool calls per run, one request each."""
    system_len: int = 1024
    task_len: int = 64
    result_len: int = 256
    output_len: int = 64
    tool_choice: str = "none"
    """Sent with the tools; ``""``: not sent."""
    seed: int = 0
    rate: float | None = None
    """Poisson run arrivals per second; ``None`` runs closed loop."""
    concurrency: int | None = None
    """Closed loop: runs in progress at once (default 16). Open loop: cap on requests."""

    def __post_init__(self) -> None:
        for name in ("sessions", "steps", "system_len", "task_len", "result_len", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def step_messages(params: AgentParams, session: int, step: int) -> list[dict[str, Any]]:
    """The scripted assistant tool call of one step and the tool's result."""
    key = f"agent/{params.seed}/{session}/{step}"
    call = scripted_call(key + "/call", f"call_{session}_{step}")
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"],
         "content": words(key + "/result", params.result_len)},
    ]


def build(params: AgentParams) -> Workload:
    system = words(f"agent/system/{params.seed}", params.system_len)
    conversations = []
    for session in range(params.sessions):
        task = {"role": "user",
                "content": words(f"agent/task/{params.seed}/{session}", params.task_len)}
        turns = tuple(
            Turn("", params.output_len,
                 script=tuple(([task] if step == 0 else []) +
                              step_messages(params, session, step)))
            for step in range(params.steps)
        )
        conversations.append(Conversation(
            id=f"s{session}", group=f"s{session}", turns=turns, system=system,
            history="scripted", tools=TOOLS, tool_choice=params.tool_choice or None))
    random.Random(f"agent/order/{params.seed}").shuffle(conversations)
    pacing = pacing_from(params.rate, params.concurrency, default_concurrency=16)
    return Workload(
        name="agent",
        conversations=paced(conversations, pacing, params.seed),
        pacing=pacing,
        params=dataclasses.asdict(params),
    )
