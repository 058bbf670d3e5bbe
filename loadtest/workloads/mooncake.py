"""``mooncake``: replay of a Mooncake-format trace (FAST'25 release format).

Trace format: JSON Lines, one request per line::

    {"timestamp": 277, "input_length": 32140, "output_length": 92,
     "hash_ids": [198, 199, ...]}

Alibaba's Bailian (Qwen) usage traces read as well (``qwen_traceA_blksz_16.jsonl``:
a line with ``chat_id``; its ``timestamp`` in seconds, 16 tokens an id), the
traces the gateway writes (their ``block_size``): ``gateway.trace.format``; and,
as ``prefixgate replay`` reads them (``gateway.trace.files``), gzip'd files and the
Azure LLM inference and BurstGPT CSVs, whose requests have no hash ids.

``timestamp`` is the arrival in milliseconds, lengths are tokens, and each
hash id stands for one block of ``trace_block_tokens`` (512) prompt tokens:
equal ids at the same position mean an equal prefix up to that block. The
last block of a prompt may be partial (``input_length`` is not a multiple of
512); what the ids do not cover (a tail shorter than a block, a request with no
ids) is words of the request's own.

Replay. Each hash id becomes a fixed run of words (:func:`.text.words`
keyed by the id), so equal ids give equal text and therefore equal tokens;
the prompt is the concatenation of its blocks, the last one cut to the
remaining length, sent as one user message. Scaling, to fit small replicas:

* ``length_scale``: a block becomes ``round(512 * length_scale)`` tokens
  (at least 1) and the prompt ``round(input_length * length_scale)``;
* ``output_scale`` / ``max_output_len``: answer length
  ``min(max_output_len, max(1, round(output_length * output_scale)))``;
* ``time_scale``: replay speed; arrival = (timestamp - first) / 1000 /
  ``time_scale`` seconds (2 replays twice as fast);
* ``family_sample``: keep one prefix family in ``K`` — the requests whose
  first hash id hashes to 0 modulo ``K`` (a stable BLAKE2 hash) — so the
  trace thins out while every kept family keeps all its requests and
  therefore its reuse (taking the first N requests instead keeps mostly
  cold starts: reuse in the trace is long-range);
* ``offset`` / ``limit``: which requests of the (sampled) trace, in order of
  arrival (the records are sorted by timestamp first: an unsorted file paces as a
  sorted one).

The default trace is ``../shared/data/mooncake/`` beside the repository root
(the layout of the development machines and CI); a directory means the one
``*.jsonl`` file in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.trace.files import read_trace
from gateway.trace.format import TraceFormatError, arrival_and_block
from loadtest.workloads.base import Conversation, Pacing, Turn, Workload
from loadtest.workloads.text import words

TRACE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_tokens: int = TRACE_BLOCK_TOKENS
    """Tokens per hash id: 512 (Mooncake), 16 (a Bailian line), or the line's
    ``block_size`` (a trace the gateway wrote)."""


@dataclass(frozen=True, slots=True)
class MooncakeParams:
    trace: str | None = None
    """File or folder; ``None``: ``../shared/data/mooncake`` from the repo root."""
    length_scale: float = 1 / 16
    output_scale: float = 1.0
    max_output_len: int = 256
    time_scale: float = 1.0
    family_sample: int = 1
    offset: int = 0
    limit: int | None = None
    trace_block_tokens: int | None = None
    """Tokens per hash id; ``None``: what each line's format says (512 for Mooncake,
    16 for a Bailian usage trace, a gateway trace's ``block_size``)."""
    concurrency: int | None = None
    """Cap on requests in flight (default: none, pure trace timing)."""

    def __post_init__(self) -> None:
        if self.length_scale <= 0 or self.output_scale <= 0 or self.time_scale <= 0:
            raise ValueError("length_scale, output_scale and time_scale must be positive")
        if (self.max_output_len <= 0 or self.offset < 0
                or (self.trace_block_tokens is not None and self.trace_block_tokens <= 0)):
            raise ValueError("max_output_len and trace_block_tokens must be positive")
        if self.family_sample <= 0:
            raise ValueError("family_sample must be positive")
        if self.limit is not None and self.limit <= 0:
            raise ValueError("limit must be positive")


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_trace_path() -> Path:
    return repo_root().parent / "shared" / "data" / "mooncake"


