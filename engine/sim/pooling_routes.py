"""The simulator's pooling and audio routes, in vLLM 0.32's shapes.

``/v1/embeddings``, ``/pooling``, ``/classify``, ``/score`` and ``/v1/score``,
``/rerank``, ``/v1/rerank`` and ``/v2/rerank``, ``/v1/audio/transcriptions``
and ``/v1/audio/translations``. A real vLLM serves either generation or one
pooling task per model; the simulator answers them all, so one sim replica
can stand in for any. What it computes is plausible, not meaningful:

* an embedding is a deterministic unit vector of ``EMBEDDING_DIM`` floats
  from the input's token ids (the sim's tokenizer), so equal inputs embed
  equally and a text scores higher against itself than against others;
* a score (and a rerank's ``relevance_score``) is the two embeddings'
  cosine mapped into [0, 1]; a classification is ``NUM_CLASSES`` softmax
  probabilities, labelled ``LABEL_0``...;
* a transcription is a sentence naming the audio's size, as vLLM answers:
  ``{"text", "usage": {"type": "duration", "seconds"}}`` (translations
  without usage); with the form field ``stream=true`` it is vLLM's SSE
  ``transcription.chunk`` events, then ``[DONE]``.

Errors follow vLLM: a missing ``input``/``file`` is a 400 validation error, an
unknown model a 404.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.backends.form_fields import form_fields, parts
from engine.sim.protocol import validation_error
from engine.sim.responses import SSE_DONE
from engine.sim.route_io import json_response, read_json
from engine.sim.runtime import SimRuntime

EMBEDDING_DIM = 16
NUM_CLASSES = 2
AUDIO_BYTES_PER_SECOND = 32_000
"""16 kHz 16-bit mono: how long the sim says an upload lasts."""


def embed(token_ids: Sequence[int]) -> list[float]:
    vector = [0.0] * EMBEDDING_DIM
    for position, token in enumerate(token_ids):
        for dim in range(EMBEDDING_DIM):
            mixed = (token * 2654435761 + dim * 40503 + (position % 7)) % 1000
            vector[dim] += mixed / 1000 - 0.5
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [round(x / norm, 6) for x in vector]


def cosine01(a: Sequence[float], b: Sequence[float]) -> float:
    return round((sum(x * y for x, y in zip(a, b)) + 1) / 2, 6)


def pooling_usage(prompt_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
            "completion_tokens": 0, "prompt_tokens_details": None}


def _texts(value: Any, field: str) -> list[str | list[int]]:
    """A pooling input: a string, a list of strings, token ids, or lists of them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return [value["text"]]
    if isinstance(value, list) and value:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return [list(value)]
        return [item for entry in value for item in _texts(entry, field)]
    raise validation_error((field,), "Field required" if value is None else
                           "Input should be a valid string or list", value,
                           "missing" if value is None else "value_error")


