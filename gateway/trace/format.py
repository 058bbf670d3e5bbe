"""One trace line: the Mooncake trace format, keyed so that no prompt can be told from it.

A line is one JSON object, the fields of the Mooncake FAST'25 trace first::

    {"timestamp": 1767225600123, "input_length": 1043, "output_length": 87,
     "hash_ids": [5209541530461337, 881721440512098, ...],
     "block_size": 16, "model": "qwen2.5-72b-instruct", "replica": "r1",
     "policy": "prefix", "stream": true, "ttft_ms": 231.4, "cached_tokens": 1024,
     "session": 3308118405727411}

* ``timestamp``: arrival at the gateway, milliseconds since the Unix epoch (a
  Mooncake reader uses only differences, so rotated files concatenate);
* ``input_length``, ``output_length``: prompt and completion tokens;
* ``hash_ids``: one id per full KV block of the prompt, ``block_size`` tokens
  each (the replica's block size, not Mooncake's 512: routing and hits happen
  in those). Equal ids at the same position mean an equal prefix up to there;
* the rest are extra fields a Mooncake reader ignores: who served it and how
  (``replica``, ``policy``, ``stream``, ``ttft_ms`` as the gateway saw it: the
  first byte, which for an answer not streamed is its last; ``cached_tokens``
  from the replica's ``usage`` when it said), the served ``model``, and a keyed
  ``session`` id when the request carried one (``x-session-id`` or ``user``).

Keying. The gateway's block hashes are xxh3 chains over the prompt's token ids
(``policies.hashing``): anyone with the tokenizer could hash a guessed prompt
and look for it. So each id is ``BLAKE2b(key = K_salt, data = block hash)``
cut to 53 bits (an exact integer for every JSON reader), where ``K_salt`` is
``BLAKE2b(key = deployment secret, data = the request's cache salt)``:

* without the secret, an id says nothing of the prompt (BLAKE2b keyed is a
  PRF; a seeded xxh3 is not: its seed falls out of one known pair);
* two deployments (two secrets) give unrelated ids for the same prompt, so
  traces cannot be joined;
* two tenants with different cache salts (``gateway.auth.keys``) give
  unrelated ids for the same prompt, as their caches are apart in the engine;
  requests without a salt share a namespace, as they share the engine's cache.

The tail of a prompt shorter than a block has no id; ``input_length`` keeps it.

Reading, the public traces read too: a Mooncake line (milliseconds, 512 tokens an
id) and a line of Alibaba's Bailian (Qwen) usage traces, told by its ``chat_id``:
``{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521,
"output_length": 132, "type": "text", "turn": 1, "hash_ids": [...]}``, whose
``timestamp`` is in seconds and whose ids are 16 tokens each
(:func:`arrival_and_block`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

ID_BITS = 53
"""Ids stay below 2**53: exact in every JSON reader (JavaScript's numbers included)."""
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id of a trace whose lines say no ``block_size`` (Mooncake's own)."""
BAILIAN_BLOCK_TOKENS = 16
"""Tokens per hash id of an Alibaba Bailian (Qwen) usage trace (``qwen_*_blksz_16.jsonl``)."""
_PERSON_SALT = b"pg-trace-salt"
_PERSON_SESSION = b"pg-trace-sess"
_NO_SALT = b"\x00"
_SALT = b"\x01"


@dataclass(frozen=True, slots=True)
class TraceLine:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_size: int = MOONCAKE_BLOCK_TOKENS
    model: str | None = None
    replica: str | None = None
    policy: str | None = None
    stream: bool | None = None
    ttft_ms: float | None = None
    cached_tokens: int | None = None
    session: int | None = None

    def encode(self) -> bytes:
        """The JSON line, newline included; fields that are unknown are left out."""
        item: dict[str, object] = {
            "timestamp": self.timestamp_ms, "input_length": self.input_length,
            "output_length": self.output_length, "hash_ids": list(self.hash_ids),
            "block_size": self.block_size}
        for name in ("model", "replica", "policy", "stream", "cached_tokens", "session"):
            value = getattr(self, name)
            if value is not None:
                item[name] = value
        if self.ttft_ms is not None:
            item["ttft_ms"] = round(self.ttft_ms, 1)
        return orjson.dumps(item) + b"\n"


class TraceKey:
    """The deployment's keyed hash ids (module docstring). Not thread-safe: one owner
    (the trace writer's thread). Memoizes recent ids: a shared prefix is keyed once."""

    def __init__(self, secret: bytes, memo_entries: int = 1 << 20) -> None:
        if len(secret) < 16:
            raise ValueError("the trace secret must be at least 16 bytes")
        self._secret = secret[:64]
        self._namespaces: dict[str | None, tuple[hashlib.blake2b, dict[int, int]]] = {}
        self._memo_entries = memo_entries

    def _namespace(self, salt: str | None) -> tuple[hashlib.blake2b, dict[int, int]]:
        found = self._namespaces.get(salt)
        if found is None:
            if len(self._namespaces) >= 4096:  # tenants come and go: start afresh
                self._namespaces.clear()
            marker = _NO_SALT if salt is None else _SALT + salt.encode("utf-8")
            salt_key = hashlib.blake2b(marker, key=self._secret, digest_size=32,
                                       person=_PERSON_SALT).digest()
            found = (hashlib.blake2b(key=salt_key, digest_size=8), {})
            self._namespaces[salt] = found
        return found

    def block_ids(self, block_hashes: Sequence[int], salt: str | None) -> list[int]:
        base, memo = self._namespace(salt)
        if len(memo) > self._memo_entries:
            memo.clear()
        shift = 64 - ID_BITS
        out = []
        for block_hash in block_hashes:
            keyed = memo.get(block_hash)
            if keyed is None:
                hasher = base.copy()
                hasher.update(block_hash.to_bytes(8, "little"))
                keyed = memo[block_hash] = int.from_bytes(hasher.digest(), "little") >> shift
            out.append(keyed)
        return out

    def session_id(self, session_key: str) -> int:
        digest = hashlib.blake2b(session_key.encode("utf-8"), key=self._secret, digest_size=8,
                                 person=_PERSON_SESSION).digest()
        return int.from_bytes(digest, "little") >> (64 - ID_BITS)


def arrival_and_block(item: Mapping[str, Any]) -> tuple[float, int]:
    """A trace record's arrival in milliseconds and its tokens per hash id, whichever
    public format it is in: a line of a Bailian usage trace (it has ``chat_id``,
    ``parent_chat_id`` and ``turn``) gives its ``timestamp`` in seconds and 16 tokens an
    id; a Mooncake line milliseconds and 512 (or, ours, the ``block_size`` it says).

    A Mooncake line's timestamp is a whole number of milliseconds; one with a fraction
    (``61.114``) is a trace in seconds, which read as milliseconds would replay a thousand
    times too fast: it is refused (ValueError), with what to do."""
    if "chat_id" in item and "block_size" not in item:
        return _number(item, "timestamp") * 1000.0, BAILIAN_BLOCK_TOKENS
    stamp = _number(item, "timestamp")
    if abs(stamp) >= MAX_TIMESTAMP_MS:
        raise ValueError(
            f"timestamp {stamp:.0f} is past the year 5000 as milliseconds: microseconds or "
            "nanoseconds? Convert it to milliseconds first, e.g. jq -c '.timestamp |= "
            "(. / 1000 | round)' for microseconds")
    if "block_size" not in item and not stamp.is_integer():
        raise ValueError(
            f"timestamp {stamp!r} is not a whole number of milliseconds: Mooncake's timestamps "
            "are milliseconds, and a trace in seconds read as milliseconds would replay 1000 "
            "times too fast; convert it first, e.g. jq -c '.timestamp |= (. * 1000 | round)'")
    return stamp, int(item.get("block_size") or MOONCAKE_BLOCK_TOKENS)


MAX_TIMESTAMP_MS = 1e14
"""A timestamp this large is no millisecond (the year 5138): microseconds or nanoseconds."""
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _number(item: Mapping[str, Any], name: str) -> float:
    """A numeric field, or a ValueError that names it (a KeyError when it is missing)."""
    value = item[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {value!r}")
    return float(value)


def _count(item: Mapping[str, Any], name: str) -> int:
    """A token count: a whole number (a fraction or a string is refused, not cut)."""
    value = _number(item, name)
    if not value.is_integer():
        raise ValueError(f"{name} must be a whole number of tokens, not {value!r}")
    return int(value)


class TraceFormatError(ValueError):
    """A line that is not a trace record (the message names the line and why)."""


def parse_line(text: str | bytes, number: int = 0) -> TraceLine | None:
    """One record (None for a blank line); a Mooncake line without our fields reads
    with ``block_size`` 512. A bad line's error names the line, the field and why."""
    if not text.strip():
        return None
    where = f"trace line {number}"
    try:
        item = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not a JSON object on one line ({exc}); a trace is "
                               "JSON Lines, one request a line") from None
    if not isinstance(item, dict):
        raise TraceFormatError(f"{where}: a JSON {type(item).__name__}, not an object with "
                               + ", ".join(REQUIRED_FIELDS))
    try:
        ttft = item.get("ttft_ms")
        cached = item.get("cached_tokens")
        session = item.get("session")
        stream = item.get("stream")
        arrival_ms, block_size = arrival_and_block(item)
        hash_ids = item["hash_ids"]
        if not isinstance(hash_ids, list):
            raise TypeError(f"hash_ids must be a list of integers, not {hash_ids!r}")
        line = TraceLine(
            timestamp_ms=round(arrival_ms), input_length=_count(item, "input_length"),
            output_length=_count(item, "output_length"),
            hash_ids=tuple(int(h) for h in hash_ids),
            block_size=block_size,
            model=item.get("model"), replica=item.get("replica"), policy=item.get("policy"),
            stream=bool(stream) if stream is not None else None, ttft_ms=float(ttft) if ttft is not None else None,
            cached_tokens=int(cached) if cached is not None else None,
            session=int(session) if session is not None else None)
    except KeyError as exc:
        raise TraceFormatError(f"{where}: no {exc.args[0]!r} field (a trace line needs "
                               f"{', '.join(REQUIRED_FIELDS)})") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    if line.input_length <= 0 or line.output_length < 0 or line.block_size <= 0:
        raise TraceFormatError(f"{where}: lengths must be positive")
    if (not {"block_size", "chat_id"} & item.keys()
            and len(line.hash_ids) > -(-line.input_length // line.block_size)):
        raise TraceFormatError(  # a Mooncake line has one id every 512 tokens, the last cut
            f"{where}: {len(line.hash_ids)} hash ids for {line.input_length} tokens, more than "
            f"one every {line.block_size} tokens (Mooncake's): this trace's ids stand for fewer "
            "tokens, and read as 512 most of its shared prefixes would be lost; say how many "
            "with a block_size field on each line, e.g. jq -c '.block_size = 16'")
    return line


def parse_lines(lines: Iterable[str | bytes]) -> list[TraceLine]:
    out = []
    for number, text in enumerate(lines, 1):
        line = parse_line(text, number)
        if line is not None:
            out.append(line)
    return out
