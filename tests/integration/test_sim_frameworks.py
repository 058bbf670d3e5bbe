"""The frameworks apps are built with, against the no-install quick start.

``prefixgate serve --embedded sim``: LangChain (``bind_tools``,
``with_structured_output`` with each method, streamed tool calls) and
pydantic-ai (an agent with a function tool and a structured output, which
it asks for as a tool). instructor is not tested here: no release installs
beside the ``openai`` version of the test environment (it pins an older
one); litellm is left out because it is heavy (boto3, botocore and a large
wheel of its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support.gateway import GatewayProcess

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
    gw = GatewayProcess({"embedded": {"kind": "sim", "replicas": 2, "time_scale": 50},
                         "health_interval": 0.2})
    try:
        yield gw.start(timeout=120)
    finally:
        gw.stop()


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
