"""The tools of the ``agent`` workload: OpenAI ``tools`` JSON and scripted calls.

:data:`TOOLS` is a fixed list of six function definitions (the same JSON,
key order and all, in every request: an agent framework's tool list is part
of its stable prefix). :func:`scripted_call` gives one deterministic call of
one of them — name and JSON arguments made of :func:`.text.words` keyed by
the caller's key — as an assistant message's ``tool_calls`` entry.
"""

from __future__ import annotations

import json
import random
from typing import Any

from loadtest.workloads.text import words


def _function(name: str, description: str, **properties: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind, "description": text}
                               for key, (kind, text) in properties.items()},
                "required": list(properties),
            },
        },
    }


TOOLS: tuple[dict[str, Any], ...] = (
    _function("search_web", "Search the web and return the top results as title and snippet.",
              query=("string", "What to search for."),
              max_results=("integer", "How many results to return (1-10).")),
    _function("read_file", "Read a text file from the workspace.",
              path=("string", "Path of the file, relative to the workspace root.")),
    _function("write_file", "Write a text file in the workspace, replacing it if it exists.",
              path=("string", "Path of the file, relative to the workspace root."),
              content=("string", "The full new content of the file.")),
    _function("run_shell", "Run a shell command in the workspace and return its output.",
              command=("string", "The command line to run."),
              timeout_s=("integer", "Seconds before the command is stopped.")),
    _function("http_get", "Fetch a URL and return the response body as text.",
              url=("string", "The absolute http or https URL.")),
    _function("query_database", "Run a read-only SQL query and return the rows as JSON.",
              sql=("string", "One SELECT statement.")),
)


def _arguments(name: str, key: str) -> dict[str, Any]:
    rng = random.Random(key)
    path = "/".join(words(key + "/path", 3).split()) + ".md"
    if name == "search_web":
        return {"query": words(key, 6), "max_results": rng.randint(3, 8)}
    if name == "read_file":
        return {"path": path}
    if name == "write_file":
        return {"path": path, "content": words(key + "/content", 24)}
    if name == "run_shell":
        return {"command": f"grep -rn {words(key, 1)} src", "timeout_s": 30}
    if name == "http_get":
        return {"url": "https://docs.example.com/" + "-".join(words(key, 3).split())}
    return {"sql": f"SELECT * FROM {words(key, 1)} WHERE {words(key + '/col', 1)} = 1"}


def scripted_call(key: str, call_id: str) -> dict[str, Any]:
    """One ``tool_calls`` entry: a tool and its arguments chosen by ``key`` alone."""
    tool = random.Random(key + "/tool").choice(TOOLS)["function"]["name"]
    return {"id": call_id, "type": "function",
            "function": {"name": tool, "arguments": json.dumps(_arguments(tool, key))}}
