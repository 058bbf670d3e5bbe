"""What the simulator answers when a request asks for JSON or tool calls."""

from __future__ import annotations

import datetime
import enum
import json
import random
import uuid
from typing import Any, Literal

import jsonschema
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from engine.sim.answers import parse_output_rules, plan_answer, split_tokens
from engine.sim.protocol import SimError, parse_json_object
from engine.sim.schema_values import value_for_schema


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    postcode: str = Field(min_length=5, max_length=5)


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    score: float = Field(gt=0, lt=1)
    email: str | None = None
    color: Color
    kind: Literal["a", "b"]
    tags: list[str] = Field(min_length=1, max_length=3)
    address: Address
    born: datetime.date
    seen: datetime.datetime
    id: uuid.UUID
    tree: Node
    counts: dict[str, int]
    step: int = Field(multiple_of=5, ge=10, le=40)


@pytest.mark.parametrize("schema", [Person.model_json_schema(), to_strict_json_schema(Person)],
                         ids=["pydantic", "openai-strict"])
def test_generated_json_validates_for_every_seed(schema: dict[str, Any]) -> None:
    for seed in range(40):
        value = value_for_schema(schema, random.Random(seed))
        jsonschema.validate(value, schema)
        Person.model_validate(value)


def test_recursive_and_combined_schemas_end_and_validate() -> None:
    schema = {"$defs": {"t": {"type": "object", "required": ["next"], "properties": {
        "next": {"anyOf": [{"$ref": "#/$defs/t"}, {"type": "null"}]}}}},
        "allOf": [{"$ref": "#/$defs/t"}, {"properties": {"tag": {"const": 3}}, "required": ["tag"]}]}
    value = value_for_schema(schema, random.Random(0))
    jsonschema.validate(value, schema)


def test_pieces_join_back_exactly() -> None:
    text = json.dumps({"城市": "北京", "n": 12345, "ok": True, "s": "a  b\n"}, ensure_ascii=False)
    assert "".join(split_tokens(text)) == text and len(split_tokens(text)) > 10


def weather() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def time_tool() -> dict[str, Any]:
    return {"type": "function", "function": {"name": "get_time", "parameters": {}}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_auto_calls_the_tool_the_user_talks_about_then_answers_in_text() -> None:
    body = {"tools": [time_tool(), weather()]}
    rules = parse_output_rules(body)
    plan = plan_answer(rules, [user("How is the weather?")], random.Random(1))
    assert [call.name for call in plan.calls] == ["get_weather"]
    assert plan.pieces is not None and plan.pieces[0].opens  # hermes: the name first
    after = [user("How is the weather?"),
             {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather"}}]},
             {"role": "tool", "content": "sunny"}]
    assert plan_answer(rules, after, random.Random(1)).calls == ()


def test_required_calls_a_tool_not_yet_called() -> None:
    rules = parse_output_rules({"tools": [time_tool(), weather()], "tool_choice": "required"})
    history = [user("go"), {"role": "assistant", "tool_calls": [
        {"function": {"name": "get_time"}}]}, {"role": "tool", "content": "12:00"}]
    assert plan_answer(rules, history, random.Random(0)).calls[0].name == "get_weather"


@pytest.mark.parametrize(("body", "message"), [
    ({"tools": []}, "must not be an empty array"),
    ({"tool_choice": "auto"}, "`tools` must be set"),
    ({"tools": [weather()], "tool_choice": "sometimes"}, "Invalid value for `tool_choice`"),
    ({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "does not match any"),
    ({"response_format": {"type": "json_schema"}}, "'json_schema' field must be provided"),
])
def test_what_vllm_refuses_is_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(SimError) as refused:
        parse_output_rules(body)
    assert refused.value.status == 400 and message in refused.value.message


def test_tool_choice_none_and_choice_constraints() -> None:
    assert plan_answer(parse_output_rules({"tools": [weather()], "tool_choice": "none"}),
                       [user("weather?")], random.Random(0)).pieces is None
    plan = plan_answer(parse_output_rules({"structured_outputs": {"choice": ["yes", "no"]}}),
                       [user("?")], random.Random(0))
    assert "".join(plan.script or ()) in ("yes", "no")


def test_the_sim_reads_a_body_as_vllm_does() -> None:
    """NaN and a UTF-16 body: vLLM's reader (Python's json) takes them; orjson alone did not."""
    assert parse_json_object(b'{"model": "m", "metadata": {"x": NaN}}',
                             "application/json")["model"] == "m"
    assert parse_json_object('{"model": "m"}'.encode("utf-16"), "application/json") == {
        "model": "m"}
    with pytest.raises(SimError):
        parse_json_object(b'{"model": ', "application/json")
