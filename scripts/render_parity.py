"""The gateway's rendering against a running vLLM's, template by template.

    python scripts/render_parity.py --url http://127.0.0.1:8000 --model NAME \
        --tokenizer FOLDER TEMPLATE.jinja [TEMPLATE.jinja ...]

vLLM must run with ``--trust-request-chat-template`` (each request brings its
template) and the tokenizer in FOLDER. For each template, each chat (the render
check's probes, ``gateway.prompt.render_check.PROBES``, and a few more shapes) is
rendered to token ids by the gateway, configured with that template as with
``--chat-template`` (three times: whole, then making the shape's recipe, then
filled from it, ``engine.template_shapes``), and by vLLM's ``/tokenize`` with it. A chat both refuse is
a match; one side refusing, or other ids, is a difference. Prints one line per
template and exits 1 on any difference: run it after a vLLM upgrade, on the
templates of the models you serve (vLLM's ``examples/*.jinja`` hold many).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import httpx

from engine.tokenizer import HFRenderer
from gateway.prompt.bounds import ModelTemplate
from gateway.prompt.render import PromptHasher
from gateway.prompt.render_check import PROBES

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "lookup_order", "arguments": ""}}
MORE: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "你是一个乐于助人的助手。"},
                  {"role": "user", "content": "今天天气怎么样？"}]},
    {"messages": [{"role": "user", "content": "Find A-1."},
                  {"role": "assistant", "content": "", "reasoning": "Look it up.",
                   "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "shipped"}],
     "tools": [PROBES[-1][1]["tools"][0]]},
    {"messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "x"},
                  {"role": "developer", "content": " late "}, {"role": "user", "content": "y"}]},
]


def compare(url: str, model: str, folder: str, template: str) -> list[str]:
    """One mark per chat: ``=`` same ids, ``=e`` both refuse, ``X`` other ids, ``Eg``
    only the gateway refuses, ``Ev`` only vLLM refuses."""
    hasher = PromptHasher(ModelTemplate(HFRenderer(folder, chat_template=template)))
    marks = []
    for chat in [body for _, body in PROBES] + MORE:
        try:  # three times: rendered whole, then a recipe made, then filled from it
            renders = {tuple(hasher.token_ids(model, chat, "chat")) for _ in range(3)}
            ours: list[int] | None = list(renders.pop()) if len(renders) == 1 else []
        except ValueError:  # RenderError, a template's own refusal
            ours = None
        answer = httpx.post(f"{url}/tokenize", timeout=60, json={
            "model": model, "add_generation_prompt": True, "chat_template": template, **chat})
        theirs = answer.json().get("tokens") if answer.status_code == 200 else None
        marks.append("=e" if ours is None and theirs is None else "=" if ours == theirs
                     else "Eg" if ours is None else "Ev" if theirs is None else "X")
    return marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("templates", nargs="+")
    args = parser.parse_args()
    differing = 0
    for path in args.templates:
        marks = compare(args.url, args.model, args.tokenizer, Path(path).read_text())
        bad = [m for m in marks if not m.startswith("=")]
        differing += bool(bad)
        print(f"{'DIFF' if bad else 'ok  '} {Path(path).name}: {' '.join(marks)}")
    print(f"{differing} of {len(args.templates)} templates render differently")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
