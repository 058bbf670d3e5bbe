"""Render only what a conversation added since a turn the gateway already saw.

A chat template re-renders the whole conversation on every request, so the
cost of routing a 40-turn chat grows with all 40 turns even when the gateway
saw the first 38 on the previous request. This module keeps, per conversation
prefix that ended on a user message, where the KV block chain stood after it
(:class:`KnownTurn`), and renders a follow-up request from that point on:

* Keys. Each message is serialized (``orjson``, sorted keys) and the keys
  chain: ``key[i] = xxh3(key[i-1] + message[i-1])``, seeded with what else
  changes the rendering (model, block size, ``cache_salt``, tools, template
  kwargs, ...). The longest prefix with a :class:`KnownTurn` wins.
* The delta. The template renders a short conversation: a placeholder user
  message ``p`` (standing for the turn's last message) followed by the new
  messages, ``B = T([p] + new)``; the text ``A = T([p])`` (no generation
  prompt) is a prefix of ``B``, and what follows it is exactly what the full
  conversation adds after the turn. Templates whose output after the
  placeholder depends on the system message get it in front of both
  (``T(S + [p] + new)``). Only the delta is split, tokenized (memoized) and
  hashed, on top of the turn's chain state. Cost: one render of a few short
  messages, whatever the conversation's length; ``A`` is cached.

That equality is a property of the template, not of chat templates in
general (a template may fold the system prompt into the last user message,
or render an assistant turn differently once a user follows it). It is
checked when the tokenizer loads, on a sample of conversations at every
split point, and a template that fails is rendered whole; per request,
``B`` must start with ``A`` and have a piece boundary at the cut; and a
sample of the incremental results is re-derived from a full render off the
request path (``PromptHasher.run_audits``): one mismatch switches the
incremental path off for good and is logged and counted.

Requests that turn ``add_generation_prompt`` off or set
``continue_final_message``, or whose messages are not plain JSON objects, are
rendered whole.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

from gateway.prompt.bounds import ENTRY_BYTES, RENDER_FAILURES, text_bytes
from policies.lru import LRU

log = logging.getLogger("prefixgate.prefix")

RENDER_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "documents",
                 "reasoning_effort", "cache_salt")
"""Request fields besides ``messages`` that change the rendered prompt or its hashes."""

_hash = xxhash.xxh3_64_intdigest


PLACEHOLDER = {"role": "user", "content": "."}
"""Stands for the last message of a known turn in the short conversation."""


@dataclass(slots=True)
class KnownTurn:
    """The block chain right after a conversation prefix that ended on a user message."""

    parent: int
    carry: tuple[int, ...]
    hashes: tuple[int, ...]
    tokens: int


@dataclass(slots=True)
class Delta:
    """What a follow-up request adds after a known turn."""

    turn: KnownTurn
    text: str
    store_offset: int | None
    """Where in ``text`` the follow-up's own messages end (before the generation prompt)."""


@dataclass(slots=True)
class Keys:
    context: bytes
    prefixes: list[int] = field(default_factory=list)
    """``prefixes[i]``: key of ``messages[:i]`` (``prefixes[0]`` is the context alone)."""


