"""Whether vLLM hands a chat template each message's content as a string or as parts.

vLLM 0.32 (``--chat-template-content-format auto``, its default) reads the
template's syntax tree once: a template that loops over a message's content
gets the **openai** format, every message's content a list of parts
(``[{"type": "text", "text": ...}]``, a string content as one part); any other
gets the **string** format, text parts joined by newlines. Templates of
multimodal models (Gemma 3, Llama 4, Qwen2.5-VL, Mistral 3 ...) loop, and
several write a part differently from a string (Llama 4 trims a part's text,
not a string), so a gateway that always hands strings renders other tokens
than the replica does.

What counts as a loop over content, as vLLM decides it (``renderers/hf.py``):

* the names that hold the messages: ``messages``, and any name a ``set``
  assigns from one of them (through filters, tests and slices), transitively;
* the message names: the targets of ``for`` loops over those;
* a loop over ``<message>.content`` or ``<message>['content']`` (through
  filters, tests, slices); or over a macro's parameter that some call of the
  macro passes a message's content; or, outside macros, over a name
  ``content``.

A template that does not compile (a syntax error, a filter transformers does
not define), or that assigns such a name to something other than a plain
name, is ``string``, as in vLLM. ``tests/unit/test_vllm_messages.py`` holds
cases checked against vLLM's own function; 108 templates of vLLM's
repository (22 of them ``openai``) were too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Literal

import jinja2
from jinja2 import nodes

from engine.chat_template import sandbox

ContentFormat = Literal["string", "openai"]


class _Unsure(Exception):
    """A shape of template vLLM's analysis gives up on (it then assumes ``string``)."""


@functools.lru_cache(maxsize=32)
def content_format(template: str) -> ContentFormat:
    env = sandbox()
    try:
        env.from_string(template)  # compiles, as vLLM's check does: an unknown filter fails
        tree = env.parse(template)
    except jinja2.TemplateError:
        return "string"
    try:
        return "openai" if _loops_over_content(tree) else "string"
    except _Unsure:
        return "string"


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """``node`` is ``name`` (``name.key`` / ``name['key']`` with a key), maybe filtered,
    tested or sliced."""
    while True:
        if isinstance(node, nodes.Filter):
            if node.node is None:
                return False
            node = node.node
        elif isinstance(node, nodes.Test) or (
                isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)):
            node = node.node
        else:
            break
    if key is None:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
    if isinstance(node, nodes.Getitem):
        field = node.arg
        return (isinstance(field, nodes.Const) and field.value == key
                and _reads_name(node.node, name))
    if isinstance(node, nodes.Getattr):
        return node.attr == key and _reads_name(node.node, name)
    return False


def _reads_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _target(node: nodes.Node) -> str:
    if not isinstance(node, nodes.Name):
        raise _Unsure
    return node.name


def _message_lists(tree: nodes.Template) -> set[str]:
    names = {"messages"}
    todo = ["messages"]
    while todo:
        name = todo.pop()
        for assign in tree.find_all(nodes.Assign):
            if _reads(assign.node, name):
                target = _target(assign.target)
                if target not in names:
                    names.add(target)
                    todo.append(target)
    return names


def _message_names(tree: nodes.Template) -> list[str]:
    lists = _message_lists(tree)
    return [_target(loop.target) for loop in tree.find_all(nodes.For)
            if any(_reads(loop.iter, name) for name in lists)]


def _passes_content(value: nodes.Node, messages: Iterable[str]) -> bool:
    return any(_reads(value, name, "content") for name in messages)


def _loops_over_content(tree: nodes.Template) -> bool:
    messages = _message_names(tree)
    in_macros: set[int] = set()
    params_of_loop: dict[int, set[str]] = {}
    for macro in tree.find_all(nodes.Macro):
        params = [arg.name for arg in macro.args]
        given: set[str] = set()
        for call in tree.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            given.update(params[index] for index, arg in enumerate(call.args[:len(params)])
                         if _passes_content(arg, messages))
            given.update(kw.key for kw in call.kwargs
                         if kw.key in params and _passes_content(kw.value, messages))
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if given:
                params_of_loop[id(loop)] = given
    for loop in tree.find_all(nodes.For):
        source = loop.iter
        if _passes_content(source, messages):
            _target(loop.target)
            return True
        if isinstance(source, nodes.Name):
            if source.name in params_of_loop.get(id(loop), ()):
                _target(loop.target)
                return True
            if id(loop) not in in_macros and source.name == "content":
                _target(loop.target)
                return True
    return False
