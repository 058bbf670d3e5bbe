"""One :class:`PromptHasher` per served model, and which tokenizer each uses.

Models configured with a tokenizer folder are loaded at start-up. Every
other model the replicas serve is resolved by :meth:`HasherSet.discover`
(``gateway.prompt.tokenizer_source``: the replica's model folder, the local Hugging
Face cache, else the byte renderer), once the pool has read the replicas'
``/v1/models``, and again whenever a replica joins with a model not seen
before. Loading a tokenizer takes a second or so, so it runs in a worker
thread; until a model is resolved its requests are hashed by the byte
renderer (they still route by prefix).

What was chosen is loud: one log line per model at start-up (a warning for
the byte renderer), ``tokenizers()`` for ``/ready`` and ``/admin/replicas``,
and ``prefixgate_tokenizer_info{model,source}`` (``gateway.ops.metrics``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from engine.chat_template import chat_template_option
from engine.tokenizer import ByteRenderer, HFRenderer, Renderer, load_renderer
from gateway.config import LimitSettings, ModelSettings
from gateway.prompt.render import PromptHasher
from gateway.prompt.render_check import RenderCheck
from gateway.prompt.tokenizer_source import (
    TokenizerChoice,
    configured_folder_problem,
    find_tokenizer,
)

log = logging.getLogger("prefixgate.hashers")

RootOf = Callable[[str], "str | None"]
"""A served model's root as a replica reports it (``ReplicaPool.model_root``)."""


class TokenizerConfigError(ValueError):
    """A configured tokenizer that cannot be used: a folder that is missing, holds no
    tokenizer or does not load, or ``--tokenizer`` without ``--model`` while the
    replicas serve several models."""


