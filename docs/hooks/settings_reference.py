"""The settings reference, generated from the settings model so it cannot drift.

Every field of :class:`gateway.config.Settings`, nested models included, with
its type, default, bounds, environment variable and flag, and its
description: the field's attribute docstring in ``gateway/config.py`` (or a
``Field(description=...)``). As a MkDocs hook it replaces the marker
``<!-- settings-reference -->`` in ``configuration-reference.md`` at build
time; run as a script it prints the same Markdown::

    .venv/bin/python docs/hooks/settings_reference.py

``tests/unit/test_docs_reference.py`` fails when a field has no description.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway import config, serve_cli
from gateway.config import Settings

MARKER = "<!-- settings-reference -->"
PAGE = "configuration-reference.md"

FLAG_KEYS = {"replica": "replicas", "replicas_from": "replicas_from", "model": "models",
             "tokenizer": "tokenizer", "embedded": "embedded.kind",
             "embedded_replicas": "embedded.replicas"}
"""``prefixgate serve`` flags whose destination is not the key's own name (``gateway.serve_cli``)."""
ENV_KEYS = {"PREFIXGATE_REPLICAS": "replicas", "PREFIXGATE_REPLICAS_FROM": "replicas_from",
            "PREFIXGATE_MODEL": "models"}
"""Environment variables read beside the scalars of ``config._ENV_SCALARS``."""


@dataclass(frozen=True)
class Key:
    path: str
    """Dotted key; ``[]`` marks an item of a list (``replicas[].url``)."""
    type: str
    default: str
    bounds: str
    env: str
    flag: str
    description: str


@dataclass(frozen=True)
class Section:
    path: str
    """Where the model sits (``""`` for the top level, ``replicas[]``, ``breaker.slow``)."""
    model: type[BaseModel]
    keys: list[Key]


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string literal right after its assignment in the class body."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (directly, optionally, or as list items), and if in a list."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model, listed = _nested_model(arg)
            if model is not None:
                return model, listed
        return None, False
    if origin is list:
        model, _ = _nested_model(typing.get_args(annotation)[0])
        return model, model is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        optional = " or null" if type(None) in args else ""
        return " or ".join(names) + optional
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    scalars: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return scalars.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _size(value: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f" ({value >> shift} {unit})"
    return ""


def default_text(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, dict)):
        return f"`{value!r}`" if value else ("`[]`" if isinstance(value, list) else "`{}`")
    if isinstance(value, int) and name.endswith("bytes"):
        return f"`{value}`{_size(value)}"
    return f"`{value}`"


def bounds_text(field: FieldInfo) -> str:
    signs = {annotated_types.Gt: (">", "gt"), annotated_types.Ge: ("≥", "ge"),
             annotated_types.Lt: ("<", "lt"), annotated_types.Le: ("≤", "le")}
    out = []
    for item in field.metadata:
        for kind, (sign, attribute) in signs.items():
            if isinstance(item, kind):
                out.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            out.append(f"length ≥ {item.min_length}")
    return ", ".join(out)


def _flags() -> dict[str, str]:
    """Settings key -> the ``prefixgate serve`` flag(s) that set it."""
    out: dict[str, list[str]] = {}
    for action in serve_cli.build_parser()._actions:
        if not action.option_strings or action.dest in ("help", "config"):
            continue
        key = FLAG_KEYS.get(action.dest, action.dest)
        out.setdefault(key, []).append(action.option_strings[0])
    return {key: ", ".join(f"`{flag}`" for flag in flags) for key, flags in out.items()}


def _envs() -> dict[str, str]:
    out: dict[str, list[str]] = {}
    pairs = [(f"PREFIXGATE_{suffix}", key) for suffix, key in config._ENV_SCALARS.items()]
    for env, key in [*pairs, *ENV_KEYS.items()]:
        out.setdefault(key, []).append(env)
    return {key: ", ".join(f"`{env}`" for env in envs) for key, envs in out.items()}


def sections(model: type[BaseModel] = Settings, path: str = "") -> Iterator[Section]:
    """The model's section, then each nested model's, depth first."""
    docs = attribute_docstrings(model)
    flags, envs = _flags(), _envs()
    keys, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        inner, listed = _nested_model(field.annotation)
        default = default_text(name, field)
        if inner is not None:
            nested.append((inner, key + ("[]" if listed else "")))
            if default == "see below":
                default = f"[see below](#{slug(key)})"
        keys.append(Key(path=key, type=type_name(field.annotation), default=default,
                        bounds=bounds_text(field), env=envs.get(key, ""),
                        flag=flags.get(key, ""),
                        description=field.description or docs.get(name, "")))
    yield Section(path=path, model=model, keys=keys)
    for inner, key in nested:
        yield from sections(inner, key)


def slug(path: str) -> str:
    """The anchor of a section's heading, as the ``toc`` extension makes it."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", path).strip().lower())


def every_key() -> list[Key]:
    return [key for section in sections() for key in section.keys]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    lines: list[str] = []
    for section in sections():
        title = f"`{section.path}`" if section.path else "Top level"
        lines += [f"### {title}", ""]
        intro = inspect.getdoc(section.model) or ""
        if intro and section.model.__doc__:  # the model's own docstring, not BaseModel's
            lines += [" ".join(intro.split("\n\n")[0].split()), ""]
        lines += ["| key | type | default | env / flag | description |",
                  "|---|---|---|---|---|"]
        for key in section.keys:
            where = "<br>".join(part for part in (key.flag, key.env) if part)
            kind = f"{key.type}, {key.bounds}" if key.bounds else key.type
            anchor = "key-" + key.path.replace("[]", "").replace(".", "-").replace("_", "-")
            lines.append(f'| <a id="{anchor}"></a>`{key.path}` | {kind} | {key.default} '
                         f"| {where} | {_cell(key.description)} |")
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, render())


if __name__ == "__main__":
    sys.stdout.write(render())
