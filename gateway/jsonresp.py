"""A JSON response serialised with orjson (fast, and UTF-8 without escapes)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
