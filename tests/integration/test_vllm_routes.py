"""vLLM's whole OpenAI server through the gateway: the official openai client (raw httpx
where it has no method) against the gateway process in front of two sim replicas."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.sim import SimProcess

from .conftest import MODEL, gateway_settings, running_sims, sim_args

AUDIO = ("speech.wav", b"RIFF" + bytes(range(256)) * 250, "audio/wav")


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    with running_sims([sim_args(10 + i) for i in range(2)]) as started:
        yield started


@pytest.fixture(scope="module")
def gateway(sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    with running_gateway(gateway_settings(sims, policy="prefix")) as gw:
        yield gw


@pytest.fixture()
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture()
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as session:
        yield session


def direct(sim: SimProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(sim.base_url + path, json=body, timeout=30)


def max_model_len(sim: SimProcess) -> int:
    return int(httpx.get(sim.base_url + "/v1/models").json()["data"][0]["max_model_len"])


def replica_of(response: httpx.Response, sims: list[SimProcess]) -> SimProcess:
    return sims[int(response.headers["x-prefixgate-replica"][1:])]


def test_tokenize_and_detokenize_answer_as_the_replica_does(http: httpx.Client,
                                                            sims: list[SimProcess]) -> None:
    text = "The gateway relays every route."
    tokens = http.post("/tokenize", json={"prompt": text})
    assert tokens.status_code == 200
    answer = tokens.json()
    assert answer == direct(sims[0], "/tokenize", {"model": MODEL, "prompt": text}).json()
    assert answer["count"] == len(answer["tokens"]) > 0
    assert answer["max_model_len"] == max_model_len(sims[0])
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": text}]})
    assert chat.json()["count"] > answer["count"]  # the chat template's tokens around it
    back = http.post("/detokenize", json={"model": MODEL, "tokens": answer["tokens"]})
    assert back.json() == {"prompt": text}
    bad = http.post("/detokenize", json={"tokens": "not ids"})
    assert bad.status_code == 400 and bad.headers["x-prefixgate-replica"]


def test_embeddings_with_the_openai_client(client: openai.OpenAI,
                                           sims: list[SimProcess]) -> None:
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=["alpha", "beta"])
    reply = raw.parse()
    assert raw.headers["x-prefixgate-replica"] in {"s0", "s1"}
    assert [e.index for e in reply.data] == [0, 1]
    expected = direct(sims[1], "/v1/embeddings", {"model": MODEL, "input": "alpha"}).json()
    assert reply.data[0].embedding == expected["data"][0]["embedding"]
    assert reply.usage.prompt_tokens > 0
    base64 = client.embeddings.create(model=MODEL, input="alpha")  # the client asks base64
    assert base64.data[0].embedding == expected["data"][0]["embedding"]


@pytest.mark.parametrize(("path", "body", "key"), [
    ("/pooling", {"input": "some text"}, "data"),
    ("/classify", {"input": ["good", "bad"]}, "data"),
    ("/score", {"text_1": "a cat", "text_2": ["a cat", "tax law"]}, "data"),
    ("/v1/score", {"queries": "a cat", "documents": ["a cat"]}, "data"),
    ("/rerank", {"query": "a cat", "documents": ["tax law", "a cat"]}, "results"),
    ("/v1/rerank", {"query": "a cat", "documents": ["tax law", "a cat"], "top_n": 1}, "results"),
    ("/v2/rerank", {"query": "a cat", "documents": ["a cat"]}, "results"),
])
def test_pooling_routes_answer_as_the_replica_does(http: httpx.Client, sims: list[SimProcess],
                                                   path: str, body: dict, key: str) -> None:
    through = http.post(path, json=body)
    assert through.status_code == 200, through.text
    expected = direct(replica_of(through, sims), path, body).json()
    assert through.json()[key] == expected[key]
    assert set(through.json()) == set(expected)


def test_rerank_orders_the_matching_document_first(http: httpx.Client) -> None:
    results = http.post("/v1/rerank", json={"query": "a cat", "documents": [
        "tax law", "a cat"]}).json()["results"]
    assert [r["index"] for r in results] == [1, 0]


def test_audio_with_the_openai_client(client: openai.OpenAI) -> None:
    transcript = client.audio.transcriptions.create(model=MODEL, file=AUDIO)
    assert transcript.text == f"simulated transcription of {len(AUDIO[1])} bytes of audio"
    translation = client.audio.translations.create(model=MODEL, file=AUDIO)
    assert translation.text.startswith("simulated translation")


def test_audio_streams_when_the_form_says_so(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/audio/transcriptions", files={"file": AUDIO},
                     data={"model": MODEL, "stream": "true"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(events) > 2 and events[-1] == "data: [DONE]"


def test_responses_follow_up_lands_on_the_replica_that_stored_it(
        client: openai.OpenAI, sims: list[SimProcess]) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions="Answer in three words.", input="Name a colour.",
        max_output_tokens=8)
    first = raw.parse()
    home = raw.headers["x-prefixgate-replica"]
    assert first.object == "response" and first.status == "completed" and first.output_text
    for _ in range(4):
        follow = client.responses.with_raw_response.create(
            model=MODEL, input="And another?", previous_response_id=first.id,
            max_output_tokens=8)
        assert follow.headers["x-prefixgate-replica"] == home
        assert follow.parse().previous_response_id == first.id
    holds = {f"s{i}": httpx.get(f"{s.base_url}/v1/responses/{first.id}").status_code
             for i, s in enumerate(sims)}
    assert holds == {r: 200 if r == home else 404 for r in holds}
    fetched = client.responses.with_raw_response.retrieve(first.id)
    assert fetched.headers["x-prefixgate-replica"] == home
    assert fetched.parse().output_text == first.output_text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(first.id)


def test_a_streamed_response_is_remembered_from_its_first_event(
        client: openai.OpenAI, gateway: GatewayProcess) -> None:
    with client.responses.with_streaming_response.create(
            model=MODEL, input="Stream a word.", stream=True, max_output_tokens=6) as raw:
        home = raw.headers["x-prefixgate-replica"]
        events = [line for line in raw.iter_lines() if line.startswith("event: ")]
    assert events[0] == "event: response.created" and events[-1] == "event: response.completed"
    stream = client.responses.create(model=MODEL, input="Stream a word.", stream=True,
                                     max_output_tokens=6)
    kinds = [event.type for event in stream]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    created = client.responses.create(model=MODEL, input="Once more.", stream=True,
                                      max_output_tokens=4)
    response_id = next(iter(created)).response.id  # type: ignore[union-attr]
    for _ in created:
        pass
    follow = client.responses.with_raw_response.create(
        model=MODEL, input="Go on.", previous_response_id=response_id, max_output_tokens=4)
    assert follow.status_code == 200
    holder = httpx.get(f"{gateway.url}/v1/responses/{response_id}")
    assert holder.headers["x-prefixgate-replica"] == follow.headers["x-prefixgate-replica"]
    assert home in {"s0", "s1"}


def test_a_second_gateway_finds_a_response_it_never_relayed(
        client: openai.OpenAI, sims: list[SimProcess]) -> None:
    first = client.responses.create(model=MODEL, input="Remember me.", max_output_tokens=4)
    holder = next(f"s{i}" for i, s in enumerate(sims)
                  if httpx.get(f"{s.base_url}/v1/responses/{first.id}").status_code == 200)
    other = GatewayProcess(gateway_settings(sims, policy="prefix")).start()
    try:
        fresh = openai.OpenAI(base_url=other.url + "/v1", api_key="unused", max_retries=0)
        raw = fresh.responses.with_raw_response.create(
            model=MODEL, input="Who am I?", previous_response_id=first.id, max_output_tokens=4)
    finally:
        other.stop()
    assert raw.headers["x-prefixgate-replica"] == holder


def test_an_unknown_response_is_vllms_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("resp_never_made")
    assert missing.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_gone")


def test_models_are_vllms_entries(client: openai.OpenAI, sims: list[SimProcess]) -> None:
    (listed,) = client.models.list().data
    assert listed.id == MODEL and listed.owned_by == "vllm"
    extra = listed.model_extra or {}
    assert extra["max_model_len"] == max_model_len(sims[0])
    assert extra["permission"][0]["object"] == "model_permission"
    assert extra["root"]
    one = client.models.retrieve(MODEL)
    assert one.id == MODEL and (one.model_extra or {})["max_model_len"] == extra["max_model_len"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_version_names_vllm_the_gateway_and_each_replica(http: httpx.Client) -> None:
    answer = http.get("/version").json()
    assert answer["version"] == "0.32.0"
    assert answer["replicas"] == {"s0": "0.32.0", "s1": "0.32.0"}
    assert answer["prefixgate"]


def test_chat_render_routes_by_prefix_and_answers_as_the_replica(
        http: httpx.Client, sims: list[SimProcess]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Render me."}]}
    through = http.post("/v1/chat/completions/render", json=body)
    assert through.status_code == 200
    assert through.json()["token_ids"] == direct(
        sims[0], "/v1/chat/completions/render", body).json()["token_ids"]


def test_error_shapes(http: httpx.Client, client: openai.OpenAI) -> None:
    unknown = http.post("/v1/no-such-route", json={})
    assert unknown.status_code == 404 and set(unknown.json()["error"]) == {
        "message", "type", "param", "code"}
    bad_json = http.post("/v1/embeddings", content=b"{oops",
                         headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "BadRequestError"
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="no-such-model", input="x")
    assert missing.value.body["param"] == "model"  # type: ignore[index]


def test_requests_vllm_accepts_are_not_refused_at_the_edge(http: httpx.Client) -> None:
    custom_role = http.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 3,
        "messages": [{"role": "user", "content": "Hi"}, {"role": "ipython", "content": "{}"}]})
    many = http.post("/v1/chat/completions", json={
        "model": MODEL, "n": 130, "max_tokens": 1,
        "messages": [{"role": "user", "content": "Hi"}]})
    assert custom_role.status_code == many.status_code == 200
    assert len(many.json()["choices"]) == 130
    embeds_only = http.post("/v1/completions", json={"model": MODEL, "prompt_embeds": "AAAA"})
    assert embeds_only.headers["x-prefixgate-replica"]  # the replica's own answer
