"""What a simulated choice answers: free text, JSON, or tool calls.

The request's ``tools``, ``tool_choice``, ``response_format`` and vLLM's
``structured_outputs`` are read into :class:`OutputRules` (refused as vLLM
refuses them: a named tool that is not in ``tools``, ``tool_choice``
without ``tools``, an empty ``tools``, ``json_schema`` without its schema).
:func:`plan_answer` then decides, deterministically from the choice's RNG,
what the choice generates. The simulator behaves like vLLM started with
``--enable-auto-tool-choice --tool-call-parser hermes`` (as
``engine.vllm.local`` starts real replicas):

==================  =========================================================
``tool_choice``     the answer
==================  =========================================================
named               one call of that tool; ``content`` ""; finish ``stop``
``required``        one call; ``content`` ""; finish ``tool_calls``
``auto`` (default   one call when the last message is the user's (a fresh
with ``tools``)     question), else text (it has the tool results it asked
                    for); ``content`` null with a call; finish ``tool_calls``
``none``            text, as without tools
==================  =========================================================

The tool called is the one with the most words of its name in the last user
message (``get_weather`` for "what is the weather?"), the first on a tie;
after tool results only tools not yet called in the conversation are
candidates (so an agent's loop reaches its final-answer tool).
Arguments are JSON generated from the tool's ``parameters`` schema
(``engine.sim.schema_values``), so they validate. Without a tool call,
``response_format`` ``json_schema`` (or ``structured_outputs.json``) gives
JSON valid against the schema, ``json_object`` a small object, and
``structured_outputs.choice`` one of the choices.

The answer is cut into pieces, one token each (:func:`split_tokens`); the
chat route maps each output token back to its piece to stream tool-call
deltas in vLLM's shapes.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.sim.protocol import validation_error
from engine.sim.schema_values import value_for_schema

_TOKEN = re.compile(r"\s*(?:[A-Za-z]{1,8}|\d{1,3}|[^\sA-Za-z\d])|\s+")


def split_tokens(text: str) -> tuple[str, ...]:
    """Cut ``text`` into token-sized pieces that join back to it exactly."""
    pieces = tuple(_TOKEN.findall(text))
    assert "".join(pieces) == text
    return pieces


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OutputRules:
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "none"
    """"none", "auto", "required" or "named"."""
    named_tool: str | None = None
    json_schema: Mapping[str, Any] | None = None
    json_object: bool = False
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Piece:
    text: str
    call: int | None = None
    """The tool call this piece's text is an argument of; ``None`` for content."""
    opens: bool = False
    """The first token of a hermes-style call (``<tool_call>{"name": ...``): no text."""


@dataclass(frozen=True, slots=True)
class ToolCallPlan:
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    pieces: tuple[Piece, ...] | None = None
    """``None``: free text (the simulator's random words)."""
    calls: tuple[ToolCallPlan, ...] = ()
    tool_choice: str = "none"

    @property
    def script(self) -> tuple[str, ...] | None:
        return None if self.pieces is None else tuple(piece.text for piece in self.pieces)


