"""The trace recorder: a lifecycle observer that hands each answered request to the writer.

Registered at start-up (``gateway.server.parts.build_observers``) when ``trace.path`` is set. It acts once per
exchange, when it is complete (``gateway.request.lifecycle``), and only for
requests routed by their prompt that a replica answered (status 200): their
arrival, prompt and completion tokens, the prompt's block hashes (keyed later,
on the writer's thread), who served it and the time to its first byte. What
it does on the request's task is build one small record and ``put_nowait``
it (``gateway.trace.writer``). Requests routed by load (no prompt the gateway
read), refused or failed ones are not recorded: a replay asks what the
replicas would have served.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent
from gateway.trace.writer import TraceRecord, TraceWriter


class TraceRecorder(Silent):
    def __init__(self, writer: TraceWriter, policy_name: str,
                 wall: Callable[[], float] = time.time,
                 perf: Callable[[], float] = time.perf_counter) -> None:
        self.writer = writer
        self.policy_name = policy_name
        self._wall = wall
        self._perf = perf

    def on_complete(self, exchange: Exchange) -> None:
        outcome, request = exchange.outcome, exchange.request
        if request is None or outcome.status != 200 or not outcome.replica_id:
            return
        usage = outcome.usage
        arrived = self._wall() - (self._perf() - exchange.started)
        salt = exchange.data.get("cache_salt")
        self.writer.offer(TraceRecord(
            timestamp_ms=int(arrived * 1000),
            input_length=(usage.prompt_tokens if usage and usage.prompt_tokens
                          else request.prompt_tokens),
            output_length=usage.completion_tokens if usage else outcome.output_tokens,
            block_hashes=request.block_hashes, block_size=request.block_size,
            cache_salt=salt if isinstance(salt, str) else None,
            model=exchange.model, replica=outcome.replica_id, policy=self.policy_name,
            stream=exchange.stream,
            ttft_ms=outcome.ttft * 1000 if outcome.ttft is not None else None,
            cached_tokens=usage.cached_tokens if usage else None,
            session_key=exchange.session_key))
