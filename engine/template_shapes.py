"""A chat template rendered once per shape of conversation, then filled in.

Rendering a chat template is the largest piece of the gateway's work on a
request whose prefix it knows: jinja2's sandbox walks the whole template for
every request (0.37 ms for a two-message chat with Qwen3's). But most of what
a template writes does not depend on what the messages say, only on their
structure: how many there are, their roles, tools, the template's variables.
The text of each message goes in as a whole, sometimes trimmed.

So the second request of a *shape* (everything the template sees except the
messages' ``content`` strings, or the texts of their text parts in vLLM's "openai"
content format; a shape seen once, such as one holding a tool
call's id, may never come back, so the first only notes it) is also rendered
once more with each content string replaced by a stand-in, a ``str`` whose
text is a marker and which records what the template does with it (``_Hole``):

* **written out** (``{{ content }}``, ``+``, ``~``, ``join``): the marker lands
  in the output, where the recipe puts the content back;
* **trimmed** (``strip``, ``lstrip``, ``rstrip``, ``| trim``): a new stand-in
  for the trimmed text, which the recipe trims the same way;
* **tested** (``in``, ``==``, ``startswith``, ``endswith``, truthiness, a
  length, ``find``, ``is...``): the test is answered from the request's own
  content, so the probe takes the same branches as the real render, and the
  answer is kept as a *guard*: a later request's content must answer every
  guard the same way to use the recipe;
* **anything else** (``split``, ``replace``, ``upper``, indexing, iterating,
  hashing, a test on a concatenation, ``strftime_now``): the shape is not
  filled; every request of it is rendered whole.

The recipe (:class:`Recipe`: literal text, the stand-ins' places, the
guards) is kept only when the probe's output holds each marker intact (a
marker is made of characters that escaping, JSON, a case change or
whitespace clean-up would alter, and what is left of one elsewhere refuses
the recipe) and when filling it with the request's own contents gives the
very text jinja2 rendered. A later request of the shape whose contents pass
the guards is filled: a few string joins instead of a render.

What the template does to a copy it made by a means this cannot see (its
own filter on ``content ~ ''``, say) would make a recipe wrong for other
contents; every recipe's first uses and a sample after are also rendered
whole and compared (``audit_first``, ``audit_every``), and one difference
turns filling off for that template for good, logged and counted. The
gateway uses the text for its block hashes only (replicas render their own
prompts), so a wrong fill could cost a cache hit, never an answer.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import orjson

from policies.lru import LRU

log = logging.getLogger("prefixgate.render")

_MARK = "qZxJ"
"""The marker's core: mixed case, so a case change shows."""
_OPEN, _CLOSE = "\n \x00<" + _MARK, ">\x00 \t"
"""Around a stand-in's number: whitespace at both ends (trimming shows), NUL (JSON
escapes it), ``<>`` (HTML escapes them)."""
_SENTINEL = re.compile(re.escape(_OPEN) + r"(\d+)" + re.escape(_CLOSE))
_RESIDUE = re.compile(_MARK, re.IGNORECASE)

MAX_RECIPES = 4
"""Recipes kept per shape (a shape's contents may take different branches)."""


def _sentinel(variant: int) -> str:
    return f"{_OPEN}{variant}{_CLOSE}"


class Unfillable(Exception):
    """The template did something with a message's text that a recipe cannot replay."""


Transform = tuple[str, "str | None"]
Guard = tuple[int, str, tuple[Any, ...], Any]


def _transformed(text: str, transforms: Sequence[Transform]) -> str:
    for name, chars in transforms:
        text = getattr(text, name)(chars)
    return text


def _answer(value: str, name: str, args: tuple[Any, ...]) -> Any:
    if name == "__bool__":
        return bool(value)
    if name == "__len__":
        return len(value)
    if name == "__contains__":
        return args[0] in value
    if name == "__eq__":
        return value == args[0]
    if name == "__ne__":
        return value != args[0]
    return getattr(value, name)(*args)


