"""A model's chat template, rendered the way transformers renders it, on jinja2 alone.

vLLM builds a chat prompt with transformers' ``apply_chat_template``: the
tokenizer folder's Jinja template, run in a sandbox with a few helpers. The
gateway must build the very same text (its block hashes are only worth what
that agreement is worth), but transformers and the numpy it needs would be
two thirds of the gateway's install for what is, here, this module:

* where the template comes from (``read_chat_templates``), in transformers'
  order: ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``
  (the files win), else ``tokenizer_config.json``'s ``chat_template`` (a
  string, or named templates); named ones pick ``tool_use`` when the request
  has tools, else ``default`` (``TemplateSet.pick``);
* the sandbox (``ChatTemplates``): ``ImmutableSandboxedEnvironment`` with
  ``trim_blocks`` and ``lstrip_blocks``, loop controls, the ``{% generation %}``
  tag (rendered as its body), ``tojson`` without HTML escaping, ``raise_exception``,
  ``strftime_now``, and ``dict`` / ``namespace`` that refuse private names;
* what the template sees: ``messages`` (keys whose value is null dropped; what
  vLLM keeps of each message is ``engine.tokenizer.conversation``'s),
  ``tools``, ``documents`` (none), ``add_generation_prompt``, the tokenizer's
  named special tokens (``bos_token``, ``eos_token``, ... and any other
  ``*_token`` of its config) and the request's ``chat_template_kwargs``;
* ``continue_final_message``: the last message rendered open, cut where its
  text ends (transformers' tag trick, as it does it).

As of transformers 5.19, the last that vLLM 0.32 takes (it requires <5.20; later
ones also give a message's reasoning as ``thinking``);
``tests/unit/test_chat_template_parity.py`` renders a
corpus of requests with this and with transformers itself, for every
tokenizer folder at hand, and fails on the first difference.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.template_shapes import TemplateShapes

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """The template cannot render this request (a template error, ``raise_exception``)."""


@dataclass(frozen=True, slots=True)
class TemplateSet:
    """A tokenizer folder's chat templates: one unnamed, or several by name."""

    single: str | None = None
    named: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.single is not None or bool(self.named)

    def pick(self, requested: str | None, has_tools: bool) -> str:
        """The template text for a request: its own ``chat_template`` (a template, or a
        template's name), else the folder's (``tool_use`` for tools when there is one)."""
        if self.named:
            if requested is not None:
                return self.named.get(requested, requested)
            if has_tools and "tool_use" in self.named:
                return self.named["tool_use"]
            if "default" in self.named:
                return self.named["default"]
            raise ChatTemplateError(
                "this model has several chat templates and none is the default: name one "
                f"in chat_template ({', '.join(sorted(self.named))})")
        if requested is not None:
            return requested
        if self.single is None:
            raise ChatTemplateError("the tokenizer has no chat template")
        return self.single


def read_chat_templates(folder: str, config: Mapping[str, Any]) -> TemplateSet:
    """The folder's templates (``config``: its ``tokenizer_config.json``), as transformers
    finds them."""
    files: dict[str, str] = {}
    default = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(default):
        files["default"] = _read(default)
    extra = os.path.join(folder, "additional_chat_templates")
    if os.path.isdir(extra):
        for name in sorted(os.listdir(extra)):
            if name.endswith(".jinja"):
                files[name.removesuffix(".jinja")] = _read(os.path.join(extra, name))
    if files:
        return TemplateSet(files["default"]) if list(files) == ["default"] else TemplateSet(
            named=files)
    value = config.get("chat_template")
    if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
        return TemplateSet(named={str(t["name"]): str(t["template"]) for t in value
                                  if isinstance(t, Mapping) and "name" in t and "template" in t})
    if isinstance(value, Mapping):
        return TemplateSet(named={str(k): str(v) for k, v in value.items()})
    if isinstance(value, str):
        return TemplateSet(value)
    legacy = os.path.join(folder, "chat_template.json")  # processors' older format
    if os.path.isfile(legacy):
        with open(legacy, encoding="utf-8") as handle:
            text = json.load(handle).get("chat_template")
        if isinstance(text, str):
            return TemplateSet(text)
    return TemplateSet()


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The template variables transformers adds from the tokenizer's special tokens: the
    named ones, and any other ``*_token`` of the config; unset ones are left out."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if key in SPECIAL_TOKEN_NAMES or (key.endswith("_token") and key not in out):
            text = token_text(value)
            if text is not None:
                out[key] = text
    return out


