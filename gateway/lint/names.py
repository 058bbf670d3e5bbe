"""Validate person-name matches: a name after a cue ("The user's name is", "用户：", "お客様は").

English: capitalized words that are not generic ("Hello World", "Dear Customer").
Chinese: two or three characters starting with a common surname (or a compound
surname), honorifics (先生, 女士) trimmed. Japanese: kanji or katakana before
様/さん or after a cue, but not words that name a role (利用者様, 会員様).
"""

from __future__ import annotations

import re

from gateway.lint.model import Hit
from gateway.lint.patterns import (
    EN_NOT_NAMES,
    JA_NOT_NAME_ENDINGS,
    ZH_COMPOUND_SURNAMES,
    ZH_HONORIFICS,
    ZH_SURNAMES,
)


def name_en(match: re.Match[str]) -> Hit | None:
    words = match["name"].split()
    if any(w.lower().strip("'’-") in EN_NOT_NAMES for w in words):
        return None
    confidence = 0.6 if match.group(0)[:4].lower() in ("name", "full") else 0.8
    return Hit("name", match.start("name"), match.end("name"), confidence)

def name_zh(match: re.Match[str]) -> Hit | None:
    group = "name" if match["name"] else "name2"
    name, start = match[group], match.start(group)
    for honorific in ZH_HONORIFICS:
        name = name.removesuffix(honorific)
    if group == "name2":  # trim leading words until a surname starts the name
        while len(name) >= 2 and name[0] not in ZH_SURNAMES and name[:2] not in ZH_COMPOUND_SURNAMES:
            name, start = name[1:], start + 1
    compound = name[:2] in ZH_COMPOUND_SURNAMES
    if len(name) < 2 or not (compound or name[0] in ZH_SURNAMES):
        return None
    name = name[:4] if compound else name[:3]
    return Hit("name", start, start + len(name), 0.8)

def name_ja(match: re.Match[str]) -> Hit | None:
    group = "name" if match["name"] else "name2"
    name = match[group]
    if name.endswith(JA_NOT_NAME_ENDINGS):
        return None
    return Hit("name", match.start(group), match.end(group), 0.75)


def username(match: re.Match[str]) -> Hit | None:
    """A username after its name: one with a digit, ``_`` or ``.`` in it (``jdoe_88``,
    ``maria.lopez``); a plain word there is more often the prompt's own ("Login: required")."""
    value = match["value"]
    if value.isdigit() or not any(c.isdigit() or c in "._" for c in value):
        return None
    return Hit("name", match.start("value"), match.end("value"), 0.75, "username")


def handle(match: re.Match[str], cued: bool) -> Hit | None:
    """``@maria_lopez88``: with a digit and a word of letters, or after a cue ("Twitter:
    @maria_lopez"); ``@v2`` or ``@sha256`` is not a person's."""
    value = match["value"]
    if not (cued or (any(c.isdigit() for c in value) and sum(c.isalpha() for c in value) >= 4)):
        return None
    return Hit("name", match.start(), match.end(), 0.75, "username")
