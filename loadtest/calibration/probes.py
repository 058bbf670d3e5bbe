"""The probe set: seeded requests that expose an engine's latency model.

Three probes, the same for vLLM and for the simulator:

* ``prefill``: one request at a time, a prompt of ``L`` unique filler words
  (= ``L`` Qwen3 tokens; nothing in the cache shares even its first block)
  for each ``L`` in ``prompt_lengths``, ``max_tokens`` 1. TTFT vs uncached
  tokens gives the cost per prefill token and the fixed cost of a step.
* ``cached``: right after each ``prefill`` request, the same prompt again.
  All but the last block (vLLM always computes the last token) is then a
  prefix-cache hit; TTFT shows what a hit saves, ``cached_tokens`` how much
  was hit. A cold prompt that reports cached tokens stops the run: the
  target has seen this plan before.
* ``decode``: ``C`` streams sent together for each ``C`` in ``batch_sizes``,
  short unique prompts, ``max_tokens`` 64 with ``ignore_eos``. Each stream's
  TPOT; the trial's value is the median over its streams. TPOT vs ``C`` gives
  the cost per decoding sequence and, again, the fixed cost of a step.

Order and noise. One warm-up pass of the whole plan (different text, results
dropped) comes first: a CPU engine builds kernels per shape on first use.
Then ``repeats`` rounds, each visiting every length (or batch size) in a
freshly shuffled order, so drift on a shared machine spreads over all points
instead of biasing one. ``calibration.points`` reduces each point to a
median.

When the target's processes are ours (a started vLLM or simulator), each
decode trial, and each prefill round as a whole, also records how much of
the engine's core other processes took meanwhile (``calibration.cpu``).

Prompts come from ``loadtest.workloads.text.words`` keyed by the plan's seed,
the pass and the position, so two targets probed with one plan receive
byte-identical requests.

Sending and timing. Each probe is a streamed ``/v1/completions`` request
(no chat template, so a prompt of ``n`` filler words is exactly ``n`` prompt
tokens on both vLLM and the simulator) through the lean client
(``loadtest.client.LeanClient``), asking for ``continuous_usage_stats``:
every chunk then carries the completion tokens so far, and both vLLM and the
simulator send one chunk per engine step that produced a token. That count,
not the chunk's text, says how many tokens arrived (with dummy weights a
token may decode to no text at all): TTFT is send to the first chunk with a
token, TPOT the time from the first token's arrival to the last's over the
tokens after the first chunk (the client's ``ttft`` and ``token_tpot``), and
``cached_tokens`` the final usage's (vLLM needs
``--enable-prompt-tokens-details``; 0 when absent). A non-200 answer, a
broken stream or one without tokens raises :class:`CalibrationProbeError`: a
calibration with holes in it would fit nonsense.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from loadtest.calibration.cpu import CoreMeter, CoreReading, CoreShare
from loadtest.client import ChatCall, LeanClient, StreamClient
from loadtest.workloads.text import words

PREFILL = "prefill"
CACHED = "cached"
DECODE = "decode"


class CalibrationProbeError(RuntimeError):
    """A probe request failed; calibration stops rather than fit partial data."""


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """What to send: raw prompt text and how many tokens to ask for."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = True

    def chat_call(self) -> ChatCall:
        return ChatCall(conversation="probe", group="probe", turn=0, messages=(),
                        max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                        prompt=self.prompt, temperature=0.0, continuous_usage=True)


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """What one streamed request measured (seconds)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft: float
    tpot: float | None


async def timed_completion(client: StreamClient, model: str, call: CompletionCall,
                           clock: Callable[[], float]) -> StreamTiming:
    """Send ``call`` streamed and time its tokens; raises :class:`CalibrationProbeError` on
    failure."""
    outcome = await client.stream_chat(model, call.chat_call(), clock, 0.0)
    record = outcome.record
    if record.error is not None or record.ttft is None:
        raise CalibrationProbeError(record.error or "stream ended without a token")
    return StreamTiming(prompt_tokens=record.prompt_tokens or 0,
                        cached_tokens=record.cached_tokens or 0,
                        completion_tokens=record.completion_tokens or 0,
                        ttft=record.ttft, tpot=outcome.token_tpot)


@dataclass(frozen=True, slots=True)
class ProbePlan:
    prompt_lengths: tuple[int, ...] = (128, 256, 512, 1024, 1536)
    prefill_repeats: int = 9
    prefill_max_tokens: int = 1
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_repeats: int = 6
    decode_prompt_words: int = 16
    decode_max_tokens: int = 64
    warmup: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_lengths or not self.batch_sizes:
            raise ValueError("a plan needs prompt lengths and batch sizes")
        if min(self.prompt_lengths) < 2 or min(self.batch_sizes) < 1:
            raise ValueError("prompt lengths must be >= 2 and batch sizes >= 1")
        if self.prefill_repeats < 1 or self.decode_repeats < 1:
            raise ValueError("repeats must be >= 1")
        if self.decode_max_tokens < 2:
            raise ValueError("decode_max_tokens must be >= 2 to measure TPOT")


@dataclass(frozen=True, slots=True)
class PrefillSample:
    probe: str
    """``prefill`` (cold prompt) or ``cached`` (the same prompt again)."""
    length: int
    """Requested prompt length in words."""
    repeat: int
    timing: StreamTiming
    core: CoreShare | None = None

    @property
    def uncached_tokens(self) -> int:
        return self.timing.prompt_tokens - self.timing.cached_tokens


@dataclass(frozen=True, slots=True)
class DecodeSample:
    batch: int
    repeat: int
    tpots: tuple[float, ...]
    """One TPOT per stream of the trial."""
    core: CoreShare | None = None

    @property
    def tpot(self) -> float:
        return statistics.median(self.tpots)


@dataclass(frozen=True, slots=True)
class ProbeResults:
    prefill: tuple[PrefillSample, ...]
    decode: tuple[DecodeSample, ...]


class Prober:
    """Runs a :class:`ProbePlan` against one OpenAI-compatible server."""

    def __init__(
        self,
        client: StreamClient,
        model: str,
        plan: ProbePlan,
        clock: Callable[[], float],
        progress: Callable[[str], None] = lambda _: None,
        meter: CoreMeter | None = None,
    ) -> None:
        self._client = client
        self._meter = meter
        self._model = model
        self._plan = plan
        self._clock = clock
        self._progress = progress

    async def run(self) -> ProbeResults:
        plan = self._plan
        if plan.warmup:
            self._progress("warm-up pass")
            await self._prefill_pass("warmup", 1)
            await self._decode_pass("warmup", 1)
        self._progress(f"prefill: {len(plan.prompt_lengths)} lengths x {plan.prefill_repeats}")
        prefill = await self._prefill_pass("measure", plan.prefill_repeats)
        self._progress(f"decode: {len(plan.batch_sizes)} batch sizes x {plan.decode_repeats}")
        decode = await self._decode_pass("measure", plan.decode_repeats)
        return ProbeResults(tuple(prefill), tuple(decode))

    def _order(self, label: str, values: tuple[int, ...], repeat: int) -> list[int]:
        ordered = list(values)
        random.Random(f"{self._plan.seed}-{label}-order-{repeat}").shuffle(ordered)
        return ordered

    async def _prefill_pass(self, label: str, repeats: int) -> list[PrefillSample]:
        plan = self._plan
        samples: list[PrefillSample] = []
        for repeat in range(repeats):
            # One core reading per round: per-process CPU time in /proc lags by up to a
            # tick or two, too coarse for a single 50 ms request (see calibration.cpu).
            before = self._read()
            timings: list[tuple[str, int, StreamTiming]] = []
            for length in self._order(f"{label}-prefill", plan.prompt_lengths, repeat):
                prompt = words(f"calibrate-{plan.seed}-{label}-prefill-{length}-{repeat}", length)
                call = CompletionCall(prompt, plan.prefill_max_tokens)
                for probe in (PREFILL, CACHED):
                    timing = await self._send(call)
                    if probe == PREFILL and timing.cached_tokens:
                        raise CalibrationProbeError(
                            f"a cold prompt had {timing.cached_tokens} cached tokens: the "
                            "target already saw this plan (restart it or change --seed)")
                    timings.append((probe, length, timing))
            core = self._share(before)
            samples += [PrefillSample(p, n, repeat, t, core) for p, n, t in timings]
        return samples

    async def _decode_pass(self, label: str, repeats: int) -> list[DecodeSample]:
        plan = self._plan
        trials: list[DecodeSample] = []
        for repeat in range(repeats):
            for batch in self._order(f"{label}-decode", plan.batch_sizes, repeat):
                calls = [
                    CompletionCall(
                        words(f"calibrate-{plan.seed}-{label}-decode-{batch}-{repeat}-{stream}",
                              plan.decode_prompt_words),
                        plan.decode_max_tokens,
                    )
                    for stream in range(batch)
                ]
                before = self._read()
                timings = await asyncio.gather(*(self._send(call) for call in calls))
                core = self._share(before)
                tpots = tuple(t.tpot for t in timings if t.tpot is not None)
                if len(tpots) != batch:
                    raise CalibrationProbeError(
                        f"decode trial of {batch} streams returned too few tokens")
                trials.append(DecodeSample(batch, repeat, tpots, core))
        return trials

    def _read(self) -> CoreReading | None:
        # A /proc scan takes a millisecond or two; it runs outside the timed interval.
        return self._meter.read() if self._meter else None

    def _share(self, before: CoreReading | None) -> CoreShare | None:
        if self._meter is None or before is None:
            return None
        return self._meter.share(before, self._meter.read())

    async def _send(self, call: CompletionCall) -> StreamTiming:
        return await timed_completion(self._client, self._model, call, self._clock)


async def probe_server(
    base_url: str,
    model: str,
    plan: ProbePlan,
    clock: Callable[[], float],
    progress: Callable[[str], None] = lambda _: None,
    meter: CoreMeter | None = None,
    timeout: float = 300.0,
) -> ProbeResults:
    """Run ``plan`` against ``base_url`` through the lean client."""
    client = LeanClient(base_url, "unused", timeout)
    try:
        return await Prober(client, model, plan, clock, progress, meter).run()
    finally:
        await client.close()
