"""Byte-level BPE encoding of plain ASCII text in Python, word by word, with a memo.

The Rust ``tokenizers`` library spends most of ``Tokenizer.encode`` for a short English
text in its pre-tokenizer's split regex (Oniguruma): ~140 of ~190 µs for 726 characters
with Qwen3's tokenizer. For the GPT-style byte-level BPE tokenizers (GPT-2, Qwen2/2.5/3,
Llama 3, DeepSeek, SmolLM2) every pre-token is encoded on its own, so the same ids come
from splitting with the same regex in Python and looking each word up in a memo (a new
word: the tokenizer's own BPE model, ``Model.tokenize``, on its byte-level form).
Longer texts gain too: 0.26-0.41x the Rust tokenizer's CPU on 4k-64k characters of
docs and code with the memo empty (``python -m loadtest.tokenize_cost``). A long text
can be encoded in slices, with a pause between them (``FastPretokenizer.encode``'s
``pause``) where a worker thread gives the GIL up.

What keeps this exact, and where it gives way to the Rust tokenizer:

* only tokenizers whose ``tokenizer.json`` makes pre-tokens independent: a normalizer
  that is null or NFC, a ``Split(Regex, Isolated)`` then ``ByteLevel(use_regex=false)``
  pre-tokenizer or a lone ``ByteLevel(use_regex=true)`` (GPT-2's regex), a BPE model
  without dropout, no truncation or padding (:func:`build`, :class:`Unsupported`);
* only the regex constructs that mean the same in Oniguruma and Python (no anchors,
  ``.``, set operations or Ruby-only escapes: :func:`python_pattern`);
* only texts of tab, newline, carriage return and printable ASCII (where NFC changes
  nothing and ``\\s``, ``\\p{L}``, ``\\p{N}`` agree between the engines), and holding
  none of the tokenizer's added tokens (which it splits out before anything else);
* a self-check on load: every sample of :data:`SELF_CHECK_SAMPLES` encoded both ways,
  any difference turns the fast path off.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import Any

from tokenizers import Tokenizer, pre_tokenizers

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
"""The split of ``ByteLevel(use_regex=true)`` (the tokenizers library's byte_level.rs)."""

WORD_MEMO_WORDS = 100_000
"""Words memoized per tokenizer before the memo starts again (20-30 MB when full:
~280 bytes a word measured for random 3-12 letter words with Qwen3's tokenizer)."""

WORD_MEMO_CHARS = 64
"""Longer words (whitespace or punctuation runs, long identifiers) are encoded, not kept."""

SLICE_WORDS = 1024
"""Words encoded between two pauses of a sliced encoding (``FastPretokenizer.encode``
with ``pause``): about 4,000 characters of English, 0.2-0.5 ms."""

SLICE_WORD_CHARS = 2048
"""The longest word a sliced encoding takes. A word is one call into the BPE model,
which holds the GIL and cannot be cut (a run of 262k letters with no space held it
95 ms); a text with a longer one goes to the Rust tokenizer, which releases it."""

_ALLOWED_CHARS = "\t\n\r" + "".join(chr(c) for c in range(0x20, 0x7F))
_OUTSIDE = re.compile(r"[^\t\n\r\x20-\x7e]")
"""A character the fast path does not take (non-ASCII, other controls, DEL)."""


class Unsupported(Exception):
    """Why a tokenizer (or its split pattern) cannot take the fast path."""


# -- the split pattern ---------------------------------------------------------------

_SAME_ESCAPES = frozenset("sSdDwWrntfv")
"""Letter escapes meaning the same in Oniguruma (Ruby syntax), ``regex`` and ``re`` on
the fast path's characters. Everything else with a letter or digit (``\\h``, ``\\A``,
``\\b``, ``\\z``, ``\\R``, ``\\X``, ``\\K``, back references) is refused."""

_GROUP_OPENERS = ("(?:", "(?i:", "(?=", "(?!", "(?<=", "(?<!", "(?>")
_PROPERTY = re.compile(r"\\([pP])(?:\{(\^?)([A-Za-z_]+)\}|([A-Za-z]))")
_CODE_ESCAPE = re.compile(r"\\x[0-9A-Fa-f]{2}(?![0-9A-Fa-f])|\\u[0-9A-Fa-f]{4}")
_QUANTIFIER = re.compile(r"\{\d+(?:,\d*)?\}")
_ASCII_CLASSES = {"L": ("A-Za-z", "[A-Za-z]"), "N": ("0-9", "[0-9]")}
"""``\\p{L}`` and ``\\p{N}`` on ASCII text: inside a class, and alone."""


def python_pattern(pattern: str) -> tuple[str, bool]:
    """The Oniguruma split pattern as Python compiles it for the fast path's text, and
    whether ``re`` takes it (else the ``regex`` module, for other Unicode properties).

    Capturing groups become non-capturing (``findall`` returns whole matches);
    ``\\p{L}`` and ``\\p{N}`` become their ASCII members (exact on ASCII text, and ``re``
    runs about twice as fast as ``regex``). Raises :class:`Unsupported` for anything
    whose meaning could differ between Oniguruma and Python."""
    out: list[str] = []
    plain_re = True
    in_class = False
    class_opened = False  # just after "[" or "[^": a "]" here is a literal in Python
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            prop = _PROPERTY.match(pattern, i)
            if prop is not None:
                kind, negated, name = prop.group(1), prop.group(2), prop.group(3) or prop.group(4)
                if kind == "p" and not negated and name in _ASCII_CLASSES:
                    out.append(_ASCII_CLASSES[name][0 if in_class else 1])
                else:
                    out.append(prop.group(0))
                    plain_re = False
                i = prop.end()
                class_opened = False
                continue
            if i + 1 >= n:
                raise Unsupported("the split pattern ends in a backslash")
            escaped = pattern[i + 1]
            code = _CODE_ESCAPE.match(pattern, i)
            if code is not None:  # \xHH, \uHHHH: the same character in both
                out.append(code.group(0))
                i = code.end()
                class_opened = False
                continue
            if (escaped.isalnum() or not escaped.isascii()) and escaped not in _SAME_ESCAPES:
                raise Unsupported(f"the split pattern's escape \\{escaped}")
            out.append(pattern[i:i + 2])
            i += 2
            class_opened = False
            continue
        if in_class:
            if c == "[" or pattern.startswith("&&", i):
                raise Unsupported("the split pattern has a nested class or a set operation")
            if c == "]":
                if class_opened:
                    raise Unsupported("the split pattern has a class opening with ']'")
                in_class = False
            elif c == "^" and class_opened and out[-1] == "[":
                out.append(c)
                i += 1
                continue
            class_opened = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = class_opened = True
        elif c in "^$.":
            raise Unsupported(f"the split pattern uses {c!r} (Oniguruma's differs from Python's)")
        elif c == "(":
            if pattern.startswith("(?", i):
                opener = next((o for o in _GROUP_OPENERS if pattern.startswith(o, i)), None)
                if opener is None:
                    raise Unsupported("the split pattern has an unknown group or inline flag")
                out.append(opener)
                i += len(opener)
                continue
            out.append("(?:")
            i += 1
            continue
        elif c == "{":
            quantifier = _QUANTIFIER.match(pattern, i)
            if quantifier is None:
                raise Unsupported("the split pattern has a '{' that is not a quantifier")
            if pattern.startswith("+", quantifier.end()):  # possessive in Python, not Ruby
                raise Unsupported("the split pattern has '}+'")
            out.append(quantifier.group(0))
            i = quantifier.end()
            continue
        out.append(c)
        i += 1
    if in_class:
        raise Unsupported("the split pattern has an unclosed class")
    return "".join(out), plain_re


def compile_split(pattern: str) -> re.Pattern[str]:
    """The split pattern compiled, for text of the fast path's characters (``re``, or
    the ``regex`` module's pattern, which has the same ``findall`` and ``finditer``)."""
    translated, plain_re = python_pattern(pattern)
    if plain_re:
        try:
            return re.compile(translated)
        except re.error as exc:
            raise Unsupported(f"Python cannot compile the split pattern ({exc})") from exc
    import regex  # only for properties beyond \p{L} and \p{N}

    try:
        return regex.compile(translated)
    except regex.error as exc:
        raise Unsupported(f"the regex module cannot compile the split pattern ({exc})") from exc


# -- the tokenizer's structure ---------------------------------------------------------


def _state(component: Any) -> dict[str, Any] | None:
    """A tokenizer component's own JSON (as in tokenizer.json), None for none."""
    if component is None:
        return None
    try:
        state = json.loads(component.__getstate__())
    except Exception as exc:  # an old or odd binding: no way to read its structure
        raise Unsupported(f"cannot read {type(component).__name__}'s settings ({exc})") from exc
    if not isinstance(state, dict):
        raise Unsupported(f"unexpected settings for {type(component).__name__}")
    return state


def _check_normalizer(state: Mapping[str, Any] | None) -> None:
    if state is None or state.get("type") == "NFC":
        return
    if state.get("type") == "Sequence" and all(
            isinstance(item, Mapping) and item.get("type") == "NFC"
            for item in state.get("normalizers") or ()):
        return
    raise Unsupported(f"normalizer {state.get('type')!r}")


def _byte_level(state: Mapping[str, Any], use_regex: bool) -> bool:
    return (state.get("type") == "ByteLevel" and state.get("add_prefix_space") is False
            and state.get("use_regex") is use_regex
            and set(state) <= {"type", "add_prefix_space", "trim_offsets", "use_regex"})


def _split_pattern(state: Mapping[str, Any] | None) -> str:
    """The regex that cuts text into pre-tokens (each then byte-level mapped)."""
    if state is None:
        raise Unsupported("no pre-tokenizer")
    if _byte_level(state, use_regex=True):
        return GPT2_PATTERN
    items = state.get("pretokenizers") if state.get("type") == "Sequence" else None
    if not isinstance(items, list) or len(items) != 2 or not all(
            isinstance(item, Mapping) for item in items):
        raise Unsupported(f"pre-tokenizer {state.get('type')!r}"
                          " (not Split+ByteLevel nor a lone ByteLevel)")
    split, byte_level = items
    pattern = split.get("pattern")
    if not (split.get("type") == "Split" and split.get("behavior") == "Isolated"
            and split.get("invert") is False and isinstance(pattern, Mapping)
            and isinstance(pattern.get("Regex"), str)
            and set(split) <= {"type", "pattern", "behavior", "invert"}):
        raise Unsupported("pre-tokenizer's first step is not Split(Regex, Isolated)")
    if not _byte_level(byte_level, use_regex=False):
        raise Unsupported("pre-tokenizer's second step is not ByteLevel(use_regex=false)")
    return str(pattern["Regex"])


def _adds_nothing(state: Mapping[str, Any] | None) -> bool:
    """Whether the post-processor adds no token to a single text."""
    if state is None or state.get("type") == "ByteLevel":
        return True
    if state.get("type") == "TemplateProcessing":
        single = state.get("single")
        return isinstance(single, list) and all(
            isinstance(item, Mapping) and set(item) == {"Sequence"} for item in single)
    if state.get("type") == "Sequence":
        processors = state.get("processors")
        return isinstance(processors, list) and all(
            isinstance(item, Mapping) and _adds_nothing(item) for item in processors)
    return False


# -- the encoder -----------------------------------------------------------------------


class FastPretokenizer:
    """Encodes the texts it can, exactly as the tokenizer would; None for the others."""

    def __init__(self, tokenizer: Tokenizer, added: Iterable[str]) -> None:
        """Raises :class:`Unsupported` when the tokenizer's structure rules it out."""
        if type(tokenizer.model).__name__ != "BPE":
            raise Unsupported(f"model {type(tokenizer.model).__name__}")
        if getattr(tokenizer.model, "dropout", None) not in (None, 0.0):
            raise Unsupported("BPE dropout")
        if tokenizer.truncation is not None or tokenizer.padding is not None:
            raise Unsupported("truncation or padding is set")
        _check_normalizer(_state(tokenizer.normalizer))
        split = compile_split(_split_pattern(_state(tokenizer.pre_tokenizer)))
        self._split = split.findall
        """One call in C: the fastest for a text encoded in one go."""
        self._finditer = split.finditer
        """Match by match: a sliced encoding pauses between them."""
        self.specials_free = _adds_nothing(_state(tokenizer.post_processor))
        """Whether ``add_special_tokens=True`` gives the same ids (nothing is added)."""
        self._model = tokenizer.model
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        mapped = {c: byte_level.pre_tokenize_str(c) for c in _ALLOWED_CHARS}
        if any(len(pieces) != 1 or len(pieces[0][0]) != 1 for pieces in mapped.values()):
            raise Unsupported("unexpected byte-level alphabet")
        self._bytes = str.maketrans({c: pieces[0][0] for c, pieces in mapped.items()})
        # An added token made of other characters can never be in a text taken here.
        found = sorted({t for t in added if t and _OUTSIDE.search(t) is None},
                       key=len, reverse=True)
        self._added = (re.compile("|".join(re.escape(t) for t in found)).search
                       if found else None)
        firsts = {t[0] for t in found}
        self._added_firsts = tuple(firsts) if len(firsts) <= 4 else None
        """A prefilter (``"<" in text``) before the added tokens' regex, when short."""
        self._memo: dict[str, tuple[int, ...]] = {}
        self._lengths: dict[int, int] = {}
        """Characters per token id, filled as ids are met (at most the vocabulary)."""
        self.encodes = 0
        """Texts encoded here (not by the Rust tokenizer)."""

    def encode(self, text: str, pause: Callable[[], object] | None = None) -> list[int] | None:
        """The ids ``Tokenizer.encode(text, add_special_tokens=False)`` gives, or None
        when this text is not one the fast path takes.

        With ``pause``, the text is split and encoded a slice of :data:`SLICE_WORDS`
        words at a time, and ``pause`` is called between slices: a long text encoded
        in a worker thread gives the GIL up there (``time.sleep(0)``), so the event
        loop never waits for the whole text. A text with a word longer than
        :data:`SLICE_WORD_CHARS` is not taken sliced (None)."""
        if not text.isascii() or _OUTSIDE.search(text) is not None or self._has_added(text):
            return None
        if pause is not None:
            return self._encode_sliced(text, pause)
        words = self._split(text)
        if sum(map(len, words)) != len(text):  # text between matches: pieces of their own
            return None
        out: list[int] = []
        get = self._memo.get
        for word in words:
            ids = get(word)
            if ids is None:
                ids = self._word(word)
            out += ids
        self.encodes += 1
        return out

    def _encode_sliced(self, text: str, pause: Callable[[], object]) -> list[int] | None:
        out: list[int] = []
        get = self._memo.get
        end = 0
        for count, match in enumerate(self._finditer(text), 1):
            if match.start() != end:  # text between matches: pieces of their own
                return None
            word = match.group()
            end = match.end()
            if len(word) > SLICE_WORD_CHARS:
                return None
            ids = get(word)
            if ids is None:
                ids = self._word(word)
            out += ids
            if count % SLICE_WORDS == 0:
                pause()
        if end != len(text):
            return None
        self.encodes += 1
        return out

    def encode_with_offsets(self, text: str, pause: Callable[[], object] | None = None,
                            ) -> tuple[list[int], FastOffsets] | None:
        """``encode``'s ids and their character spans (what ``Encoding`` gives the piece
        reuse: ``char_to_token``, ``token_to_chars``), or None as ``encode``."""
        ids = self.encode(text, pause)
        if ids is None:
            return None
        return ids, FastOffsets(ids, self._token_chars)

    def _token_chars(self, ids: list[int]) -> dict[int, int]:
        """Characters per token id (its byte-level form: one character a byte, and the
        fast path's text is ASCII), for every id of ``ids``."""
        lengths = self._lengths
        missing = set(ids).difference(lengths)
        if missing:
            to_token = self._model.id_to_token
            for token_id in missing:
                lengths[token_id] = len(to_token(token_id) or "")
        return lengths

    def _has_added(self, text: str) -> bool:
        search = self._added
        if search is None:
            return False
        firsts = self._added_firsts
        if firsts is not None and not any(c in text for c in firsts):
            return False
        return search(text) is not None

    def _word(self, word: str) -> tuple[int, ...]:
        ids = tuple(token.id for token in self._model.tokenize(word.translate(self._bytes)))
        if len(word) <= WORD_MEMO_CHARS:
            memo = self._memo
            if len(memo) >= WORD_MEMO_WORDS:
                memo.clear()
            memo[word] = ids
        return ids

    @property
    def memo_words(self) -> int:
        return len(self._memo)


class FastOffsets:
    """Character spans of a fast-path encoding, as ``tokenizers.Encoding`` reports them for
    a byte-level BPE without offset trimming: token ``i`` covers the characters after token
    ``i - 1`` up to its own end, leading space included. Built on first use (the piece
    reuse asks a few cuts of a long piece; most encodings are never asked)."""

    __slots__ = ("_ends", "_ids", "_lengths")

    def __init__(self, ids: list[int], lengths: Callable[[list[int]], dict[int, int]]) -> None:
        self._ids = ids
        self._lengths = lengths
        self._ends: list[int] | None = None

    def _token_ends(self) -> list[int]:
        ends = self._ends
        if ends is None:
            lengths = self._lengths(self._ids)
            ends = self._ends = list(accumulate(map(lengths.__getitem__, self._ids)))
        return ends

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        ends = self._token_ends()
        if not 0 <= token_index < len(ends):
            return None
        return (ends[token_index - 1] if token_index else 0), ends[token_index]

    def char_to_token(self, char_pos: int) -> int | None:
        ends = self._token_ends()
        if char_pos < 0:
            return None
        index = bisect_right(ends, char_pos)
        return index if index < len(ends) else None


SELF_CHECK_SAMPLES: tuple[str, ...] = (
    "",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    " one leading space and a trailing one ",
    ("It's, it'S, IT'S; don't DON'T Don'T; we'll WE'LL We'Ll; they're THEY'RE; I've I'VE;"
     " I'm I'M; he'd HE'D; 's 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ''s '' ' x'"),
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 +7 1e-9 0x1F 1,000,000 2024-06-01T12:30:00Z",
    ("Punctuation runs: !!! ??? ... --- === *** ### ~~~ ``` ''' \"\"\" ;;; ::: ,,, ((( ))) "
     "[[[ ]]] {{{ }}} <<< >>> /// \\\\\\ ||| &&& ^^^ %%% $$$ @@@ _ __ ___ ?! !? .,;:"),
    ("Whitespace:\n\n\nthree newlines\n\tone tab\t\ttwo tabs\r\nCRLF\r\n\r\n"
     "  \n  \n\t \t\n    four spaces     five\n \n"),
    "trailing newline\n",
    "trailing tab\t",
    "\n\nleading newlines",
    "\tleading tab",
    "   \n",
    "a  b   c    d\t\te\n\nf \n g\r h\r\ni",
    ('{"name": "prefixgate", "version": 3, "tags": ["a", "b"], "nested": {"k": null, '
     '"ok": true, "x": -1.5e+10}, "empty": {}, "list": [1,2,3]}\n'),
    ("def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th number.\"\"\"\n"
     "    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\n"
     "class Foo(Bar):\n\tdef __init__(self, *args, **kwargs):\n\t\tsuper().__init__()\n"),
    ("for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // comment\n"
     "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", x); return 0; }\n"),
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE 'A%' ORDER BY id DESC;",
    "https://example.com/path/to/page?query=1&b=two#frag user@example.org C:\\Windows\\x",
    "CamelCaseWord snake_case_word kebab-case-word SCREAMING_CASE mixedCASEword iPhone11",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 ~`!@#$%^&*()-_=+[]{}|;:,.?/",
    "x" * 80 + " " + "=" * 70 + "\n" + " " * 70 + "y" + "\t" * 10 + "\n" * 12,
    "- item one\n- item two\n  * nested\n1. first\n2. second\n\n> quote\n\n| a | b |\n|---|---|\n",
)
"""Texts of the fast path's characters that exercise every alternative of the GPT-style
split patterns (contractions in every case, digit runs, punctuation and whitespace runs,
leading and trailing spaces, code, JSON)."""


def build(tokenizer: Tokenizer, added: Iterable[str],
          samples: Iterable[str] = SELF_CHECK_SAMPLES) -> tuple[FastPretokenizer | None, str]:
    """The fast path for this tokenizer, or None and why not (structure or self-check)."""
    try:
        fast = FastPretokenizer(tokenizer, added)
    except Unsupported as exc:
        return None, str(exc)
    samples = list(samples)
    taken = 0
    for text in [*samples, "".join(samples)]:
        ids = fast.encode(text)
        if ids is None:
            continue
        taken += 1
        if ids != tokenizer.encode(text, add_special_tokens=False).ids:
            return None, f"self-check: different ids for {text[:40]!r}"
        if fast.specials_free and ids != tokenizer.encode(text, add_special_tokens=True).ids:
            fast.specials_free = False
    if taken == 0:
        return None, "self-check: no sample could take the fast path"
    fast.encodes = 0
    return fast, "on"