@dataclass(frozen=True, slots=True)
class Recipe:
    """How one shape renders: literal text and stand-ins, and the guards on the contents."""

    parts: tuple[str | int, ...]
    """Literal text, or the index of a stand-in (into ``variants``)."""
    variants: tuple[tuple[int, tuple[Transform, ...]], ...]
    """Per stand-in: which content (by position among the holes) and how it was trimmed."""
    guards: tuple[Guard, ...]
    """(stand-in, test, arguments, the answer the recipe was made under)."""
    size: int

    def fill(self, contents: Sequence[str]) -> str | None:
        """The rendered text for these contents, or None when a guard answers otherwise."""
        values = [_transformed(contents[hole], transforms) if transforms else contents[hole]
                  for hole, transforms in self.variants]
        for variant, name, args, answer in self.guards:
            if _answer(values[variant], name, args) != answer:
                return None
        return "".join([part if type(part) is str else values[part]  # type: ignore[index]
                        for part in self.parts])


class _Probe:
    """What one probe render did with the stand-ins."""

    def __init__(self) -> None:
        self.variants: list[tuple[int, tuple[Transform, ...]]] = []
        self.guards: list[Guard] = []

    def hole(self, index: int, transforms: tuple[Transform, ...], real: str) -> _Hole:
        self.variants.append((index, transforms))
        return _Hole(self, len(self.variants) - 1, real)

    def recipe(self, output: str) -> Recipe:
        parts: list[str | int] = []
        pieces = _SENTINEL.split(output)
        for i, piece in enumerate(pieces):
            if i % 2:
                parts.append(int(piece))
            else:
                if _RESIDUE.search(piece):  # a stand-in escaped, trimmed or cut: not replayable
                    raise Unfillable("a message's text was transformed")
                if piece:
                    parts.append(piece)
        size = 256 + sum(len(p) for p in parts if type(p) is str) + 64 * len(self.guards)
        return Recipe(tuple(parts), tuple(self.variants), tuple(self.guards), size)


def _taints(args: tuple[Any, ...]) -> bool:
    return any(isinstance(arg, (_Hole, _Tainted)) for arg in args)


class _Tainted(str):
    """A plain text with a stand-in inside (a concatenation): written out as it is,
    anything else refused, since the recipe could not replay it."""

    def __add__(self, other: str) -> _Tainted:
        return _Tainted(str.__add__(self, other))

    def __radd__(self, other: str) -> _Tainted:
        return _Tainted(str.__add__(other, self))


class _Hole(str):
    """A message's text as the probe render sees it (see the module)."""

    _probe: _Probe
    _variant: int
    _real: str

    def __new__(cls, probe: _Probe, variant: int, real: str) -> Self:
        self = str.__new__(cls, _sentinel(variant))
        self._probe, self._variant, self._real = probe, variant, real
        return self

    def _guard(self, name: str, args: tuple[Any, ...]) -> Any:
        if _taints(args):
            raise Unfillable(f"{name} between two message texts")
        answer = _answer(self._real, name, args)
        if type(answer) not in (bool, int):
            raise Unfillable(f"{name} gave {type(answer).__name__}")
        self._probe.guards.append((self._variant, name, args, answer))
        return answer

    def _trim(self, name: str, chars: Any) -> _Hole:
        if chars is not None and type(chars) is not str:
            raise Unfillable(f"{name} with {type(chars).__name__}")
        index, transforms = self._probe.variants[self._variant]
        return self._probe.hole(index, transforms + ((name, chars),),
                                getattr(self._real, name)(chars))

    def __add__(self, other: str) -> _Tainted:
        if type(other) is not str and not isinstance(other, (_Hole, _Tainted)):
            raise Unfillable("+ with a non-text")
        return _Tainted(str.__add__(self, other))

    def __radd__(self, other: str) -> _Tainted:
        return _Tainted(str.__add__(other, self))

    def strip(self, chars: Any = None) -> _Hole:
        return self._trim("strip", chars)

    def lstrip(self, chars: Any = None) -> _Hole:
        return self._trim("lstrip", chars)

    def rstrip(self, chars: Any = None) -> _Hole:
        return self._trim("rstrip", chars)

    def __bool__(self) -> bool:
        return bool(self._guard("__bool__", ()))

    def __len__(self) -> int:
        return int(self._guard("__len__", ()))

    def __contains__(self, item: Any) -> bool:
        return bool(self._guard("__contains__", (item,)))

    def __eq__(self, other: object) -> bool:
        return bool(self._guard("__eq__", (other,)))

    def __ne__(self, other: object) -> bool:
        return bool(self._guard("__ne__", (other,)))

    def __hash__(self) -> int:
        raise Unfillable("a message's text hashed")


