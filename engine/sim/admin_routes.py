"""Non-generation endpoints of the simulator: the ones vLLM serves beside the
OpenAI API, and the probes peer routers send.

* ``GET /health`` (200, empty body), ``GET /version``, ``GET /v1/models``
  (vLLM's ``ModelList``, with ``max_model_len``, ``owned_by: "vllm"``, ``root``).
* ``POST /tokenize`` (chat or completion form), ``POST /detokenize``.
* ``POST /reset_prefix_cache`` (vLLM's dev endpoint: 200 even when refused
  because blocks are in use; ``?reset_running_requests=true`` preempts first).
* ``POST /v1/chat/completions/render``: vLLM's ``GenerateRequest``
  (``token_ids``, ``sampling_params``, ``model``...), which vllm-router and
  other token-aware routers read ``token_ids`` from.
* ``GET /server_info`` and ``/get_server_info``, ``GET /model_info`` and
  ``/get_model_info``: vLLM's ``{"vllm_config", "vllm_env", "system_env"}``
  merged with the SGLang-style fields sglang-router looks for.
* ``GET /metrics``: Prometheus text from the replica's own registry.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from engine.sim.protocol import (
    check_length,
    parse_sampling,
    refuse_request_template,
    require_messages,
    validation_error,
)
from engine.sim.route_io import json_response, read_json
from engine.sim.runtime import SimRuntime, new_request_id


def model_card(runtime: SimRuntime, created: int) -> dict[str, Any]:
    config = runtime.config
    return {
        "id": config.served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model_path,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


def server_info(runtime: SimRuntime) -> dict[str, Any]:
    config = runtime.config
    return {
        "vllm_config": (
            f"model='{config.model_path}', served_model_name={config.served_model_name}, "
            f"max_seq_len={config.max_model_len}, block_size={config.block_size}, "
            f"num_gpu_blocks={config.num_blocks}, max_num_seqs={config.max_num_seqs}, "
            f"max_num_batched_tokens={config.max_num_batched_tokens}, enable_prefix_caching=True"
        ),
        "vllm_env": {},
        "system_env": {},
        # What SGLang's /get_server_info carries and sglang-router reads.
        "model_path": config.model_path,
        "tokenizer_path": config.tokenizer,
        "served_model_name": config.served_model_name,
        "context_length": config.max_model_len,
        "max_model_len": config.max_model_len,
        "page_size": config.block_size,
        "block_size": config.block_size,
        "num_gpu_blocks": config.num_blocks,
        "max_total_num_tokens": config.num_blocks * config.block_size,
        "max_running_requests": config.max_num_seqs,
        "chunked_prefill_size": config.max_num_batched_tokens,
        "tp_size": 1,
        "dp_size": 1,
        "version": config.version,
        "internal_states": [],
        "simulated": True,
    }


def model_info(runtime: SimRuntime) -> dict[str, Any]:
    config = runtime.config
    return {
        "model_path": config.model_path,
        "tokenizer_path": config.tokenizer,
        "served_model_name": config.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3" if config.tokenizer else "sim",
        "architectures": ["Qwen3ForCausalLM"] if config.tokenizer else ["SimForCausalLM"],
        "max_model_len": config.max_model_len,
        "block_size": config.block_size,
    }


def build_admin_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    config = runtime.config

    @router.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if runtime.engine_alive else 503)

    @router.get("/version")
    async def version() -> Response:
        return json_response({"version": config.version})

    @router.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [model_card(runtime, int(time.time()))]})

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body, size = await read_json(request)
        model_name = body.get("model")
        runtime.check_model(model_name if isinstance(model_name, str) else None)
        if "messages" in body:
            require_messages(body)
            refuse_request_template(body)
            tokens = await runtime.chat_token_ids(
                body, size, bool(body.get("add_special_tokens", False))
            )
        elif isinstance(body.get("prompt"), str):
            tokens = await runtime.text_token_ids(
                body["prompt"], bool(body.get("add_special_tokens", True))
            )
        else:
            raise validation_error(("prompt",), "Field required", None, "missing")
        token_strs = None
        if body.get("return_token_strs"):
            token_strs = [await runtime.decode([token]) for token in tokens]
        return json_response(
            {
                "count": len(tokens),
                "max_model_len": config.max_model_len,
                "tokens": tokens,
                "token_strs": token_strs,
            }
        )

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body, _ = await read_json(request)
        model_name = body.get("model")
        runtime.check_model(model_name if isinstance(model_name, str) else None)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise validation_error(
                ("tokens",), "Input should be a valid list of integers", tokens, "list_type"
            )
        return json_response({"prompt": await runtime.decode(tokens)})

    @router.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        reset_running = (
            request.query_params.get("reset_running_requests", "false").lower() == "true"
        )
        runtime.reset_prefix_cache(reset_running)
        return Response(status_code=200)

    @router.post("/v1/chat/completions/render")
    async def render_chat(request: Request) -> Response:
        body, size = await read_json(request)
        require_messages(body)
        sampling = parse_sampling(body, chat=True)
        runtime.check_model(sampling.model)
        refuse_request_template(body)
        tokens = await runtime.chat_token_ids(
            body, size, bool(body.get("add_special_tokens", False))
        )
        max_tokens = check_length(len(tokens), sampling.max_tokens, config.max_model_len)
        return json_response(
            {
                "request_id": "chatcmpl-" + new_request_id(request.headers.get("x-request-id")),
                "token_ids": tokens,
                "features": None,
                "sampling_params": {
                    "n": sampling.n,
                    "seed": sampling.seed,
                    "stop": list(sampling.stop),
                    "ignore_eos": sampling.ignore_eos,
                    "max_tokens": max_tokens,
                    "min_tokens": sampling.min_tokens,
                    "include_stop_str_in_output": sampling.include_stop_str_in_output,
                    "temperature": body.get("temperature", 1.0),
                    "top_p": body.get("top_p", 1.0),
                },
                "model": sampling.model,
                "stream": sampling.stream,
                "stream_options": None,
                "cache_salt": sampling.cache_salt,
                "priority": body.get("priority", 0),
                "kv_transfer_params": None,
            }
        )

    @router.get("/sim/timings")
    async def timings(request: Request) -> Response:
        # Not a vLLM endpoint: the simulator's per-request timing log
        # (engine/sim/timings.py), read by latency benchmarks.
        prefix = request.query_params.get("prefix", "")
        return json_response({"clock": "perf_counter",
                              "requests": runtime.timings.dump(prefix)})

    for path in ("/server_info", "/get_server_info"):
        router.add_api_route(path, lambda: json_response(server_info(runtime)), methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        router.add_api_route(path, lambda: json_response(model_info(runtime)), methods=["GET"])

    return router
