"""One chat choice as its tokens arrive: content or tool calls, in vLLM 0.32's shapes.

Each output token maps back to its piece of the choice's
:class:`~engine.sim.answers.AnswerPlan` (token ``i`` is piece ``i``; the EOS
token comes after the last). :meth:`ChatChoice.feed` returns the stream
delta vLLM would send for it, :meth:`ChatChoice.message` the whole message.

Stream deltas (``exclude_unset`` dumps of vLLM's ``DeltaMessage``):

* content: ``{"content": text}``; the EOS token's is ``{"content": ""}``;
* named ``tool_choice`` (``extract_named_tool_call_streaming``): the first
  token of the call ``{"tool_calls": [{"id", "type": "function", "index": 0,
  "function": {"name", "arguments": text}}]}``, later ones
  ``{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}``;
* ``required`` (``extract_required_tool_call_streaming``): the same, except
  later ones carry ``"name": null`` beside the arguments;
* ``auto`` (the hermes parser): a first delta with the name alone
  (``{"content": null, "tool_calls": [{"id", "type", "index", "function":
  {"name"}}]}``), then ``{"content": null, "tool_calls": [{"index",
  "function": {"arguments"}}]}``;
* in tool mode a token with nothing to send sends no chunk (unless it
  finishes the choice, or logprobs were asked for): ``{}``.

The whole message has ``tool_calls: [{"id": "chatcmpl-tool-<hex>", "type":
"function", "function": {"name", "arguments"}}]`` and ``content`` "" (named,
required) or null (auto); the finish reason is ``tool_calls`` for auto and
required, ``stop`` for a named tool, as vLLM reports them.
"""

from __future__ import annotations

import uuid
from typing import Any

from engine.sim.answers import AnswerPlan
from engine.sim.logprobs import TokenLogprob, chat_entry, chat_logprobs, token_logprob
from engine.sim.request import TokenEvent
from engine.sim.responses import chat_message


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ChatChoice:
    def __init__(self, index: int, plan: AnswerPlan, logprobs: int | None, key: str) -> None:
        self.index = index
        self.plan = plan
        self.logprobs = logprobs
        self.key = key
        self.content = ""
        self.arguments: dict[int, str] = {}
        self.ids: dict[int, str] = {}
        self.scored: list[TokenLogprob] = []
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None

    @property
    def tool_mode(self) -> bool:
        return bool(self.plan.calls)

    def feed(self, event: TokenEvent) -> dict[str, Any] | None:
        """Take one token; the delta to stream for it, or ``None`` to send nothing."""
        position = event.num_output_tokens - 1
        self.num_tokens = event.num_output_tokens
        if event.finish_reason is not None:
            self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason
        if self.logprobs is not None:
            self.scored.append(token_logprob(self.key, position, event.token_text, self.logprobs))
        pieces = self.plan.pieces or ()
        piece = pieces[position] if position < len(pieces) else None
        if not self.tool_mode:
            self.content += event.delta_text
            return {"content": event.delta_text}
        if piece is None or piece.call is None:
            return {} if event.finish_reason is not None or self.logprobs is not None else None
        return self._call_delta(piece.call, event.delta_text, piece.opens, event)

    def _call_delta(
        self, call: int, text: str, opens: bool, event: TokenEvent
    ) -> dict[str, Any] | None:
        mode = self.plan.tool_choice
        name = self.plan.calls[call].name
        first = call not in self.ids
        if first:
            self.ids[call] = tool_call_id()
            self.arguments[call] = ""
        self.arguments[call] += text
        entry: dict[str, Any]
        if mode == "auto":
            if first:
                entry = {"id": self.ids[call], "type": "function", "index": call,
                         "function": {"name": name}}
                if text:
                    entry["function"]["arguments"] = text
            elif text:
                entry = {"index": call, "function": {"arguments": text}}
            else:
                return {} if event.finish_reason is not None or self.logprobs is not None else None
            return {"content": None, "tool_calls": [entry]}
        if first:
            entry = {"id": self.ids[call], "type": "function", "index": call,
                     "function": {"name": name, "arguments": text}}
        else:
            function: dict[str, Any] = {"name": None} if mode == "required" else {}
            function["arguments"] = text
            entry = {"index": call, "function": function}
        return {"tool_calls": [entry]}

    # -- the whole choice --------------------------------------------------------

    def reported_finish(self) -> str:
        reason = self.finish_reason or "stop"
        if reason == "stop" and self.ids and self.plan.tool_choice in ("auto", "required"):
            return "tool_calls"
        return reason

    def stream_logprobs(self) -> dict[str, Any] | None:
        """The last token's logprobs, for its chunk."""
        if self.logprobs is None or not self.scored:
            return None
        return {"content": [chat_entry(self.scored[-1], self.logprobs)]}

    def message(self) -> dict[str, Any]:
        tool_calls = [
            {"id": self.ids[call], "type": "function",
             "function": {"name": self.plan.calls[call].name, "arguments": self.arguments[call]}}
            for call in sorted(self.ids)
        ]
        if not self.tool_mode:
            content: str | None = self.content
        else:
            content = None if self.plan.tool_choice == "auto" else ""
        return chat_message(content, tool_calls)

    def message_logprobs(self) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return chat_logprobs(self.scored, self.logprobs)