_TESTS = ("startswith", "endswith", "find", "rfind", "count", "isspace", "isalpha", "isdigit",
          "isalnum", "islower", "isupper", "istitle", "isascii", "isnumeric", "isdecimal",
          "isidentifier", "isprintable")
"""Tests answered from the request's text and kept as guards."""
_REFUSED = ("__getitem__", "__iter__", "__mod__", "__mul__", "__rmul__",
            "__lt__", "__le__", "__gt__", "__ge__", "__reversed__", "split", "rsplit",
            "splitlines", "partition", "rpartition", "replace", "lower", "upper", "title",
            "capitalize", "casefold", "swapcase", "center", "ljust", "rjust", "zfill",
            "expandtabs", "join", "format", "format_map", "encode", "translate",
            "removeprefix", "removesuffix", "index", "rindex")
"""What a recipe cannot replay; anything else is on one of the lists above."""


def _test(name: str) -> Callable[..., Any]:
    def test(self: _Hole, *args: Any) -> Any:
        return self._guard(name, args)
    test.__name__ = name
    return test


def _refused(name: str) -> Callable[..., Any]:
    def refused(self: str, *args: Any, **kwargs: Any) -> Any:
        raise Unfillable(f"{name} on a message's text")
    refused.__name__ = name
    return refused


for _name in _TESTS:
    setattr(_Hole, _name, _test(_name))
for _name in _REFUSED + ("strip", "lstrip", "rstrip", "__contains__", "__eq__", "__ne__",
                         "__len__", "__bool__", "__hash__") + _TESTS:
    setattr(_Tainted, _name, _refused(_name))
for _name in _REFUSED:
    setattr(_Hole, _name, _refused(_name))
del _name


def _refuse_clock(*args: Any, **kwargs: Any) -> str:
    raise Unfillable("the template reads the clock")


@dataclass(slots=True)
class _Shape:
    recipes: list[Recipe]
    fillable: bool = True
    uses: int = 0