def resolve_trace(path: str | None) -> Path:
    """The trace file: the given file, the one ``*.jsonl`` in a folder, or the default."""
    candidate = Path(path) if path else default_trace_path()
    if candidate.is_dir():
        files = sorted(candidate.glob("*.jsonl"))
        if len(files) != 1:
            raise FileNotFoundError(
                f"{candidate}: expected exactly one *.jsonl trace, found {len(files)}"
            )
        return files[0]
    if not candidate.is_file():
        raise FileNotFoundError(f"mooncake trace not found: {candidate}")
    return candidate


def parse_trace(lines: Iterable[str]) -> list[TraceRecord]:
    """Records of a Mooncake JSONL trace; blank lines are skipped, bad ones named."""
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            arrival_ms, block_tokens = arrival_and_block(item)
            record = TraceRecord(
                timestamp_ms=arrival_ms,
                input_length=int(item["input_length"]),
                output_length=int(item["output_length"]),
                hash_ids=tuple(int(h) for h in item["hash_ids"]),
                block_tokens=block_tokens,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"trace line {number}: {exc!r}") from None
        if record.input_length <= 0:
            raise ValueError(f"trace line {number}: empty prompt")
        records.append(record)
    return records


def prompt_text(record: TraceRecord, params: MooncakeParams, tail: str = "") -> str:
    """The prompt of one record: its blocks' words, the last block cut to length, then
    words keyed by ``tail`` (the request's own) for what its ids do not cover."""
    block_words = max(1, round((params.trace_block_tokens or record.block_tokens)
                               * params.length_scale))
    total = max(1, round(record.input_length * params.length_scale))
    pieces = []
    remaining = total
    for hash_id in record.hash_ids:
        if remaining <= 0:
            break
        take = min(block_words, remaining)
        block = words(f"mooncake/block/{hash_id}", block_words)
        pieces.append(block if take == block_words else " ".join(block.split(" ")[:take]))
        remaining -= take
    if remaining > 0:
        pieces.append(words(f"mooncake/tail/{tail}", remaining))
    return " ".join(pieces)


def family(record: TraceRecord, index: int) -> str:
    """Its prefix family: its first hash id; a record without ids is a family of its own."""
    return f"h{record.hash_ids[0]}" if record.hash_ids else f"r{index}"


def in_sample(record: TraceRecord, family_sample: int, index: int = 0) -> bool:
    """Whether the record's prefix family (its first hash id) is kept."""
    if family_sample == 1:
        return True
    key = family(record, index).removeprefix("h")  # the first id, as sampled before
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % family_sample == 0


def build_from_records(records: list[TraceRecord], params: MooncakeParams) -> Workload:
    ordered = sorted(enumerate(records), key=lambda pair: pair[1].timestamp_ms)
    chosen = [(i, r) for i, r in ordered if in_sample(r, params.family_sample, i)][params.offset:]
    if params.limit is not None:
        chosen = chosen[: params.limit]
    if not chosen:
        raise ValueError("no trace records selected (check offset/limit)")
    start = chosen[0][1].timestamp_ms
    conversations = []
    for index, (line, record) in enumerate(chosen, params.offset):
        output = min(params.max_output_len, max(1, round(record.output_length * params.output_scale)))
        conversations.append(
            Conversation(
                id=f"t{index}",
                group=family(record, line),
                turns=(Turn(prompt_text(record, params, tail=str(line)), output),),
                arrival=(record.timestamp_ms - start) / 1000.0 / params.time_scale,
            )
        )
    return Workload(
        name="mooncake",
        conversations=tuple(conversations),
        pacing=Pacing("trace", params.concurrency or 0),
        params=dataclasses.asdict(params),
    )


def build(params: MooncakeParams) -> Workload:
    path = resolve_trace(params.trace)
    try:
        records = [TraceRecord(float(line.timestamp_ms), line.input_length, line.output_length,
                               line.hash_ids, line.block_size) for line in read_trace(path)]
    except TraceFormatError as exc:
        raise ValueError(str(exc)) from None
    return build_from_records(records, dataclasses.replace(params, trace=str(path)))
