"""Does the model's chat template write the current time into the prompt?

Llama 3.x templates open with ``Today Date: {{ strftime_now("%d %b %Y") }}``
unless the caller passes ``date_string``: the whole prompt then changes at
midnight, whatever the app sends. Two steps:

1. The template source (``tokenizer_config.json``'s ``chat_template``,
   ``chat_template.jinja`` or ``chat_template.json`` in the tokenizer folder,
   is checked for a clock (``strftime_now``). Templates without one cost
   nothing more. A request's own ``chat_template`` is never rendered: it is
   code the client wrote, and unbounded work (the gateway routes and lints
   such a request with the model's template, ``gateway.prompt.bounds``).
2. The request is rendered twice in a sandbox that mirrors the one
   transformers renders in, with two different injected "now"s. Where the
   two renderings differ is the injected span; the real rendering shares the
   text around it, which places the span exactly in the real prompt.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.tokenizer import RenderError, conversation
from gateway.lint.textdiff import common_prefix, common_suffix
from policies.lru import LRU

CLOCK_MARKERS = ("strftime_now",)
PROBE_NOWS = (dt.datetime(1999, 1, 1, 0, 0, 0), dt.datetime(2011, 12, 28, 23, 59, 58))
"""Two moments that differ in every field, first and last character of every format."""


@dataclass(frozen=True, slots=True)
class TemplateSource:
    text: str | None
    bos_token: str = ""
    eos_token: str = ""

    @property
    def uses_clock(self) -> bool:
        return bool(self.text) and any(m in (self.text or "") for m in CLOCK_MARKERS)


def read_template(folder: str | None) -> TemplateSource:
    """The default chat template of a Hugging Face tokenizer folder (None if there is none)."""
    if not folder:
        return TemplateSource(None)
    config: dict[str, Any] = {}
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    text = config.get("chat_template")
    if isinstance(text, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
        text = named.get("default") or next(iter(named.values()), None)
    for name in ("chat_template.jinja", "chat_template.json"):
        candidate = os.path.join(folder, name)
        if not text and os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as handle:
                raw = handle.read()
            text = json.loads(raw).get("chat_template") if name.endswith(".json") else raw
    return TemplateSource(text if isinstance(text, str) else None,
                          _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))


def _token_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value.get("content") or "")
    return value if isinstance(value, str) else ""


COMPILED_BYTES_PER_CHAR = 16
"""A compiled Jinja template's memory per character of its source (measured: ~15 KB for
a 1 KB template, with the fixed part below)."""
COMPILED_BYTES = 8192


class ClockProbe:
    """Renders a model's template in a sandbox with a fake clock.

    The compiled templates are kept in an LRU bounded in entries and estimated
    bytes (``prefixgate_memo_*{memo="compiled_templates"}``).
    """

    def __init__(self, max_templates: int = 64, max_bytes: int = 32 << 20) -> None:
        self._env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                  extensions=[jinja2.ext.loopcontrols])
        self._env.filters["tojson"] = _tojson
        self._env.globals["raise_exception"] = _raise
        self.compiled: LRU[str, jinja2.Template] = LRU(max_templates, max_bytes)

    def render(self, source: TemplateSource, body: Mapping[str, Any], now: dt.datetime) -> str:
        text = source.text
        if not isinstance(text, str):
            raise RenderError("no chat template")
        template = self.compiled.get(text)
        if template is None:
            template = self._env.from_string(text)
            self.compiled.put(text, template,
                              size=COMPILED_BYTES + COMPILED_BYTES_PER_CHAR * len(text))
        continue_final = bool(body.get("continue_final_message", False))
        kwargs = dict(body.get("chat_template_kwargs") or {})
        return template.render(
            messages=conversation(body), tools=body.get("tools") or None, documents=None,
            add_generation_prompt=bool(body.get("add_generation_prompt", not continue_final)),
            bos_token=source.bos_token, eos_token=source.eos_token,
            strftime_now=lambda fmt: now.strftime(fmt), **kwargs)

    def fills_clock(self, source: TemplateSource, body: Mapping[str, Any]) -> bool:
        """Whether the model's template writes the time for requests shaped like ``body``
        (its ``chat_template_kwargs``), on a tiny probe."""
        if not source.uses_clock:
            return False
        probe = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                 "chat_template_kwargs": body.get("chat_template_kwargs")}
        try:
            first, second = (self.render(source, probe, now) for now in PROBE_NOWS)
        except (jinja2.TemplateError, RenderError, TypeError, ValueError):
            return False
        return first != second

    def injected_span(self, source: TemplateSource, body: Mapping[str, Any],
                      rendered: str) -> tuple[int, int] | None:
        """The span of ``rendered`` that the template fills from the clock, if any."""
        if not source.uses_clock or body.get("chat_template") is not None:
            return None
        try:
            first, second = (self.render(source, body, now) for now in PROBE_NOWS)
        except (jinja2.TemplateError, RenderError, TypeError, ValueError):
            return None
        if first == second:
            return None  # the clock is not reached (for example date_string is given)
        head = common_prefix(first, second)
        tail = common_suffix(first, second, head)
        if rendered[:head] != first[:head] or (tail and rendered[-tail:] != first[-tail:]):
            return None  # the sandbox does not render exactly like the real template
        start, end = head, len(rendered) - tail
        while start > 0 and rendered[start - 1].isalnum():
            start -= 1
        while end < len(rendered) and rendered[end].isalnum():
            end += 1
        return (start, end) if end > start else None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
