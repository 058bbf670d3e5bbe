"""The prompt hasher's memos are partitioned by cache salt: one tenant's prompts never
make another's faster to hash (a timing channel), while a tenant's own repeats stay
memoized."""

from __future__ import annotations

from engine.tokenizer import bundled_qwen_tokenizer_dir, load_renderer
from gateway.prompt.render import PromptHasher

SYSTEM = "PIN 4821. The vault handbook says many things about opening hours. " * 40


def body(salt: str | None) -> dict:
    return {"model": "m", "cache_salt": salt,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "When does it open?"}]}


def hash_once(hasher: PromptHasher, salt: str | None) -> int:
    """Hash the request; how many of its pieces had to be tokenized."""
    plan = hasher.plan("m", body(salt), "chat", 16, incremental=False)
    assert plan is not None
    hasher.finish(plan, hasher.tokenize_missing(plan))
    hasher.run_pending()
    return len(plan.missing)


def test_another_salts_prompt_is_tokenized_afresh_and_ones_own_is_not() -> None:
    tokenizer = bundled_qwen_tokenizer_dir()
    assert tokenizer
    hasher = PromptHasher(load_renderer(tokenizer))
    first = hash_once(hasher, "tenant-b")
    assert first > 0
    assert hash_once(hasher, "tenant-b") == 0
    assert hash_once(hasher, "tenant-a") == first
    assert hash_once(hasher, None) == first
    assert hash_once(hasher, None) == 0