class ConversationMemo:
    def __init__(self, render: Callable[[Mapping[str, Any]], str], split: re.Pattern[str],
                 turns: LRU[int, KnownTurn], audit_every: int = 64, audit_first: int = 16,
                 memo_entries: int = 4096, memo_bytes: int = 16 << 20) -> None:
        self._render = render
        self._split = split
        self.turns = turns
        """An LRU of prefix key -> :class:`KnownTurn`, weighed in blocks (and bytes)."""
        self.generation: LRU[bytes, tuple[str | None]] = LRU(memo_entries, memo_bytes)
        self.anchors: LRU[tuple[bytes, int], tuple[str | None]] = LRU(memo_entries, memo_bytes)
        """Per render context (its key bytes), the rendered texts the delta is cut by."""
        self.keep_system = False
        self.enabled = self._verify()
        self.audit_every = audit_every
        self.audit_first = audit_first
        self.incremental = 0
        self.audit_failures = 0

    # -- keys -------------------------------------------------------------------

    @staticmethod
    def keys(model: str, body: Mapping[str, Any], block_size: int) -> Keys | None:
        """Prefix keys of a chat request, or None when it must be rendered whole."""
        if body.get("add_generation_prompt", True) is not True or body.get("continue_final_message"):
            return None
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        try:
            context = orjson.dumps([model, block_size] + [body.get(f) for f in RENDER_FIELDS],
                                   option=orjson.OPT_SORT_KEYS)
            key = _hash(context)
            prefixes = [key]
            for message in messages:
                if not isinstance(message, dict):
                    return None
                key = _hash(key.to_bytes(8, "little")
                            + orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
                prefixes.append(key)
        except TypeError:  # not JSON-serializable (cannot come from a parsed request body)
            return None
        return Keys(context, prefixes)

    # -- the delta ----------------------------------------------------------------

    def delta(self, body: Mapping[str, Any], keys: Keys) -> Delta | None:
        """The text a follow-up adds after the longest known turn, or None."""
        if not self.enabled:
            return None
        messages = body["messages"]
        turn = None
        cut = 0
        for cut in range(len(messages), 0, -1):
            turn = self.turns.get(keys.prefixes[cut])
            if turn is not None:
                break
        if turn is None:
            return None
        head = self._head(messages)
        anchor = self._anchor(body, keys, head)
        if anchor is None:
            return None
        try:
            text = self._render({**body, "messages": head + [PLACEHOLDER] + messages[cut:]})
        except RENDER_FAILURES:
            return None
        if not text.startswith(anchor) or not self._split.match(text, len(anchor)):
            return None
        rest = text[len(anchor):]
        store = None
        if _role(messages[-1]) == "user":
            generation = self.generation_prompt(body, keys)
            if generation is not None and rest.endswith(generation):
                store = len(rest) - len(generation)
        self.incremental += 1
        return Delta(turn, rest, store)

    def _head(self, messages: Sequence[Any]) -> list[Any]:
        return [messages[0]] if self.keep_system and _role(messages[0]) == "system" else []

    def _anchor(self, body: Mapping[str, Any], keys: Keys, head: list[Any]) -> str | None:
        """``T(head + [placeholder])`` without a generation prompt, cached per context."""
        key = (keys.context, _hash(orjson.dumps(head, option=orjson.OPT_SORT_KEYS)) if head else 0)
        known = self.anchors.get(key)
        if known is None:
            try:
                text: str | None = self._render({**body, "messages": head + [PLACEHOLDER],
                                                 "add_generation_prompt": False})
            except RENDER_FAILURES:
                text = None
            known = (text,)
            self.anchors.put(key, known, size=_memo_size(keys.context, text))
        return known[0]

    def generation_prompt(self, body: Mapping[str, Any], keys: Keys) -> str | None:
        """The text the template appends for ``add_generation_prompt`` in this context."""
        known = self.generation.get(keys.context)
        if known is None:
            probe = [PLACEHOLDER]
            try:
                with_prompt = self._render({**body, "messages": probe})
                without = self._render({**body, "messages": probe, "add_generation_prompt": False})
            except RENDER_FAILURES:
                with_prompt = without = ""
            ok = with_prompt.startswith(without) and len(with_prompt) > len(without)
            known = (with_prompt[len(without):] if ok else None,)
            self.generation.put(keys.context, known, size=_memo_size(keys.context, known[0]))
        return known[0]

    def store_offset(self, body: Mapping[str, Any], keys: Keys, text: str) -> int | None:
        """For a whole render: where the request's own messages end, if worth a turn."""
        if not self.enabled or _role(body["messages"][-1]) != "user":
            return None
        generation = self.generation_prompt(body, keys)
        if generation is None or not text.endswith(generation):
            return None
        return len(text) - len(generation)

    def should_audit(self) -> bool:
        n = self.incremental
        return n <= self.audit_first or n % self.audit_every == 0

    def audit_failed(self, detail: str) -> None:
        self.audit_failures += 1
        if self.enabled:
            log.warning("incremental chat rendering disagreed with a full render (%s); "
                        "rendering every request whole from now on", detail)
        self.enabled = False

    # -- load-time check ------------------------------------------------------------

    def _verify(self) -> bool:
        """Does this template render every sample conversation as turn + delta?

        Tried without the system message in the short conversation first, then
        with it; the first way that reproduces every sample is used.
        """
        failures: list[str] = []
        for keep_system in (False, True):
            self.keep_system = keep_system
            failures = [problem for sample in _SAMPLES for problem in self._check(sample)]
            self.anchors.clear()
            if not failures:
                return True
        log.info("chat template is not append-only (%s); conversations are rendered whole",
                 failures[0])
        return False

    def _check(self, sample: list[dict[str, Any]]) -> list[str]:
        body = {"messages": sample}
        keys = self.keys("verify", body, 16)
        assert keys is not None
        try:
            full = self._render(body)
        except RENDER_FAILURES as exc:
            return [f"cannot render a sample: {exc}"]
        generation = self.generation_prompt(body, keys)
        if generation is None or not full.endswith(generation):
            return ["the generation prompt is not a suffix"]
        problems = []
        for cut in range(1, len(sample) + 1):
            if sample[cut - 1]["role"] != "user":
                continue
            head = self._head(sample)
            try:
                prefix = self._render({"messages": sample[:cut], "add_generation_prompt": False})
                short = self._render({"messages": head + [PLACEHOLDER] + sample[cut:]})
            except RENDER_FAILURES as exc:
                problems.append(f"cut {cut}: {exc}")
                continue
            anchor = self._anchor(body, keys, head) or ""
            if not full.startswith(prefix):
                problems.append(f"cut {cut}: the prefix renders differently once more follows")
            elif not short.startswith(anchor) or full[len(prefix):] != short[len(anchor):]:
                problems.append(f"cut {cut}: the new messages render differently without history")
            elif not self._split.match(full, len(prefix)):
                problems.append(f"cut {cut}: no special token at the cut")
        return problems


def _memo_size(context: bytes, text: str | None) -> int:
    return ENTRY_BYTES + text_bytes(context) + (text_bytes(text) if text is not None else 0)


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, Mapping) else None


_SAMPLES: list[list[dict[str, Any]]] = [
    [{"role": "system", "content": "You are a helpful assistant. 系统提示"},
     {"role": "user", "content": "Hello!\n\nHow are you?"},
     {"role": "assistant", "content": "Fine, thanks."},
     {"role": "user", "content": "  Tell me a story. "},
     {"role": "assistant", "content": "<think>\nshort\n</think>\n\nOnce upon a time."},
     {"role": "user", "content": "Another one, 你好"}],
    [{"role": "user", "content": "first question"},
     {"role": "assistant", "content": "first answer"},
     {"role": "user", "content": "second question"},
     {"role": "assistant", "content": "second answer"},
     {"role": "user", "content": "third question"}],
    [{"role": "system", "content": "Use the tools."},
     {"role": "user", "content": "What is the weather in Paris?"},
     {"role": "assistant", "content": "",
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
     {"role": "assistant", "content": "It is sunny."},
     {"role": "user", "content": "And in Rome?"}],
]