class HasherSet:
    def __init__(self, models: list[ModelSettings], default_tokenizer: str | None = None,
                 loader: Callable[[str | None], Renderer] = load_renderer,
                 limits: LimitSettings | None = None,
                 default_chat_template: str | None = None) -> None:
        self._loader = loader
        self._default_tokenizer = default_tokenizer
        self.limits = limits if limits is not None else LimitSettings()
        self._hashers: dict[str, PromptHasher] = {}
        self._choices: dict[str, TokenizerChoice] = {}
        self._bytes = PromptHasher(ByteRenderer(), self.limits)
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._followed: dict[str, str | None] = {}
        self._unloaded: dict[str, str] = {}  # followed, loaded on first use
        self.parent_of: Callable[[str], str | None] = lambda model: None
        """The base model of a LoRA adapter (``ReplicaPool.model_parent``), None for a
        base model."""
        self._checks: dict[str, dict[str, RenderCheck]] = {}
        for folder in filter(None, [default_tokenizer, *(m.tokenizer for m in models)]):
            problem = configured_folder_problem(folder)
            if problem:
                raise TokenizerConfigError(f"{problem} (--tokenizer / models[].tokenizer)")
        self._default_template = _template(default_chat_template)
        self._templates = {m.name: _template(m.chat_template) for m in models if m.chat_template}
        for model in models:
            if model.name in self._choices:
                continue
            if model.tokenizer:
                self._adopt(model.name, find_tokenizer(model.name, model.tokenizer, None),
                            PromptHasher(self._load(model.name, model.tokenizer), self.limits))

    def _load(self, model: str, folder: str) -> Renderer:
        try:
            return self._renderer(model, folder)
        except (OSError, ValueError) as exc:
            raise TokenizerConfigError(
                f"tokenizer folder {folder} does not load ({type(exc).__name__}: {exc})"
            ) from exc

    def _renderer(self, model: str, folder: str) -> Renderer:
        """The folder's renderer, with the model's configured chat template if any."""
        renderer = self._loader(folder)
        template = self._templates.get(model, self._default_template)
        if template is not None and isinstance(renderer, HFRenderer):
            renderer.use_chat_template(template)
        return renderer

    # -- lookup --------------------------------------------------------------------

    def get(self, model: str) -> PromptHasher:
        hasher = self._hashers.get(model)
        if hasher is None and model in self._unloaded:
            hasher = self._load_followed(model)
        return hasher if hasher is not None else self._bytes

    def has_tokenizer(self, model: str) -> bool:
        return model in self._hashers

    def seen(self, model: str) -> bool:
        """Whether ``model``'s tokenizer was looked for (or is being looked for)."""
        return model in self._choices or model in self._pending

    def items(self) -> list[tuple[str, PromptHasher]]:
        return list(self._hashers.items())

    def every(self) -> list[tuple[str, PromptHasher]]:
        """Each model's hasher, and the byte renderer's (shared by models without one) as ``*``."""
        return [*self._hashers.items(), ("*", self._bytes)]

    def choice(self, model: str) -> TokenizerChoice | None:
        return self._choices.get(model)

    def tokenizers(self) -> dict[str, dict[str, Any]]:
        """Per model: where its tokenizer came from (for ``/ready`` and the ops view), and
        per replica whether it renders the same token ids (``render_checks``, once checked:
        ``gateway.prompt.render_check``)."""
        out: dict[str, dict[str, Any]] = {}
        for model, c in self._choices.items():
            out[model] = {"source": c.source, "path": c.path}
            if model in self._checks:
                out[model]["render_checks"] = {
                    replica: check.as_json() for replica, check in self._checks[model].items()}
        return out

    def record_check(self, model: str, replica_id: str, check: RenderCheck) -> None:
        self._checks.setdefault(model, {})[replica_id] = check

    def render_checks(self) -> list[tuple[str, str, RenderCheck]]:
        return [(model, replica, check) for model, checks in self._checks.items()
                for replica, check in checks.items()]

    # -- discovery -------------------------------------------------------------------

    async def discover(self, models: list[str], root_of: RootOf) -> None:
        """Resolve every model in ``models`` that has no tokenizer yet, and wait for it."""
        self.notice(models, root_of)
        await asyncio.gather(*(asyncio.shield(t) for t in list(self._pending.values())))

    def notice(self, models: list[str], root_of: RootOf) -> None:
        """Start resolving the models in ``models`` not seen before (does not wait)."""
        new = [m for m in dict.fromkeys(models)
               if m not in self._choices and m not in self._pending]
        if not new:
            return
        if self._default_tokenizer or self._default_template is not None:
            # a LoRA adapter is its base model's: one model, whatever adapters it has
            served = sorted({self.parent_of(m) or m for m in set(models) | set(self._choices)})
            given = (f"--tokenizer {self._default_tokenizer}" if self._default_tokenizer
                     else "--chat-template")
            if len(served) > 1:
                raise TokenizerConfigError(
                    f"{given} was given without --model, but the "
                    f"replicas serve {len(served)} models ({', '.join(served)}): name the model "
                    "it belongs to with --model NAME (or list models[].tokenizer in the config)")
        for model in new:
            task = asyncio.ensure_future(self._resolve(model, root_of(model)))
            self._pending[model] = task
            task.add_done_callback(self._resolved)

    def _resolved(self, task: asyncio.Future[None]) -> None:
        for model, pending in list(self._pending.items()):
            if pending is task:
                del self._pending[model]

    async def _resolve(self, model: str, root: str | None) -> None:
        choice = find_tokenizer(model, self._default_tokenizer, root)
        if choice.path is None:
            self._adopt(model, choice, None)
            return
        try:
            renderer = await asyncio.to_thread(self._renderer, model, choice.path)
        except (OSError, ValueError) as exc:
            self._adopt(model, TokenizerChoice(
                "bytes", None, f"loading {choice.path} failed ({type(exc).__name__}: {exc})"), None)
            return
        self._adopt(model, choice, PromptHasher(renderer, self.limits))

    def follow(self, model: str, folder: str | None) -> None:
        """Use ``folder`` for ``model``, as another process of this gateway chose it (the
        linter's own process: ``gateway.server.lint_process``). It is loaded here on the
        first ``get`` (blocking), not before: that process needs it only to count a
        drift's lost tokens. None, or a folder that does not load: the byte renderer."""
        if model in self._followed and self._followed[model] == folder:
            return
        self._followed[model] = folder  # tried once: a folder that fails is not retried
        self._hashers.pop(model, None)
        self._unloaded.pop(model, None)
        self._choices[model] = (TokenizerChoice("followed", folder, folder) if folder
                                else TokenizerChoice("bytes", None, "the gateway has none"))
        if folder:
            self._unloaded[model] = folder

    def _load_followed(self, model: str) -> PromptHasher | None:
        folder = self._unloaded.pop(model)
        try:
            hasher = PromptHasher(self._renderer(model, folder), self.limits)
        except (OSError, ValueError) as exc:
            self._choices[model] = TokenizerChoice(
                "bytes", None, f"loading {folder} failed ({type(exc).__name__})")
            return None
        self._hashers[model] = hasher
        return hasher

    def _adopt(self, model: str, choice: TokenizerChoice, hasher: PromptHasher | None) -> None:
        self._choices[model] = choice
        if hasher is not None:
            self._hashers[model] = hasher
            log.info("model %s: tokenizer from %s", model, choice.note)
        else:
            log.warning("model %s: no tokenizer (%s): routing by byte prefix, token counts "
                        "estimated; give the folder with --model %s --tokenizer PATH",
                        model, choice.note, model)

    async def aclose(self) -> None:
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _template(value: str | None) -> str | None:
    if not value:
        return None
    try:
        return chat_template_option(value)
    except (OSError, ValueError) as exc:
        raise TokenizerConfigError(f"{exc} (--chat-template / models[].chat_template)") from exc
