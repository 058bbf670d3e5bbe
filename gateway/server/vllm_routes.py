"""Every route of vLLM's OpenAI server that the gateway relays, and how each is routed.

Checked against vLLM 0.32's routers (``vllm/entrypoints/openai/*/api_router.py``,
``pooling/*``, ``speech_to_text/*``, ``serve/tokenize``, the Anthropic Messages
API of ``vllm/entrypoints/anthropic/api_router.py``, registered on every server that
generates, ``scale_out/*`` (render, derender, token-in-token-out: a 403 unless vLLM
runs with ``--enable-scale-out``), ``generate/*``, ``serve/sagemaker``). Not relayed:
the operator's routes that act on one engine (``/sleep``, ``/pause``, weight updates,
profiling, ``/reset_prefix_cache``), Cohere's chat (opt-in, ``VLLM_ENABLE_COHERE_API``)
and the realtime WebSocket (speech models). One table, one
handler (``api.build_router``'s ``routed``): each route is read, parsed,
routed and forwarded the same way — failover before the first byte, the
replica lease, metrics and the request log (``gateway.request.proxy``), a stream
relayed as it comes wherever vLLM streams (``"stream": true`` in a JSON
body, a ``stream`` form field, ``?stream=true`` on a stored response).

The gateway answers these itself (``gateway.server.routes``): ``GET /v1/models``
(every healthy replica's entries, merged), ``GET /v1/models/{model}`` (one
of them; vLLM has no such route, OpenAI's clients call it), ``GET
/version`` (its own and each replica's).
"""

from __future__ import annotations

from gateway.request.exchange import Route

PREFIX_ROUTES = (
    Route("chat", "/v1/chat/completions"),
    Route("completions", "/v1/completions"),
    Route("responses", "/v1/responses"),
    Route("chat", "/v1/chat/completions/render"),
    Route("completions", "/v1/completions/render"),
    Route("responses", "/v1/responses/render"),
    Route("messages", "/v1/messages", errors="anthropic"),
    Route("messages", "/v1/messages/render", errors="anthropic"),
    Route("chat_batch", "/v1/chat/completions/batch"),
    Route("generate", "/inference/v1/generate"),
    Route("invocations", "/invocations"),
)
"""Generation and render routes: by the prompt's cached blocks (a batch of chats by its
first conversation; token-in-token-out ``generate`` by its ``token_ids``; SageMaker's
``/invocations`` by the shape vLLM serves it as: ``messages`` a chat, ``prompt`` a
completion, anything else by load)."""

HOME_ROUTES = (
    Route("responses", "/v1/responses/{response_id}", routing="home", method="GET",
          body="none"),
    Route("responses", "/v1/responses/{response_id}/cancel", routing="home", body="none"),
)
"""A stored response: where it is kept."""

LOAD_ROUTES = (
    Route("tokenize", "/tokenize", routing="load"),
    Route("detokenize", "/detokenize", routing="load"),
    Route("tokenize", "/v1/messages/count_tokens", routing="load", errors="anthropic"),
    Route("detokenize", "/v1/chat/completions/derender", routing="load"),
    Route("detokenize", "/v1/completions/derender", routing="load"),
    Route("score", "/generative_scoring", routing="load"),
    Route("decisions", "/v1/systemone", routing="load"),
    Route("embeddings", "/v1/embeddings", routing="load"),
    Route("embeddings", "/v2/embed", routing="load"),
    Route("pooling", "/pooling", routing="load"),
    Route("classify", "/classify", routing="load"),
    Route("score", "/score", routing="load"),
    Route("score", "/v1/score", routing="load"),
    Route("rerank", "/rerank", routing="load"),
    Route("rerank", "/v1/rerank", routing="load"),
    Route("rerank", "/v2/rerank", routing="load"),
    Route("audio", "/v1/audio/transcriptions", routing="load", body="form"),
    Route("audio", "/v1/audio/translations", routing="load", body="form"),
)
"""No prompt cache to aim at (or nothing generated): the least loaded replica."""

ROUTES = PREFIX_ROUTES + HOME_ROUTES + LOAD_ROUTES
