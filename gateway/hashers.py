"""One :class:`PromptHasher` per served model, built from the model settings.

A model with a configured tokenizer folder renders with its real chat
template; any other model falls back to the byte renderer, which keeps the
approximate index consistent (equal prompts, equal hashes) but does not match
the engine's token ids — the precise policy needs the real tokenizer, and a
warning says so.
"""

from __future__ import annotations

import logging

from engine.tokenizer import ByteRenderer, load_renderer

from .config import ModelSettings
from .prefix import PromptHasher

log = logging.getLogger("prefixgate.hashers")


class HasherSet:
    def __init__(self, models: list[ModelSettings]) -> None:
        self._hashers: dict[str, PromptHasher] = {}
        for model in models:
            if model.name not in self._hashers:
                self._hashers[model.name] = PromptHasher(load_renderer(model.tokenizer))
                log.info("model %s: tokenizer %s", model.name, model.tokenizer or "byte fallback")
        self._fallback: PromptHasher | None = None

    def get(self, model: str) -> PromptHasher:
        hasher = self._hashers.get(model)
        if hasher is not None:
            return hasher
        if self._fallback is None:
            log.warning("no tokenizer configured for model %s: hashing byte-level", model)
            self._fallback = PromptHasher(ByteRenderer())
        return self._fallback

    def has_tokenizer(self, model: str) -> bool:
        return model in self._hashers
