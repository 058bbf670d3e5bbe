"""The prompt linter's routes.

    POST /v1/prompt/lint   lint one chat request, or {"requests": [...]} from one app (an
                           Anthropic Messages API body: as the chat request vLLM renders)
    GET  /admin/drift      prefix drift events and what each group learned (JSON)
    GET  /admin/lint       the most frequent findings in live traffic (JSON)

The body limit, JSON parsing and error shapes are the chat route's
(``api.read_body``, ``schemas``): too large is 413, bad JSON or schema 400,
an unknown model 404, a body nested deeper than ``MAX_DEPTH`` levels 400
(the linter walks every string of ``tools``). Linting renders and tokenizes,
so it runs in a worker thread.

``/admin/drift`` shows positions, lengths and hashes; the changed text only
with ``lint.text_samples`` on and for a caller admitted with an ``admin`` key:
with client keys every caller of ``/admin/*`` is one (``gateway.auth.keys``);
without ``api_keys`` nobody is, so no text is shown. The tool names in each group's
shape are prompt content too, and every tenant's: other callers see how many
tools a group has and a keyed hash of their names, not the names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from engine.tokenizer import RenderError, UnencodableText
from gateway.errors import InvalidRequest, ModelNotFound
from gateway.jsonresp import JSONResponse
from gateway.lint.model import BatchReport, LintReport
from gateway.lint.service import LintService
from gateway.lint.shapes import batch_in_body, chat_form, in_body, is_messages_api
from gateway.lint.structure import MAX_DEPTH, deeper_than
from gateway.request.body import read_body
from gateway.request.schemas import ChatBody, parse_json, validate
from gateway.request.state import GatewayState

MAX_BATCH = 1000


def lint_model(state: GatewayState, requested: object) -> str:
    known = list(dict.fromkeys(state.expected_models() + state.pool.known_models()))
    if requested is None:
        if known:
            return known[0]
        raise InvalidRequest("model: field required", param="model")
    if not isinstance(requested, str) or requested not in known:
        raise ModelNotFound(f"The model `{requested}` does not exist.", param="model")
    return requested


def _requests(data: dict[str, Any]) -> list[dict[str, Any]]:
    items = data.get("requests")
    if not isinstance(items, list) or not items:
        raise InvalidRequest("requests: must be a non-empty list of chat requests",
                             param="requests")
    if len(items) > MAX_BATCH:
        raise InvalidRequest(f"requests: at most {MAX_BATCH} requests", param="requests")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"requests[{index}]: must be a chat request object",
                                 param=f"requests[{index}]")
        try:
            validate(ChatBody, item)
        except InvalidRequest as exc:
            param = f"requests[{index}].{exc.param}" if exc.param else f"requests[{index}]"
            raise InvalidRequest(f"requests[{index}].{exc.message}", param=param) from None
    return items


def check_depth(data: dict[str, Any]) -> None:
    for key, value in data.items():
        if deeper_than(value, MAX_DEPTH - 1):
            raise InvalidRequest(f"{key}: nested deeper than {MAX_DEPTH} levels", param=key)


def _lint(service: LintService, model: str, items: list[dict[str, Any]], batch: bool,
          block_size: int) -> LintReport | BatchReport:
    """A Messages API body is linted as the chat request vLLM renders (its ``system`` the
    system prompt), its findings put back on its own paths (``gateway.lint.shapes``)."""
    forms = [chat_form(item) if is_messages_api(item) else None for item in items]
    chats = [item if form is None else form.chat for item, form in zip(items, forms, strict=True)]
    if batch:
        return batch_in_body(service.lint_batch(model, chats, block_size), forms)
    return in_body(service.lint_one(model, chats[0], block_size), forms[0])


GroupSource = Callable[[int, bool], Awaitable["list[dict[str, Any]] | None"]]
"""What the live linter's own process learned (``LintProcess.group_summaries``)."""


def build_lint_router(state: GatewayState, service: LintService, admin_keys: bool = False,
                      groups: GroupSource | None = None) -> APIRouter:
    """``admin_keys``: client keys are on, so every caller of ``/admin/*`` holds an admin
    key (``gateway.auth.keys``); without them nobody is an admin caller. ``groups``: where
    the live linter learns, when not in ``service`` (its own process)."""
    router = APIRouter()

    @router.post("/v1/prompt/lint")
    async def prompt_lint(request: Request) -> Response:
        data = parse_json(await read_body(request, state.settings.max_body_bytes))
        check_depth(data)
        batch = "requests" in data and "messages" not in data
        if batch:
            items = _requests(data)
            model = lint_model(state, data.get("model") or items[0].get("model"))
        else:
            validate(ChatBody, data)
            items = [data]
            model = lint_model(state, data.get("model"))
        block_size = state.decider.block_size(model)
        try:
            report = await asyncio.to_thread(_lint, service, model, items, batch, block_size)
        except UnencodableText:
            raise InvalidRequest(f"the request {UnencodableText.explained}",
                                 param="messages") from None
        except RenderError as exc:
            raise InvalidRequest(f"the request cannot be rendered with the chat template of "
                                 f"{model}: {exc}", param="messages") from None
        notes = {"notes": service.notes} if service.notes else {}  # e.g. names not checked
        return JSONResponse({**report.to_json(), **notes})

    @router.get("/admin/drift")
    async def admin_drift() -> Response:
        if groups is None:
            report = service.drift_report(include_text=admin_keys)
        else:
            learned = await groups(20, admin_keys)
            report = service.drift_report(include_text=admin_keys, groups=learned or [])
            if learned is None:
                report["groups_unavailable"] = ("the prompt linter's process did not answer; "
                                                "try again")
        return JSONResponse(report, headers={"cache-control": "no-store"})

    @router.get("/admin/lint")
    async def admin_lint() -> Response:
        return JSONResponse({"findings": [
            {"kind": s.kind, "count": s.count, "severity": s.severity,
             "suggestion": s.suggestion} for s in service.top_findings(50)]},
            headers={"cache-control": "no-store"})

    return router
