"""A value that a JSON Schema accepts, drawn deterministically from a RNG.

The simulator answers ``response_format`` ``json_schema`` and tool calls with
JSON generated from the schema (what guided decoding guarantees a real model
produces), so ``client.chat.completions.parse(...)``, LangChain's
``with_structured_output`` and agent frameworks get output their validators
accept. Supported, as pydantic and the OpenAI SDKs write schemas:

* ``type`` (one or a list; ``null`` is picked only when nothing else is
  allowed), ``enum``, ``const``, ``default`` is ignored;
* objects: every listed property (only the ``required`` ones past
  ``MAX_DEPTH``, so recursive schemas end), ``additionalProperties`` is never
  needed; arrays: ``items``, ``prefixItems``, ``minItems``/``maxItems``,
  ``uniqueItems`` (best effort);
* strings: ``minLength``/``maxLength``, ``format`` date-time, date, time,
  email, uri/url, uuid, ipv4, hostname; numbers: ``minimum``, ``maximum``,
  ``exclusiveMinimum``/``exclusiveMaximum``, ``multipleOf``;
* ``$ref`` to ``#/...`` of the same document (``$defs``, ``definitions``),
  ``allOf`` (merged), ``anyOf``/``oneOf`` (the first branch that is not
  ``null``, or ``null`` past ``MAX_DEPTH``).

Not supported: ``pattern`` (a string is generated without it),
``not``, ``if``/``then``/``else``, ``dependentSchemas``, remote ``$ref``.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from typing import Any

from engine.sim.textgen import VOCABULARY

MAX_DEPTH = 6
"""Nesting past which only required properties, empty arrays and nulls are drawn."""

_FORMATS = {
    "date": lambda rng: f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "time": lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00",
    "email": lambda rng: f"{rng.choice(VOCABULARY)}@example.com",
    "uri": lambda rng: f"https://example.com/{rng.choice(VOCABULARY)}",
    "url": lambda rng: f"https://example.com/{rng.choice(VOCABULARY)}",
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "ipv4": lambda rng: f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
    "hostname": lambda rng: f"{rng.choice(VOCABULARY)}.example.com",
}
_FORMATS["date-time"] = lambda rng: f"{_FORMATS['date'](rng)}T{_FORMATS['time'](rng)}Z"


class SchemaValues:
    """Values for one schema document (its ``$ref`` targets resolve within it)."""

    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self.root = root
        self.rng = rng

    def value(self, schema: Any = None, depth: int = 0) -> Any:
        schema = self.root if schema is None else schema
        if schema is True or not isinstance(schema, Mapping):
            return self._words(1, 3)
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                return self.value(self._pick_branch(branches, depth), depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self.value(self._merge(schema), depth + 1)
        kind = self._type(schema, depth)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    # -- structure ---------------------------------------------------------------

    def _resolve(self, schema: Mapping[str, Any], hops: int = 0) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#") or hops > 32:
            return schema
        target: Any = self.root
        for part in ref[1:].split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                return {}
            target = target[part]
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        resolved = self._resolve(target, hops + 1) if isinstance(target, Mapping) else {}
        return {**resolved, **siblings}

    def _pick_branch(self, branches: list[Any], depth: int) -> Any:
        def is_null(branch: Any) -> bool:
            return isinstance(branch, Mapping) and self._resolve(branch).get("type") == "null"

        if depth >= MAX_DEPTH:
            nulls = [branch for branch in branches if is_null(branch)]
            if nulls:
                return nulls[0]
        return next((branch for branch in branches if not is_null(branch)), branches[0])

    def _merge(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        properties: dict[str, Any] = dict(merged.get("properties") or {})
        required: list[str] = list(merged.get("required") or [])
        for part in schema["allOf"]:
            part = self._resolve(part) if isinstance(part, Mapping) else {}
            for key, value in part.items():
                if key == "properties" and isinstance(value, Mapping):
                    properties.update(value)
                elif key == "required" and isinstance(value, list):
                    required += [name for name in value if name not in required]
                else:
                    merged.setdefault(key, value)
        if properties:
            merged["properties"] = properties
        if required:
            merged["required"] = required
        return merged

    def _type(self, schema: Mapping[str, Any], depth: int) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [name for name in kind if name != "null"]
            if not concrete or (depth >= MAX_DEPTH and "null" in kind):
                return "null"
            return str(concrete[0])
        if isinstance(kind, str):
            return kind
        if "properties" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return "string"

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        required = set(required) if isinstance(required, list) else set()
        out: dict[str, Any] = {}
        for name, sub in properties.items():
            if depth >= MAX_DEPTH and name not in required:
                continue
            out[str(name)] = self.value(sub, depth + 1)
        for name in sorted(str(n) for n in required if n not in properties):
            out[name] = self._words(1, 2)
        minimum = schema.get("minProperties")
        extra = schema.get("additionalProperties")
        if isinstance(minimum, int) and len(out) < minimum and extra is not False:
            for position in range(minimum - len(out)):
                out[f"key{position}"] = self.value(extra if isinstance(extra, Mapping)
                                                   else {"type": "string"}, depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        low = schema.get("minItems")
        low = low if isinstance(low, int) and low > 0 else 0
        high = schema.get("maxItems")
        high = high if isinstance(high, int) and high >= low else low + 2
        count = low if depth >= MAX_DEPTH else self.rng.randint(low, max(low, min(high, low + 2)))
        count = max(count, min(len(prefix), high))
        items = schema.get("items")
        out: list[Any] = []
        for position in range(count):
            sub = prefix[position] if position < len(prefix) else items
            value = self.value(sub if sub is not None else {"type": "string"}, depth + 1)
            if schema.get("uniqueItems"):
                for _ in range(8):
                    if value not in out:
                        break
                    value = self.value(sub if sub is not None else {"type": "string"}, depth + 1)
                if value in out:
                    break
            out.append(value)
        return out

    # -- scalars -----------------------------------------------------------------

    def _words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choice(VOCABULARY) for _ in range(self.rng.randint(low, high)))

    def _string(self, schema: Mapping[str, Any]) -> str:
        fmt = schema.get("format")
        text = _FORMATS[fmt](self.rng) if fmt in _FORMATS else self._words(1, 4)
        low = schema.get("minLength")
        high = schema.get("maxLength")
        if isinstance(low, int):
            while len(text) < low:
                text += " " + self.rng.choice(VOCABULARY)
        if isinstance(high, int) and len(text) > high:
            text = text[:high].rstrip() if high else ""
            text = text if not isinstance(low, int) or len(text) >= low else text.ljust(low, "x")
        return text

    def _bounds(self, schema: Mapping[str, Any], step: float) -> tuple[float, float]:
        low, high = -1000.0, 1000.0
        if isinstance(schema.get("minimum"), (int, float)):
            low = float(schema["minimum"])
        if isinstance(schema.get("exclusiveMinimum"), (int, float)):
            low = max(low, float(schema["exclusiveMinimum"]) + step)
        if isinstance(schema.get("maximum"), (int, float)):
            high = float(schema["maximum"])
        if isinstance(schema.get("exclusiveMaximum"), (int, float)):
            high = min(high, float(schema["exclusiveMaximum"]) - step)
        if low > high:
            return low, low
        if low == -1000.0 and high >= 0:  # only an upper bound, or none: small, positive
            low = 0.0
        if high == 1000.0 and low <= 100:
            high = low + 100
        return low, high

    def _integer(self, schema: Mapping[str, Any]) -> int:
        low, high = self._bounds(schema, 1)
        lowest, highest = int(-(-low // 1)), int(high // 1)
        value = self.rng.randint(lowest, max(lowest, highest))
        multiple = schema.get("multipleOf")
        if isinstance(multiple, int) and multiple > 0:
            value = -(-value // multiple) * multiple
            if value > highest:
                value -= multiple
        return value

    def _number(self, schema: Mapping[str, Any]) -> float | int:
        multiple = schema.get("multipleOf")
        if isinstance(multiple, int) and multiple > 0:
            return self._integer(schema)
        low, high = self._bounds(schema, 0.01)
        value = round(self.rng.uniform(low, high), 2)
        return min(max(value, low), high)


def value_for_schema(schema: Mapping[str, Any], rng: random.Random) -> Any:
    return SchemaValues(schema, rng).value()