def token_text(value: Any) -> str | None:
    """A token as a config writes it: its text, or an ``AddedToken``'s ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def chat_template_option(value: str) -> str:
    """The template a ``--chat-template`` value names, as vLLM reads the option: a file's
    text, or, when no such file exists and the value holds ``{``, ``}`` or a newline, the
    value itself."""
    if os.path.isfile(value):
        return _read(value)
    if any(char in value for char in "{}\n"):
        return value
    raise ChatTemplateError(f"chat template file {value} does not exist")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


# -- the sandbox ----------------------------------------------------------------------------


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with it
    (for training masks); rendering a prompt, it is its body."""

    # jinja2 annotates ``tags`` as an instance attribute; it is the class's own set
    tags: ClassVar[set[str]] = {"generation"}  # type: ignore[misc]

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _TemplateDict:
    """``dict(...)`` in a template, without the type's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore names (no way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, dict(*rest, **kwargs))

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes ({name!r})")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def now() -> dt.datetime:
    """The clock ``strftime_now`` reads (local time, as transformers'); tests replace it."""
    return dt.datetime.now()


def _strftime_now(fmt: str) -> str:
    return now().strftime(fmt)


def sandbox() -> ImmutableSandboxedEnvironment:
    """The environment transformers renders chat templates in."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


class ChatTemplates:
    """Compiles templates once (by text) and renders conversations with them."""

    MAX_COMPILED = 64
    """Templates kept compiled, least recently used out: a request may bring its own
    ``chat_template``, so the cache must not grow with what clients send."""

    def __init__(self, fill: bool = True) -> None:
        """``fill``: render a shape of conversation seen before from its recipe
        (``engine.template_shapes``); False renders every conversation whole."""
        self._env = sandbox()
        self._compiled: OrderedDict[str, jinja2.Template] = OrderedDict()
        self._lock = threading.Lock()  # renders run on the loop and in worker threads
        self.shapes = TemplateShapes() if fill else None
        """Recipes of the shapes of conversation seen (``engine.template_shapes``)."""

    def compiled(self, text: str) -> jinja2.Template:
        with self._lock:
            template = self._compiled.get(text)
            if template is not None:
                self._compiled.move_to_end(text)
                return template
        try:
            template = self._env.from_string(text)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        with self._lock:
            self._compiled[text] = template
            while len(self._compiled) > self.MAX_COMPILED:
                self._compiled.popitem(last=False)
        return template

    def render(self, text: str, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Any] | None, add_generation_prompt: bool,
               continue_final_message: bool, variables: Mapping[str, Any]) -> str:
        """``apply_chat_template(..., tokenize=False)`` for one conversation."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt are not "
                                    "compatible")
        if tools is not None and any(not isinstance(tool, Mapping) for tool in tools):
            raise ChatTemplateError("each tool must be a JSON schema (an object)")
        chat = list(_without_nulls(messages))
        final = ""
        if continue_final_message:
            if not chat:
                raise ChatTemplateError("continue_final_message is set but there is no message")
            final = _open_final(chat, text)
        template = self.compiled(text)
        context = {"documents": None, **variables, "messages": chat,
                   "tools": list(tools) if tools is not None else None,
                   "add_generation_prompt": add_generation_prompt}
        try:
            if continue_final_message or self.shapes is None:
                rendered = template.render(context)
            else:
                rendered = self.shapes.render(text, context, template.render)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        return _cut_open(rendered, final) if continue_final_message else rendered


def _without_nulls(messages: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    for message in messages:
        yield {key: value for key, value in message.items() if value is not None}


def _open_final(chat: list[dict[str, Any]], template: str) -> str:
    """Tag the end of the final message's content (in place); returns that content."""
    last = chat[-1]
    final = last.get("content")
    if final is None:
        raise ChatTemplateError('continue_final_message is set but the final message has no '
                                '"content" to continue')
    if "content" not in template:
        raise ChatTemplateError('continue_final_message is set to "content" but this is not an '
                                "accepted field in the chat template")
    if isinstance(final, list):  # the tagged block is a copy: the caller's parts stay as sent
        for at in range(len(final) - 1, -1, -1):
            block = final[at]
            if isinstance(block, Mapping) and "text" in block:
                text = block["text"]
                last["content"] = [*final[:at], {**block, "text": text + _CONTINUE_TAG},
                                   *final[at + 1:]]
                return str(text)
        raise ChatTemplateError("continue_final_message is set but the final message has "
                                "no text to continue")
    else:
        last["content"] = final + _CONTINUE_TAG
    return str(final)


def _cut_open(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError("continue_final_message is set but the final message does not "
                                "appear in the rendered chat (the template changes it)")
    at = rendered.rindex(tag)
    if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
