"""The frameworks apps are built with, against the no-install quick start.

``prefixgate serve --embedded sim``: LangChain (``bind_tools``,
``with_structured_output`` with each method, streamed tool calls),
pydantic-ai (an agent with a function tool and a structured output, which
it asks for as a tool), the Responses API's function calls with the official
client, and the OpenAI Agents SDK (an agent with a function tool on the
Responses API, its default). instructor is not tested here: no release installs
beside the ``openai`` version of the test environment (it pins an older
one); litellm is left out because it is heavy (boto3, botocore and a large
wheel of its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support.gateway import QUICK_START, GatewayProcess, running_gateway

MODEL = "sim-model"


class City(BaseModel):
    """A city and what it is known for."""

    name: str
    population: int = Field(ge=0)
    climate: Literal["arid", "temperate", "tropical", "polar"]
    landmarks: list[str] = Field(min_length=1, max_length=3)


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The current weather in a city."""
    return f"21 degrees {unit} in {city}"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with running_gateway(QUICK_START) as gw:
        yield gw


@pytest.fixture(scope="module")
def llm(gateway: GatewayProcess) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=gateway.url + "/v1", api_key="unused",
                      max_retries=0, max_tokens=300)


def test_langchain_bind_tools_gives_a_tool_call(llm: ChatOpenAI) -> None:
    reply = llm.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    assert isinstance(call["args"]["city"], str)
    assert call["args"]["unit"] in ("celsius", "fahrenheit")
    assert get_weather.invoke(call["args"])  # the arguments fit the tool


def test_langchain_streamed_tool_call_chunks_assemble(llm: ChatOpenAI) -> None:
    total: AIMessageChunk | None = None
    for chunk in llm.bind_tools([get_weather]).stream("weather in Rome?"):
        assert isinstance(chunk, AIMessageChunk)
        total = chunk if total is None else total + chunk
    assert total is not None
    (call,) = total.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}


# Not "json_mode": it sends only response_format json_object and leaves the schema to
# the prompt's words, which the simulator does not read (it answers {"answer": ...}).
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(llm: ChatOpenAI, method: str) -> None:
    structured = llm.with_structured_output(City, method=method)  # type: ignore[arg-type]
    city = structured.invoke("Describe a city, in JSON.")
    assert isinstance(city, City) and city.landmarks


def test_pydantic_ai_agent_calls_its_tool_then_returns_the_output(
        gateway: GatewayProcess) -> None:
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=gateway.url + "/v1",
                                                           api_key="unused"))
    agent = Agent(model, output_type=City)
    weather_calls: list[str] = []

    @agent.tool_plain
    def weather(city: str) -> str:
        """The current weather in a city."""
        weather_calls.append(city)
        return "sunny"

    result = agent.run_sync("What is the weather in Lyon? Then describe the city.")
    assert isinstance(result.output, City)
    assert len(weather_calls) == 1  # the tool, once; then the output tool ends the run


WEATHER: Any = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def test_responses_api_tool_calls_and_their_outputs(gateway: GatewayProcess) -> None:
    """The Responses API as agents use it: a function call as an output item, its output
    sent back as an input item (on the stored response or in full), and a stream's
    function-call events. Before, the simulator never called a tool there and refused a
    function_call_output item with a 400."""
    client = OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=64)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert [item.type for item in follow.output] == ["message"]
    again = client.responses.create(model=MODEL, tools=[WEATHER], max_output_tokens=8, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert [item.type for item in again.output] == ["message"]
    with client.responses.stream(model=MODEL, input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=64) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    (streamed,) = final.output
    assert streamed.type == "function_call" and json.loads(streamed.arguments)["city"]


AGENT = """
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)

calls = []

@function_tool
def get_weather(city: str) -> str:
    \"\"\"The weather in a city.\"\"\"
    calls.append(city)
    return f"sunny in {city}"

async def main():
    client = AsyncOpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
    agent = Agent(name="forecaster", instructions="You tell the weather. " * 20,
                  tools=[get_weather], model=OpenAIResponsesModel("sim-model", client),
                  model_settings=ModelSettings(max_tokens=64))
    plain = await Runner.run(agent, "Weather in Paris?", max_turns=4)
    streamed = Runner.run_streamed(agent, "Weather in Oslo?", max_turns=4)
    async for _ in streamed.stream_events():
        pass
    print(json.dumps({"calls": calls, "plain": plain.final_output,
                      "streamed": streamed.final_output,
                      "responses": len(plain.raw_responses)}))

set_tracing_disabled(True)
asyncio.run(main())
"""


def test_openai_agents_sdk_runs_its_tool_on_the_responses_api(gateway: GatewayProcess) -> None:
    """The OpenAI Agents SDK (its default model is the Responses API): the agent calls its
    function tool, gets the result back, and ends with an answer, plain and streamed. In a
    process of its own: the SDK's MCP support imports sse-starlette, which replaces
    uvicorn's Server.handle_exit in whatever process imports it."""
    run = subprocess.run([sys.executable, "-c", AGENT, gateway.url], check=False,
                         capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result["calls"]) == 2  # once a run: the tool's result went back, then the answer
    assert isinstance(result["plain"], str) and result["plain"]
    assert isinstance(result["streamed"], str) and result["streamed"]
    assert result["responses"] == 2
