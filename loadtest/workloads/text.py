"""Deterministic filler text whose length in tokens is known without a tokenizer.

Every word of :data:`VOCABULARY` is a single token of the Qwen3 tokenizer,
both with and without a leading space (checked by
``tests/unit/test_loadtest_workloads.py`` when the tokenizer is installed).
Qwen's pre-tokenizer splits text at spaces before merging, so ``n`` words
joined by single spaces are exactly ``n`` tokens: a workload asks for "2048
tokens" and gets 2048 words, i.e. 2048 tokens of message content. The chat
template adds a handful of tokens per message (role markers) on top.

With another tokenizer the word count remains a good approximation (common
English words are one token in most BPE vocabularies).

Text is drawn from a :class:`random.Random` seeded from a string key, so the
same key always gives the same words: ``words("group-3", 100)`` is the system
prompt of group 3 in every run, on every machine (``random.Random`` with a
string seed is stable across Python versions and ``PYTHONHASHSEED``).
"""

from __future__ import annotations

import random

_WORDS = """
    time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    government number night point home water room mother area money story fact month lot
    right study book eye job word business issue side kind head house service friend father
    power hour game line end member law car city community name team minute idea kid body
    information back parent face others level office door health person art war history
    party result change reason research girl moment air teacher force education foot boy
    age policy process music market sense nation plan college interest death experience
    effect use class control care field development role rate heart drug show leader light
    voice wife mind price report decision son view relationship town road arm difference
    value building action model season tax director position player record paper space
    ground form event official matter center site project activity star table need court
    oil cost industry figure street image phone data picture practice piece land product
    doctor wall patient worker news test movie north love support technology step baby
    computer type attention film tree source organization hair window population sort
    region floor
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())


def words(key: str, count: int) -> str:
    """``count`` words (= tokens, see module doc) determined by ``key`` alone."""
    if count <= 0:
        return ""
    rng = random.Random(key)
    return " ".join(rng.choices(VOCABULARY, k=count))
