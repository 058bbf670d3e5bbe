"""The simulator's latency model as a value, and as the small file a replay takes.

``engine.sim.scheduler`` runs each engine step for::

    step_overhead_s + prefill_tokens * prefill_per_token_s
                    + sampling_seqs * decode_per_seq_s

(``sampling_seqs``: the sequences that sample a token in the step -- every
decoding one and every prompt whose last chunk it computes.)

:class:`LatencyParams` holds those three numbers. :class:`LatencyModel` adds
what else decides how a replica's steps compose -- its KV block size and
capacity, ``max_num_seqs`` and ``max_num_batched_tokens`` -- and where the
numbers came from (a fit against live replicas: ``prefixgate fit``; a
calibration against vLLM on CPU: ``python -m loadtest.calibrate``). It is
written as one JSON object::

    {"format": "prefixgate-latency-model/1",
     "step_overhead_s": 0.012, "prefill_per_token_s": 4e-05, "decode_per_seq_s": 0.0015,
     "block_size": 16, "num_blocks": 2048, "max_num_seqs": 256,
     "max_num_batched_tokens": 8192, "request_overhead_s": 0.004,
     "model": "qwen2.5-72b-instruct", "source": {...}}

``request_overhead_s`` is the time a request spends outside the engine's
steps before its first token reaches the caller: the serving front (vLLM's
API server handing the request to its engine and the first token back) and,
when the fit was told the gateway's trace, the gateway and its hop. A replay
adds it to every TTFT (and to every answer's end); ``prefixgate sim`` does
not, as a simulated replica has a serving front of its own.

``prefixgate sim --latency-model FILE`` starts a replica with it and
``prefixgate replay --latency-model FILE`` replays a trace on replicas that
behave like it. ``num_blocks`` is what the fitted replicas had (a replay may
ask for another capacity); ``source`` is free-form provenance. No numpy
here: the simulator imports this at start-up (the fit itself is
``engine.sim.latency_fit``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "prefixgate-latency-model/1"
PARAM_NAMES = ("step_overhead_s", "prefill_per_token_s", "decode_per_seq_s")


@dataclass(frozen=True, slots=True)
class LatencyParams:
    step_overhead_s: float
    prefill_per_token_s: float
    decode_per_seq_s: float

    @classmethod
    def from_vector(cls, values: Sequence[float]) -> LatencyParams:
        overhead, per_token, per_seq = (float(v) for v in values)
        return cls(overhead, per_token, per_seq)

    def vector(self) -> tuple[float, float, float]:
        return (self.step_overhead_s, self.prefill_per_token_s, self.decode_per_seq_s)

    def step_seconds(self, prefill_tokens: float, sampling_seqs: float) -> float:
        """One engine step's modeled duration."""
        return (self.step_overhead_s + prefill_tokens * self.prefill_per_token_s
                + sampling_seqs * self.decode_per_seq_s)

    def sim_flags(self) -> tuple[str, ...]:
        return (
            "--step-overhead", f"{self.step_overhead_s:.6g}",
            "--prefill-per-token", f"{self.prefill_per_token_s:.6g}",
            "--decode-per-seq", f"{self.decode_per_seq_s:.6g}",
        )  # fmt: skip

    def flag_text(self) -> str:
        return " ".join(self.sim_flags())


class LatencyModelError(ValueError):
    """A latency-model file that cannot be read (the message names the file and why)."""


@dataclass(frozen=True, slots=True)
class LatencyModel:
    params: LatencyParams
    block_size: int = 16
    num_blocks: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    model: str = ""
    source: Mapping[str, Any] = field(default_factory=dict)
    request_overhead_s: float = 0.0
    """Seconds of a request outside the engine's steps, added to a replayed TTFT."""

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise LatencyModelError(f"{name} must be positive")
        if any(value < 0 for value in self.params.vector()) or self.request_overhead_s < 0:
            raise LatencyModelError("latency parameters must not be negative")

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self.params), "block_size": self.block_size,
                "num_blocks": self.num_blocks, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "request_overhead_s": self.request_overhead_s, "model": self.model,
                "source": dict(self.source)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyModel:
        if data.get("format") != FORMAT:
            raise LatencyModelError(f"format must be {FORMAT!r}, got {data.get('format')!r}")
        missing = [name for name in PARAM_NAMES if name not in data]
        if missing:
            raise LatencyModelError(
                f"no {', '.join(missing)}: a latency model needs {', '.join(PARAM_NAMES)} "
                "(seconds; `prefixgate fit` writes them)")
        try:
            params = LatencyParams(*(float(data[name]) for name in PARAM_NAMES))
            return cls(params, block_size=int(data.get("block_size", 16)),
                       num_blocks=int(data.get("num_blocks", 2048)),
                       max_num_seqs=int(data.get("max_num_seqs", 256)),
                       max_num_batched_tokens=int(data.get("max_num_batched_tokens", 8192)),
                       model=str(data.get("model", "")), source=dict(data.get("source") or {}),
                       request_overhead_s=float(data.get("request_overhead_s", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, LatencyModelError):
                raise
            raise LatencyModelError(f"bad latency model: {exc}") from None

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> LatencyModel:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise LatencyModelError(f"{path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise LatencyModelError(f"{path}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise LatencyModelError(f"{path}: not a JSON object")
        try:
            return cls.from_dict(data)
        except LatencyModelError as exc:
            raise LatencyModelError(f"{path}: {exc}") from None