class TemplateShapes:
    """Recipes per shape of conversation, bounded (least recently used out), and audited."""

    def __init__(self, entries: int = 1024, max_bytes: int = 16 << 20,
                 audit_first: int = 4, audit_every: int = 256) -> None:
        self._shapes: LRU[tuple[Any, ...], _Shape] = LRU(entries, max_bytes)
        self._lock = threading.Lock()  # renders run on the loop and in worker threads
        self.audit_first = audit_first
        self.audit_every = audit_every
        self.off: set[str] = set()
        """Templates (by text) a fill once disagreed with: rendered whole from then on."""
        self.fills = 0
        """Renders made by filling a recipe in."""
        self.audits = 0
        self.audit_failures = 0

    def render(self, template_text: str, context: dict[str, Any],
               full: Callable[[dict[str, Any]], str]) -> str:
        """``full(context)``'s text; from a recipe when this shape has one that applies."""
        if template_text in self.off:
            return full(context)
        keyed = shape_key(template_text, context)
        if keyed is None:
            return full(context)
        key, contents = keyed
        with self._lock:
            shape = self._shapes.get(key)
            if shape is None:
                # A shape seen once may never come back (a tool call's id is part of it):
                # its recipe is made the second time it is seen, not the first.
                self._shapes.put(key, _Shape([]), size=256)
        if shape is None or not shape.fillable:
            return full(context)
        for recipe in shape.recipes:
            text = recipe.fill(contents)
            if text is not None:
                return self._filled(template_text, shape, text, context, full)
        if len(shape.recipes) >= MAX_RECIPES:
            return full(context)
        text = full(context)
        made = _probe(context, contents, full)
        with self._lock:
            if made is None or made.fill(contents) != text:
                # refused (None), or a fill that differs from the render it was made beside
                shape.fillable, shape.recipes = False, []
            elif len(shape.recipes) < MAX_RECIPES:
                shape.recipes.append(made)
                self._shapes.put(key, shape, size=sum(r.size for r in shape.recipes))
        return text

    def _filled(self, template_text: str, shape: _Shape, text: str, context: dict[str, Any],
                full: Callable[[dict[str, Any]], str]) -> str:
        shape.uses += 1
        self.fills += 1
        if shape.uses > self.audit_first and self.fills % self.audit_every:
            return text
        self.audits += 1
        rendered = full(context)
        if rendered != text:
            self.audit_failures += 1
            if template_text not in self.off:
                self.off.add(template_text)
                log.warning("a chat template filled from its recipe disagreed with a full "
                            "render; this template is rendered whole from now on")
        return rendered


def shape_key(template_text: str, context: Mapping[str, Any]
              ) -> tuple[tuple[Any, ...], list[str]] | None:
    """Everything a template sees except the messages' text, and that text in order;
    None when the context is not plain JSON."""
    contents: list[str] = []
    key: list[Any] = [template_text]
    try:
        for name, value in context.items():
            if name != "messages":
                key.append((name, value if value is None or type(value) is str
                            else orjson.dumps(value)))
                continue
            for message in value:
                items: list[Any] = []
                for field, item in message.items():
                    if field == "content" and type(item) is str:
                        contents.append(item)
                        items.append(field)
                    elif field == "content" and _text_parts(item):
                        contents.extend(part["text"] for part in item)
                        items.append((field, len(item)))
                    elif item is None or type(item) is str:
                        items.append((field, item))
                    else:
                        items.append((field, orjson.dumps(item)))
                key.append(tuple(items))
    except (TypeError, AttributeError):  # not JSON, or a message that is not an object
        return None
    return tuple(key), contents


def _text_parts(content: Any) -> bool:
    """Content in vLLM's "openai" format (``engine.content_format``): text parts only, each
    ``{"type": "text", "text": str}``; each part's text is filled like a string content."""
    return type(content) is list and all(
        type(part) is dict and len(part) == 2 and part.get("type") == "text"
        and type(part.get("text")) is str for part in content)


def _probe(context: dict[str, Any], contents: Sequence[str],
           full: Callable[[dict[str, Any]], str]) -> Recipe | None:
    """The context's recipe, made by one render with stand-ins; None when refused."""
    if not contents:
        return None
    probe = _Probe()
    chat = []
    index = 0
    for message in context["messages"]:
        content = message.get("content")
        if type(content) is str:
            message = {**message, "content": probe.hole(index, (), contents[index])}
            index += 1
        elif _text_parts(content):
            message = {**message, "content": [
                {"type": "text", "text": probe.hole(index + at, (), contents[index + at])}
                for at in range(len(content))]}
            index += len(content)
        chat.append(message)
    try:
        output = full({**context, "messages": chat, "strftime_now": _refuse_clock})
        return probe.recipe(output)
    except Exception:  # noqa: BLE001 - Unfillable, or a template error under the stand-ins
        return None
