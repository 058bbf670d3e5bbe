"""An OpenAI-compatible ``/v1/completions`` over the reference model, one model name per KV mode.

    python -m engine.vllm.kv_emulation.server --model DIR --served-model-name smollm2 --port 8100

serves ``smollm2:kv-auto`` (also plain ``smollm2``), ``smollm2:kv-fp8``,
``smollm2:kv-int8`` and ``smollm2:kv-int2`` from one loaded model, so a
baseline and its candidates are one process. The subset of vLLM's API the
quality gate and lm-eval-harness's ``local-completions`` use, in vLLM's
response shapes: ``prompt`` as text, token ids or a batch of either;
``max_tokens``; ``echo`` and legacy ``logprobs`` (tokens, token_logprobs,
top_logprobs, text_offset); vLLM's ``prompt_logprobs`` (per position
``{token_id: {logprob, rank, decoded_token}}``, the first ``null``) and
``return_token_ids``; ``stop`` strings. Decoding is greedy only: a
``temperature`` above 0 is refused. Every response says it is an emulation:
``system_fingerprint`` is ``prefixgate-kv-emulation:<mode>`` and a top-level
``kv_emulation`` object names the mode; ``/v1/models`` lists each name with
``owned_by: prefixgate-kv-emulation`` and its ``kv_cache_dtype``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from engine.vllm.kv_emulation.quantize import MODES
from engine.vllm.kv_emulation.reference import Completion, Position, ReferenceModel

OWNER = "prefixgate-kv-emulation"


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    temperature: float | None = None
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    stop: str | list[str] | None = None
    ignore_eos: bool = False


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError",
                                   "param": param, "code": status}}, status_code=status)


class EmulationApp:
    """Holds the model and the name -> mode table; ``app`` is the FastAPI application."""

    def __init__(self, reference: ReferenceModel, served_name: str) -> None:
        self.reference = reference
        self.served_name = served_name
        self.modes = {f"{served_name}:kv-{mode}": mode for mode in MODES}
        self.modes[served_name] = "auto"
        self.lock = threading.Lock()  # one forward pass at a time: the model is shared
        self.app = FastAPI(title="prefixgate KV-cache emulation")
        self.app.add_api_route("/health", self.health, methods=["GET"])
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self.app.add_api_route("/v1/completions", self.completions, methods=["POST"])

    def health(self) -> dict[str, str]:
        return {"status": "ok"}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": OWNER,
             "root": str(self.reference.model_dir), "kv_cache_dtype": mode, "emulation": True}
            for name, mode in self.modes.items()]}

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            return [self.reference.encode(prompt)]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        return [self.reference.encode(p) if isinstance(p, str) else list(p) for p in prompt]

    def completions(self, body: CompletionBody) -> Any:
        mode = self.modes.get(body.model)
        if mode is None:
            return _error(404, f"model {body.model!r} not served; one of {sorted(self.modes)}",
                          "model")
        if body.temperature:
            return _error(400, "the KV-cache emulation decodes greedily: temperature must be 0",
                          "temperature")
        prompts = self._prompts(body.prompt)
        if not prompts or not all(prompts):
            return _error(400, "empty prompt", "prompt")
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        top = max(body.logprobs or 0, body.prompt_logprobs or 0)
        choices, prompt_tokens, completion_tokens = [], 0, 0
        with self.lock:
            for index, ids in enumerate(prompts):
                done = self.reference.complete(ids, mode, max(0, body.max_tokens or 0), top, stop,
                                               body.ignore_eos)
                choices.append(self._choice(index, done, body))
                prompt_tokens += len(ids)
                completion_tokens += len(done.generated)
        return {
            "id": f"cmpl-emulation-{time.monotonic_ns()}", "object": "text_completion",
            "created": int(time.time()), "model": body.model, "choices": choices,
            "system_fingerprint": f"{OWNER}:{mode}",
            "kv_emulation": {"emulation": True, "kv_cache_dtype": mode, "backend": "transformers"},
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    def _entry(self, p: Position, top: int) -> dict[str, dict[str, Any]]:
        """vLLM's prompt_logprobs entry: the token itself, then the top ``top`` tokens."""
        out = {str(p.token_id): {"logprob": p.logprob, "rank": p.rank,
                                 "decoded_token": self.reference.token_text(p.token_id)}}
        for rank, (token_id, logprob) in enumerate(p.top[:top], start=1):
            out.setdefault(str(token_id), {"logprob": logprob, "rank": rank,
                                           "decoded_token": self.reference.token_text(token_id)})
        return out

    def _choice(self, index: int, done: Completion, body: CompletionBody) -> dict[str, Any]:
        ref = self.reference
        generated_ids = [p.token_id for p in done.generated]
        text = ref.decode(generated_ids)
        stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        for s in stops:
            if s and s in text:
                text = text[:text.index(s)]
        if body.echo:
            text = ref.decode(list(done.prompt_ids)) + text
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None,
                                  "finish_reason": done.finish_reason, "stop_reason": None}
        if body.logprobs is not None:
            positions: list[tuple[int, Position | None]] = []
            if body.echo:
                positions += list(zip(done.prompt_ids, done.prompt))
            positions += [(p.token_id, p) for p in done.generated]
            tokens = [ref.token_text(t) for t, _ in positions]
            offsets, at = [], 0
            for token in tokens:
                offsets.append(at)
                at += len(token)
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": [p.logprob if p else None for _, p in positions],
                "top_logprobs": [None if p is None else {
                    ref.token_text(t): lp for t, lp in
                    [(p.token_id, p.logprob), *p.top[:body.logprobs]]} for _, p in positions],
                "text_offset": offsets,
            }
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = [None if p is None else self._entry(p, body.prompt_logprobs)
                                         for p in done.prompt]
        if body.return_token_ids:
            choice["prompt_token_ids"] = list(done.prompt_ids)
            choice["token_ids"] = generated_ids
        return choice


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="OpenAI-compatible completions over a "
                                     "transformers model with an emulated quantized KV cache")
    parser.add_argument("--model", required=True, type=Path, help="model folder")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = ReferenceModel(args.model)
    server = EmulationApp(reference, args.served_model_name or args.model.name)
    print(f"KV-cache EMULATION serving {sorted(server.modes)} on http://{args.host}:{args.port}",
          flush=True)
    uvicorn.run(server.app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