def _tool(entry: Any, position: int) -> Tool:
    function = entry.get("function") if isinstance(entry, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise validation_error(("tools", position, "function"), "Field required", None, "missing")
    parameters = function.get("parameters")
    return Tool(function["name"], parameters if isinstance(parameters, Mapping) else {})


def _tool_choice(body: Mapping[str, Any], tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"
    choice = body.get("tool_choice")
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice == "none":
        return "none", None
    if not tools:
        raise validation_error((), "Value error, When using `tool_choice`, `tools` must be set.")
    if choice in ("auto", "required"):
        return str(choice), None
    if not isinstance(choice, Mapping):
        raise validation_error((), f"Value error, Invalid value for `tool_choice`: {choice}! "
                               'Only named tools, "none", "auto" or "required" are supported.')
    function = choice.get("function")
    if not isinstance(function, Mapping):
        raise validation_error((), f"Value error, Invalid value for `function`: `{function}` in "
                               f"`tool_choice`! {usage}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise validation_error((), f"Value error, Invalid `name` in `function`: `{name}` in "
                               f"`tool_choice`! {usage}")
    if name not in {tool.name for tool in tools}:
        raise validation_error((), "Value error, The tool specified in `tool_choice` does not "
                               "match any of the specified `tools`")
    return "named", name


def parse_output_rules(body: Mapping[str, Any]) -> OutputRules:
    raw_tools = body.get("tools")
    if raw_tools == []:
        raise validation_error((), "Value error, `tools` must not be an empty array. Either "
                               "provide at least one tool or omit the field entirely.")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise validation_error(("tools",), "Input should be a valid list", raw_tools, "list_type")
    tools = tuple(_tool(entry, position) for position, entry in enumerate(raw_tools or []))
    tool_choice, named = _tool_choice(body, tools)
    schema: Mapping[str, Any] | None = None
    json_object = False
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping):
                raise validation_error((), "Value error, When response_format type is "
                                       "'json_schema', the 'json_schema' field must be provided.")
            found = spec.get("schema", spec.get("json_schema"))
            schema = found if isinstance(found, Mapping) else {"type": "object"}
        json_object = kind == "json_object"
    structured = body.get("structured_outputs")
    choices = None
    if isinstance(structured, Mapping):
        if isinstance(structured.get("json"), Mapping):
            schema = structured["json"]
        if isinstance(structured.get("choice"), list) and structured["choice"]:
            choices = tuple(str(item) for item in structured["choice"])
    return OutputRules(tools, tool_choice, named, schema, json_object, choices)


def _last_role(messages: Sequence[Any]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, Mapping):
            return str(message.get("role"))
    return None


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _pick_tool(rules: OutputRules, messages: Sequence[Any]) -> Tool:
    if rules.named_tool is not None:
        return next(tool for tool in rules.tools if tool.name == rules.named_tool)
    called = {str(call.get("function", {}).get("name"))
              for m in messages if isinstance(m, Mapping) and isinstance(m.get("tool_calls"), list)
              for call in m["tool_calls"] if isinstance(call, Mapping)
              and isinstance(call.get("function"), Mapping)}
    # After tool results, a tool not called yet (an agent's final-answer tool):
    # calling the same one again would loop.
    candidates = list(rules.tools)
    if _last_role(messages) != "user":
        candidates = [tool for tool in rules.tools if tool.name not in called] or candidates
    user = next((_text_of(m) for m in reversed(messages)
                 if isinstance(m, Mapping) and m.get("role") == "user"), "")
    said = set(_WORD.findall(user.lower()))
    mentions = [len(_name_words(tool.name) & said) for tool in candidates]
    return candidates[mentions.index(max(mentions))]


_WORD = re.compile(r"[a-z0-9]{3,}")


def _name_words(name: str) -> set[str]:
    """``get_weather``, ``getWeather`` -> {"get", "weather"} (words of 3+ letters)."""
    return set(_WORD.findall(re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower()))


def _wants_call(rules: OutputRules, messages: Sequence[Any]) -> bool:
    if rules.tool_choice in ("named", "required"):
        return True
    return rules.tool_choice == "auto" and _last_role(messages) == "user"


def plan_answer(rules: OutputRules, messages: Sequence[Any], rng: random.Random) -> AnswerPlan:
    if rules.tools and _wants_call(rules, messages):
        tool = _pick_tool(rules, messages)
        arguments = json.dumps(value_for_schema(tool.parameters or {"type": "object"}, rng),
                               ensure_ascii=False)
        pieces = [Piece(text, call=0) for text in split_tokens(arguments)]
        if rules.tool_choice == "auto":
            pieces.insert(0, Piece("", call=0, opens=True))
        return AnswerPlan(tuple(pieces), (ToolCallPlan(tool.name, arguments),), rules.tool_choice)
    if rules.choices is not None:
        return AnswerPlan(tuple(Piece(text) for text in split_tokens(rng.choice(rules.choices))))
    if rules.json_schema is not None:
        text = json.dumps(value_for_schema(rules.json_schema, rng), ensure_ascii=False)
        return AnswerPlan(tuple(Piece(piece) for piece in split_tokens(text)))
    if rules.json_object:
        text = json.dumps(value_for_schema({"type": "object", "properties": {
            "answer": {"type": "string"}}, "required": ["answer"]}, rng))
        return AnswerPlan(tuple(Piece(piece) for piece in split_tokens(text)))
    return AnswerPlan()