def build_pooling_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    model_name = runtime.config.served_model_name

    async def token_ids(item: str | list[int]) -> list[int]:
        return item if isinstance(item, list) else await runtime.text_token_ids(item)

    async def read(request: Request, field: str) -> tuple[dict[str, Any], list[list[int]]]:
        body, _ = await read_json(request)
        model = body.get("model")
        runtime.check_model(model if isinstance(model, str) else None)
        return body, [await token_ids(item) for item in _texts(body.get(field), field)]

    def listing(prefix: str, data: list[dict[str, Any]], tokens: int) -> Response:
        return json_response({"id": f"{prefix}-{uuid.uuid4().hex}", "object": "list",
                              "created": int(time.time()), "model": model_name, "data": data,
                              "usage": pooling_usage(tokens)})

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        _, inputs = await read(request, "input")
        data = [{"index": i, "object": "embedding", "embedding": embed(ids)}
                for i, ids in enumerate(inputs)]
        return listing("embd", data, sum(map(len, inputs)))

    @router.post("/pooling")
    async def pooling(request: Request) -> Response:
        _, inputs = await read(request, "input")
        data = [{"index": i, "object": "pooling", "data": embed(ids)}
                for i, ids in enumerate(inputs)]
        return listing("pool", data, sum(map(len, inputs)))

    @router.post("/classify")
    async def classify(request: Request) -> Response:
        _, inputs = await read(request, "input")
        data = []
        for i, ids in enumerate(inputs):
            logits = embed(ids)[:NUM_CLASSES]
            exps = [math.exp(x) for x in logits]
            probs = [round(x / sum(exps), 6) for x in exps]
            data.append({"index": i, "label": f"LABEL_{probs.index(max(probs))}",
                         "probs": probs, "num_classes": NUM_CLASSES})
        return listing("classify", data, sum(map(len, inputs)))

    async def pairs(request: Request, first: str, second: str
                    ) -> tuple[dict[str, Any], list[list[int]], list[list[int]]]:
        body, _ = await read_json(request)
        for a, b in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2")):
            if a in body and first != "query":
                first, second = a, b
                break
        model = body.get("model")
        runtime.check_model(model if isinstance(model, str) else None)
        left = [await token_ids(t) for t in _texts(body.get(first), first)]
        right = [await token_ids(t) for t in _texts(body.get(second), second)]
        return body, left, right

    async def score(request: Request) -> Response:
        _, left, right = await pairs(request, "text_1", "text_2")
        if len(left) == 1:
            left = left * len(right)
        data = [{"index": i, "object": "score", "score": cosine01(embed(a), embed(b))}
                for i, (a, b) in enumerate(zip(left, right))]
        return listing("score", data, sum(map(len, left)) + sum(map(len, right)))

    async def rerank(request: Request) -> Response:
        body, query, documents = await pairs(request, "query", "documents")
        texts = _texts(body.get("documents"), "documents")
        scored = sorted(((cosine01(embed(query[0]), embed(doc)), i)
                         for i, doc in enumerate(documents)), reverse=True)
        top_n = body.get("top_n") or len(scored)
        results = [{"index": i, "document": {"text": texts[i] if isinstance(texts[i], str)
                                             else None, "multi_modal": None},
                    "relevance_score": s} for s, i in scored[:top_n]]
        tokens = len(query[0]) * len(documents) + sum(map(len, documents))
        return json_response({"id": f"rerank-{uuid.uuid4().hex}", "model": model_name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                              "results": results})

    for path in ("/score", "/v1/score"):
        router.add_api_route(path, score, methods=["POST"])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        router.add_api_route(path, rerank, methods=["POST"])

    async def audio(request: Request, translate: bool) -> Response:
        raw = await request.body()
        content_type = request.headers.get("content-type", "")
        upload = next((p for p in parts(raw, content_type) if p.name == "file"), None)
        if upload is None:
            raise validation_error(("file",), "Field required", None, "missing")
        fields = form_fields(raw, content_type, ("model", "stream"))
        runtime.check_model(fields.get("model"))
        seconds = max(1, upload.size // AUDIO_BYTES_PER_SECOND)
        text = f"simulated {'translation' if translate else 'transcription'} of " \
               f"{upload.size} bytes of audio"
        if fields.get("stream", "").lower() == "true":
            return StreamingResponse(_audio_stream(text, model_name),
                                     media_type="text/event-stream")
        if translate:
            return json_response({"text": text})
        return json_response({"text": text, "usage": {"type": "duration", "seconds": seconds}})

    async def transcriptions(request: Request) -> Response:
        return await audio(request, translate=False)

    async def translations(request: Request) -> Response:
        return await audio(request, translate=True)

    router.add_api_route("/v1/audio/transcriptions", transcriptions, methods=["POST"])
    router.add_api_route("/v1/audio/translations", translations, methods=["POST"])
    return router


async def _audio_stream(text: str, model: str) -> AsyncIterator[bytes]:
    stream_id, created = f"trsc-{uuid.uuid4().hex}", int(time.time())
    words = text.split(" ")
    for i, word in enumerate(words):
        last = i == len(words) - 1
        chunk = {"id": stream_id, "object": "transcription.chunk", "created": created,
                 "model": model, "choices": [{
                     "delta": {"content": word if i == 0 else " " + word},
                     "finish_reason": "stop" if last else None, "stop_reason": None}]}
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield SSE_DONE
