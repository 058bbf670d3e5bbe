"""Everything one simulated replica owns, wired together, with its lifecycle.

:class:`SimRuntime` holds the renderer, prefix cache, engine, metrics and
KV-event publisher of one replica. The HTTP routes get it by closure, never
through a global. :meth:`start` loads the tokenizer (in a thread: importing
transformers takes seconds), binds the ZMQ sockets and starts the engine
loop as a task; :meth:`stop` cancels the loop and closes the publisher.

Rendering a chat request or tokenizing a prompt runs inline when the request
body is small and in a worker thread above ``render_in_thread_chars``.
Measured with the bundled Qwen3 tokenizer (render + tokenize of one chat):
200 characters 0.4 ms, 4,000 characters 1.9 ms, 32,000 characters 11 ms,
128,000 characters 54 ms; a ``to_thread`` hop costs 0.07 ms. A few
milliseconds inline would delay every other stream's next token, so bodies
over 2 KiB (about 1 ms of work) go to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from engine.sim.cache import PrefixCache
from engine.sim.config import SimConfig
from engine.sim.kv_publisher import KVEventPublisher
from engine.sim.metrics import SimMetrics
from engine.sim.protocol import bad_request, not_found_model
from engine.sim.request import EngineRequest, Status, TokenEvent
from engine.sim.scheduler import Engine
from engine.sim.textgen import OutputSpec, OutputText
from engine.sim.timings import RequestTiming, TimingLog
from engine.tokenizer import Renderer, RenderError, load_renderer

logger = logging.getLogger(__name__)

T = TypeVar("T")


def new_request_id(header_value: str | None) -> str:
    """vLLM takes the caller's ``X-Request-Id`` when given, else a random id."""
    return header_value if header_value else uuid.uuid4().hex[:16]


@dataclass(eq=False)
class Generation:
    """The ``n`` choices of one prompt, reporting into one queue."""

    prompt_token_ids: list[int]
    requests: list[EngineRequest] = field(default_factory=list)
    queue: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    timing: RequestTiming | None = None

    @property
    def finished(self) -> bool:
        return all(request.status in (Status.FINISHED, Status.ABORTED) for request in self.requests)


class SimRuntime:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.metrics = SimMetrics(config)
        self.cache = PrefixCache(config.num_blocks, config.block_size, config.seed)
        self.publisher: KVEventPublisher | None = None
        if config.kv_events_port is not None:
            host = config.kv_events_host
            replay = (
                f"tcp://{host}:{config.kv_events_replay_port}"
                if config.kv_events_replay_port is not None
                else None
            )
            self.publisher = KVEventPublisher(
                f"tcp://{host}:{config.kv_events_port}",
                replay,
                config.kv_events_topic,
                config.kv_events_buffer_steps,
            )
        self.engine = Engine(
            config,
            self.cache,
            observer=self.metrics,
            publish=self.publisher.publish if self.publisher is not None else None,
        )
        self.timings = TimingLog()
        self._renderer: Renderer | None = None
        self._loop_task: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._renderer = await asyncio.to_thread(load_renderer, self.config.tokenizer)
        if self.publisher is not None:
            self.publisher.start()
        self._loop_task = asyncio.create_task(self.engine.run(), name="sim-engine-loop")
        logger.info(
            "simulated replica %s ready: block_size=%d num_blocks=%d max_model_len=%d tokenizer=%s",
            self.config.served_model_name,
            self.config.block_size,
            self.config.num_blocks,
            self.config.max_model_len,
            self.renderer.name,
        )

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self.publisher is not None:
            await asyncio.to_thread(self.publisher.close)

    @property
    def engine_alive(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            raise RuntimeError("the simulated replica has not started")
        return self._renderer

    # -- checks and rendering --------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.served_model_name:
            raise not_found_model(model, self.config.served_model_name)

    async def _off_loop(self, size: int, work: Callable[[], T]) -> T:
        try:
            if size > self.config.render_in_thread_chars:
                return await asyncio.to_thread(work)
            return work()
        except RenderError as exc:
            raise bad_request(str(exc)) from exc

    async def chat_token_ids(
        self, body: Mapping[str, Any], size: int, add_special_tokens: bool = False
    ) -> list[int]:
        renderer = self.renderer

        def work() -> list[int]:
            if add_special_tokens:
                return renderer.text_token_ids(renderer.render_chat(body), add_special_tokens=True)
            return renderer.chat_token_ids(body)

        return await self._off_loop(size, work)

    async def chat_prompt(self, body: Mapping[str, Any], size: int) -> str:
        renderer = self.renderer
        return await self._off_loop(size, lambda: renderer.render_chat(body))

    async def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        renderer = self.renderer
        return await self._off_loop(
            len(text), lambda: renderer.text_token_ids(text, add_special_tokens)
        )

    async def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's own text (what ``echo`` logprobs name the prompt's tokens)."""
        renderer = self.renderer
        return await self._off_loop(
            len(token_ids) * 4, lambda: [renderer.decode([token]) for token in token_ids]
        )

    async def decode(self, token_ids: Sequence[int]) -> str:
        renderer = self.renderer
        return await self._off_loop(len(token_ids) * 4, lambda: renderer.decode(token_ids))

    # -- generation -----------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        spec: OutputSpec,
        n: int,
        cache_salt: str | None,
        queue: asyncio.Queue[TokenEvent] | None = None,
        index_offset: int = 0,
        scripts: Sequence[tuple[str, ...] | None] | None = None,
    ) -> Generation:
        """Queue ``n`` choices of one prompt; their events go to ``queue``
        (a new one unless given) with choice indexes from ``index_offset``.
        ``scripts`` gives each choice its own scripted answer (``OutputSpec.script``)."""
        generation = Generation(prompt_token_ids=prompt_token_ids)
        if queue is not None:
            generation.queue = queue
        emit = generation.queue.put_nowait
        for choice in range(n):
            output = OutputText(
                replace(spec, script=scripts[choice]) if scripts is not None else spec,
                prompt_token_ids,
                choice,
                self.config.seed,
                self.config.output_len_min,
                self.config.output_len_max,
            )
            request = EngineRequest(
                request_id=f"{request_id}-{choice}",
                index=index_offset + choice,
                prompt_token_ids=prompt_token_ids,
                output=output,
                emit=emit,
                cache_salt=cache_salt,
                max_tokens=spec.max_tokens,
                n=n,
            )
            generation.requests.append(request)
            self.engine.add(request)
        return generation

    def abort(self, generation: Generation) -> None:
        for request in generation.requests:
            if request.status in (Status.WAITING, Status.RUNNING):
                self.engine.abort(request)

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        done = self.engine.reset_prefix_cache(reset_running_requests)
        if not done:
            logger.warning("failed to reset the prefix cache: some blocks are still in use")
        return done
