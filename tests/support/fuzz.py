"""Hypothesis strategies for the gateway's requests, from its own OpenAPI document.

``from_schema`` turns the JSON schemas of ``/openapi.json`` (objects, arrays,
strings, numbers, ``enum``, ``anyOf``, ``$ref``, ``required``, open
``additionalProperties``) into values that fit them; ``hostile`` is what a
careless or malicious client puts anywhere instead: integers far outside 64
bits, deep nesting, long strings, template code, control characters and
escaped surrogate pairs. ``mutated`` swaps hostile values into a fitting
body at random places, so most cases pass the edge and reach routing.
``raw_bodies`` are byte strings that are not a JSON object at all.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

JSON = dict[str, Any]

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_KEYS = st.sampled_from(["model", "messages", "prompt", "stream", "user", "cache_salt", "n",
                         "tools", "role", "content", "chat_template", "chat_template_kwargs",
                         "max_tokens", "extra", "input", "instructions", "x"]) | _TEXT


NESTED_LOOPS = "{% for i in range(8000) %}{% for j in range(8000) %}x{% endfor %}{% endfor %}"


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 2**32, 2**63, -(2**63) - 1, 2**64, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(), st.none(), _TEXT,
    st.sampled_from(["", "\x00", "\ud83d\ude00" * 3, "{{ 7*7 }}", NESTED_LOOPS,
                     "<|im_start|>system", "\u202e\u200b", "a" * 50_000]),
    st.integers(min_value=50, max_value=400).map(_nested),
)

HOSTILE = st.recursive(HOSTILE_SCALARS,
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_KEYS, inner, max_size=4), max_leaves=8)


def from_schema(schema: JSON, components: JSON, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that fit ``schema`` (refs resolved in ``components``)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(components[name], components, depth + 1))
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(s, components, depth) for s in
                          schema.get("anyOf") or schema["oneOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, components, depth)
    if kind == "array":
        items = from_schema(schema.get("items", {}), components, depth + 1)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=4)
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        return st.floats(min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
                         max_value=schema.get("maximum"), allow_nan=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "string":
        return _TEXT
    return HOSTILE_SCALARS


def _object(schema: JSON, components: JSON, depth: int) -> st.SearchStrategy[JSON]:
    properties = schema.get("properties", {})
    required = [k for k in schema.get("required", []) if k in properties]
    optional = {k: from_schema(v, components, depth + 1) for k, v in properties.items()
                if k not in required}
    fixed = st.fixed_dictionaries({k: from_schema(properties[k], components, depth + 1)
                                   for k in required}, optional=optional)
    if schema.get("additionalProperties") and depth < 2:
        extra = st.dictionaries(_TEXT, HOSTILE_SCALARS, max_size=2)
        return st.builds(lambda a, b: {**b, **a}, fixed, extra)
    return fixed


@st.composite
def mutated(draw: st.DrawFn, fitting: st.SearchStrategy[JSON]) -> JSON:
    """A fitting body with a few values (at any depth) replaced by hostile ones."""
    body = draw(fitting)
    for _ in range(draw(st.integers(0, 3))):
        target: dict[str, Any] | list[Any] = body
        while True:
            # a dict's names or a list's indices: each fits its own container
            keys: list[Any] = (list(target) if isinstance(target, dict)
                               else list(range(len(target))))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = target[key]
            if not isinstance(child, (dict, list)) or not child or draw(st.booleans()):
                target[key] = draw(HOSTILE)
                break
            target = child
    return body


ODD_BODIES = [b"", b"   ", b"null", b"[]", b"[1,2]", b'"x"', b"{", b'{"model": ',
              b'{"messages": [}', b"\xff\xfe{}", b'{"a": NaN}', b'{"a": Infinity}',
              b'{"prompt": "\\ud800"}', b'{"model": "m"} trailing',
              b'{"messages": [{"role": "user", "content": "hi \\udfff"}]}',
              b'{"input": "\\ud800", "max_tokens": 1e400}',
              b"[" * 5000 + b"]" * 5000, b'{"a":' * 2000 + b"1" + b"}" * 2000]
"""Bodies each route is also sent one by one (``RAW_BODIES`` draws them at random):
not JSON, not an object, or JSON (a lone surrogate escape, ``NaN``) that orjson refuses
and Python's reader (vLLM's) takes."""

RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(ODD_BODIES),
    HOSTILE.map(lambda v: json.dumps(v).encode()),
)


# --- heavy bodies: what may take a replica down -----------------------------------------

HANG_RULES = ("n>8,best_of>8,max_tokens>100000,max_completion_tokens>100000,logprobs>5,"
              "top_logprobs>5,messages>500,tools>64")
"""What the fuzz stage's sims are told to hang on (``engine.sim.faults``): every value
``HEAVY_VALUES`` draws is over its rule, so each heavy case is a query of death."""

_HUGE_COUNTS = [1000, 10**9, 2**31, 2**63 - 1]
_HUGE_TOKENS = [100_001, 10**9, 2**31, 2**63 - 1]


def _messages(count: int) -> list[JSON]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
            for i in range(count)]


def _tools(count: int) -> list[JSON]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "d",
                                              "parameters": {"type": "object"}}}
            for i in range(count)]


HEAVY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "n": st.sampled_from([9, *_HUGE_COUNTS]),
    "best_of": st.sampled_from([9, *_HUGE_COUNTS]),
    "max_tokens": st.sampled_from(_HUGE_TOKENS),
    "max_completion_tokens": st.sampled_from(_HUGE_TOKENS),
    "logprobs": st.sampled_from([6, 20, 10**6]),
    "top_logprobs": st.sampled_from([6, 20, 10**6]),
    "messages": st.integers(501, 4000).map(_messages),
    "tools": st.integers(65, 2000).map(_tools),
}


@st.composite
def heavy(draw: st.DrawFn, fitting: st.SearchStrategy[JSON], base: JSON) -> JSON:
    """A request with one to three heavy fields: on ``base`` (a minimal valid request,
    so most reach a replica) or on a body that fits the route's schema."""
    body = dict(base) if draw(st.booleans()) else draw(fitting)
    if not isinstance(body, dict):
        body = dict(base)
    fields = draw(st.lists(st.sampled_from(sorted(HEAVY_VALUES)), min_size=1, max_size=3,
                           unique=True))
    for field in fields:
        body[field] = draw(HEAVY_VALUES[field])
    if draw(st.booleans()):
        body["stream"] = True
    return body
