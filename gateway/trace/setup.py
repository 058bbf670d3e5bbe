"""``trace:`` in the settings -> the writer, its observer and its series (or nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.config import TraceSettings
from gateway.trace.format import TraceKey
from gateway.trace.metrics import TraceCollector
from gateway.trace.recorder import TraceRecorder
from gateway.trace.writer import TraceLimits, TraceWriter, load_secret


@dataclass(frozen=True)
class Trace:
    writer: TraceWriter
    recorder: TraceRecorder
    collector: TraceCollector


def build_trace(settings: TraceSettings, policy_name: str) -> Trace | None:
    """The trace's parts, not yet started; None when ``trace.path`` is unset."""
    if not settings.path:
        return None
    path = Path(settings.path).expanduser()
    key = TraceKey(load_secret(settings.secret, path))
    writer = TraceWriter(path, key, TraceLimits(max_bytes=settings.max_bytes, keep=settings.keep,
                                                queue=settings.queue, sample=settings.sample))
    return Trace(writer, TraceRecorder(writer, policy_name), TraceCollector(writer))
