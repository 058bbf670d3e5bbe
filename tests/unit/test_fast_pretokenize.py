"""``engine.pretokenize``: ASCII texts encoded in Python give exactly the Rust
tokenizer's ids, for real tokenizers (the bundled Qwen3 one, GPT-2-style ones built here,
SmolLM2's when it is on disk), and every tokenizer or text it cannot be sure of goes to
the Rust tokenizer."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import string
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex as tokenizers_regex
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from engine import pretokenize
from engine import tokenizer as engine_tokenizer
from engine.pretokenize import Unsupported, python_pattern
from engine.tokenizer import RELEASE_GIL_CHARS, HFRenderer

TRAINING = [
    "The quick brown fox jumps over the lazy dog. It's what they'll say; don't they?",
    "def main(argv: list[str]) -> int:\n    return len(argv)  # 42\n",
    '{"key": "value", "n": 12345, "ok": true}\n\n\tIndented\r\nWindows line',
    "Numbers 3.14159 and 2024-06-01, emails a@b.co, paths /usr/bin and C:\\x\\y.",
]

ADDED = ["qqq", "~>", "@@mention", "\tTAB"]
"""Non-special added tokens that are nothing like ``<|...|>``: five first characters in
all (with the special ones), more than the prefilter takes."""


def _folder(tmp_path: Path, name: str, tokenizer: Tokenizer) -> str:
    folder = tmp_path / name
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048}))
    return str(folder)


def _train(tokenizer: Tokenizer, special: list[str], alphabet: list[str] | None = None) -> None:
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=special, show_progress=False,
                                  initial_alphabet=alphabet or [])
    tokenizer.train_from_iterator(TRAINING * 10, trainer)


def gpt2_style(tmp_path: Path, name: str = "gpt2-style",
               post_processor: bool = False) -> HFRenderer:
    """A byte-level BPE with GPT-2's pre-tokenizer (``ByteLevel(use_regex=true)``)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    _train(tokenizer, ["<|endoftext|>", "[SEP]"], pre_tokenizers.ByteLevel.alphabet())
    tokenizer.add_tokens(ADDED)
    if post_processor:
        bos = tokenizer.token_to_id("<|endoftext|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    return HFRenderer(_folder(tmp_path, name, tokenizer))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                 r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""GPT-4o's split: other Unicode properties, so the ``regex`` module's path."""


def with_split(qwen_dir: str, tmp_path: Path, name: str, pattern: str) -> HFRenderer:
    """Qwen3's tokenizer with another model family's split pattern (Llama 3's, GPT-4o's)."""
    folder = tmp_path / name
    shutil.copytree(qwen_dir, folder)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return HFRenderer(str(folder))


def smollm2_folder() -> str | None:
    """SmolLM2-135M-Instruct as deploy/vllm-cpu/setup.sh leaves it (never downloaded here)."""
    root = os.environ.get("PREFIXGATE_CACHE") or os.path.expanduser("~/.cache/prefixgate")
    folder = os.path.join(root, "models", "smollm2-135m-instruct")
    return folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None


@pytest.fixture(params=["qwen", "gpt2-style", "smollm2", "llama3-split", "o200k-split"])
def renderer(request: pytest.FixtureRequest, tmp_path: Path) -> HFRenderer:
    if request.param == "qwen":
        qwen: HFRenderer = request.getfixturevalue("qwen")
        return qwen
    if request.param == "gpt2-style":
        return gpt2_style(tmp_path)
    if request.param.endswith("-split"):
        pattern = LLAMA3_PATTERN if request.param == "llama3-split" else O200K_PATTERN
        return with_split(request.getfixturevalue("qwen_dir"), tmp_path, request.param, pattern)
    folder = smollm2_folder()
    if folder is None:
        pytest.skip("no SmolLM2 tokenizer under ~/.cache/prefixgate/models")
    return HFRenderer(folder)


def rust_ids(renderer: HFRenderer, text: str, add_special_tokens: bool = False) -> list[int]:
    """The Rust tokenizer's ids (the path the fast one must equal)."""
    return list(renderer._encode(text, add_special_tokens).ids)


# -- the fast path is on, taken, and exact ---------------------------------------------------

def test_the_fast_path_is_taken_for_qwen_on_ascii_text(qwen: HFRenderer) -> None:
    assert qwen.fast_pretokenize and qwen.fast_pretokenize_reason == "on"
    fast = qwen.pretokenizer
    assert fast is not None and fast.specials_free  # its post-processor adds nothing
    text = "Hello there! It's 2024; DON'T panic.\n\n  def f(x):\n\treturn x ** 2  \n"
    before = fast.encodes
    assert qwen.text_token_ids(text, add_special_tokens=False) == rust_ids(qwen, text)
    assert qwen.text_token_ids(text, add_special_tokens=True) == rust_ids(qwen, text, True)
    assert qwen.chat_token_ids({"messages": [{"role": "user", "content": "hi"}]})
    assert fast.encodes == before + 2  # the chat prompt holds <|im_start|>: the Rust path
    for other in ("café au lait", "tab\x0bvertical", "file\x1cseparator", "<|im_start|>user"):
        assert qwen.text_token_ids(other, add_special_tokens=False) == rust_ids(qwen, other)
    assert fast.encodes == before + 2
    long = "a " * RELEASE_GIL_CHARS  # a long text too: it is what the fast path saves most on
    assert qwen.text_token_ids(long, add_special_tokens=False) == rust_ids(qwen, long)
    assert fast.encodes == before + 3


def _fuzz_text(rng: random.Random, added: list[str]) -> str:
    fragments = [*string.ascii_letters, *string.digits, *string.punctuation,
                 "'s", "'t", "'ll", "'S", "'T", "'LL", "'re", "'VE", "'m", "'D", "n't", "N'T",
                 " ", " ", "  ", "   ", "\t", "\t\t", "\r", "\r\n", "\n", "\n\n", "\n\n\n",
                 " \n", "\n ", "the", " the", "The", "HTTP", "camelCase", "snake_case",
                 "12345", "3.14", "0x1F", "...", "!!!", "--", "==", "->", "{}", "[]", "()",
                 '"', "''", "``", "//", "#", "/*", "*/", "<", ">", "</", "/>", "<|", "|>"]
    dirty = ["é", "ß", "你好", "—", "\u00a0", "\u2028", "\x0b", "\x0c", "\x1c", "\x1f",
             "\x7f", "\x85", "\x00", "🙂", *added, *(t[:-1] for t in added if len(t) > 1)]
    pieces = [rng.choice(fragments) for _ in range(rng.randint(0, 80))]
    if rng.random() < 0.3:  # some texts hold what the fast path must hand over
        for _ in range(rng.randint(1, 3)):
            pieces.insert(rng.randint(0, len(pieces)), rng.choice(dirty))
    return "".join(pieces)


def test_random_texts_give_the_rust_tokenizers_ids(renderer: HFRenderer) -> None:
    assert renderer.fast_pretokenize, renderer.fast_pretokenize_reason
    fast = renderer.pretokenizer
    assert fast is not None
    before = fast.encodes
    rng = random.Random(20240601)
    added = renderer.added_tokens()
    count = 3000
    for _ in range(count):
        text = _fuzz_text(rng, added)
        assert renderer.text_token_ids(text, add_special_tokens=False) == rust_ids(
            renderer, text), repr(text)
    for _ in range(300):
        text = _fuzz_text(rng, added)
        assert renderer.text_token_ids(text, add_special_tokens=True) == rust_ids(
            renderer, text, True), repr(text)
    assert fast.encodes - before > count // 2  # most texts went the fast way


def _long_text(rng: random.Random, chars: int) -> str:
    """ASCII prose and code of at least ``chars`` characters, all of it the fast path's."""
    parts: list[str] = []
    while sum(map(len, parts)) < chars:
        parts.append(rng.choice([*TRAINING, *pretokenize.SELF_CHECK_SAMPLES]))
        parts.append(rng.choice([" ", "\n", "\n\n", "  ", "\t", "", f" #{rng.randint(0, 9999)} "]))
    return "".join(parts)


def test_long_texts_are_encoded_in_slices_with_the_rust_tokenizers_ids(
        renderer: HFRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long text takes the fast path too, a slice of words at a time with a pause
    between slices (where a worker thread gives the GIL up to the event loop); the ids
    and the spans are the Rust tokenizer's all the same."""
    fast = renderer.pretokenizer
    assert fast is not None
    pauses: list[int] = []
    monkeypatch.setattr(engine_tokenizer, "_release_gil", lambda: pauses.append(1))
    rng = random.Random(11)
    for chars in (RELEASE_GIL_CHARS, 3 * RELEASE_GIL_CHARS, 40_000):
        text = _long_text(rng, chars)
        words = len(fast._split(text))
        before, paused = fast.encodes, len(pauses)
        assert renderer.text_token_ids(text, add_special_tokens=False) == rust_ids(renderer, text)
        assert fast.encodes == before + 1
        assert len(pauses) - paused == words // pretokenize.SLICE_WORDS > 0
        ids, offsets = renderer.encode_with_offsets(text) or ([], None)
        encoding = renderer._encode(text, False)
        assert ids == list(encoding.ids) and isinstance(offsets, pretokenize.FastOffsets)
        for position in range(0, len(text), 97):
            assert offsets.char_to_token(position) == encoding.char_to_token(position)
    paused = len(pauses)
    short = _long_text(rng, 200)[:RELEASE_GIL_CHARS - 1]
    assert renderer.text_token_ids(short, add_special_tokens=False) == rust_ids(renderer, short)
    assert len(pauses) == paused  # a short text is encoded in one go


class _CountingRust:
    """The Rust tokenizer, saying which of its calls each encoding took."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls: list[str] = []

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.calls.append("encode")
        return self.tokenizer.encode(text, **kwargs)

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.calls.append("encode_batch")  # the one that releases the GIL
        return self.tokenizer.encode_batch(texts, **kwargs)


def test_a_long_text_gives_the_gil_up_in_a_worker_thread_never_on_the_event_loop(
        qwen: HFRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the loop's thread, giving the GIL up lets a busy thread (the linter) keep it for
    a switch interval before the loop gets it back: there a long text is encoded in one
    go, by the Rust tokenizer too (``encode``, not the ``encode_batch`` that releases it)."""
    pauses: list[int] = []
    monkeypatch.setattr(engine_tokenizer, "_release_gil", lambda: pauses.append(1))
    text = _long_text(random.Random(5), 3 * RELEASE_GIL_CHARS)
    expected = rust_ids(qwen, text)

    async def on_the_loop(text: str) -> list[int]:
        return qwen.text_token_ids(text, add_special_tokens=False)

    assert asyncio.run(on_the_loop(text)) == expected and pauses == []
    assert asyncio.run(asyncio.to_thread(qwen.text_token_ids, text, False)) == expected
    assert pauses

    wide = text + " café"  # not the fast path's: the Rust tokenizer's
    expected = rust_ids(qwen, wide)
    rust = _CountingRust(qwen._tokenizer)
    monkeypatch.setattr(qwen, "_tokenizer", rust)
    assert asyncio.run(on_the_loop(wide)) == expected and rust.calls == ["encode"]
    assert asyncio.run(asyncio.to_thread(qwen.text_token_ids, wide, False)) == expected
    assert rust.calls == ["encode", "encode_batch"]


def test_a_word_too_long_to_slice_goes_to_the_rust_tokenizer_in_a_worker_thread(
        qwen: HFRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    """One word is one call into the BPE model, which holds the GIL however long it is
    (a run of letters with no space, as a hostile prompt may send): in a worker thread
    such a text goes to the Rust tokenizer's ``encode_batch``, which lets the loop run.
    A word at the bound is still sliced; on the loop's thread nothing changes."""
    rust = _CountingRust(qwen._tokenizer)
    monkeypatch.setattr(qwen, "_tokenizer", rust)
    fast = qwen.pretokenizer
    assert fast is not None
    rng = random.Random(9)
    # With the space before it, the word is a pre-token at the bound, then one over.
    for length, taken in ((pretokenize.SLICE_WORD_CHARS - 1, True),
                          (pretokenize.SLICE_WORD_CHARS, False)):
        word = "".join(rng.choice(string.ascii_letters) for _ in range(length))
        text = _long_text(rng, RELEASE_GIL_CHARS) + " " + word + " and more words."
        expected = rust.tokenizer.encode(text, add_special_tokens=False).ids
        rust.calls.clear()
        before = fast.encodes
        assert asyncio.run(asyncio.to_thread(qwen.text_token_ids, text, False)) == expected
        assert (fast.encodes == before + 1) is taken
        assert rust.calls == ([] if taken else ["encode_batch"])


def test_a_split_that_leaves_text_between_matches_is_not_taken_sliced_or_not(
        tmp_path: Path) -> None:
    """Text no match of the split covers is a piece of its own in the Rust tokenizer: the
    fast path refuses such a text both ways (one ``findall`` and match by match)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers_regex(r"\p{L}+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    _train(tokenizer, ["<|endoftext|>"], pre_tokenizers.ByteLevel.alphabet())
    fast = pretokenize.FastPretokenizer(tokenizer, ["<|endoftext|>"])
    def pause() -> None:
        pass

    assert fast.encode("letters only") is None  # the space between the words
    assert fast.encode("letters only", pause) is None
    assert fast.encode("letters") == fast.encode("letters", pause) is not None
    assert fast.encode("letters " * 3000) is None
    assert fast.encode("letters " * 3000, pause) is None


def test_added_tokens_of_any_shape_take_the_rust_path(tmp_path: Path) -> None:
    renderer = gpt2_style(tmp_path)
    fast = renderer.pretokenizer
    assert fast is not None
    for text in ("a qqq b", "x~>y", "hi @@mention", "line\tTAB", "<|endoftext|>", "[SEP] z"):
        before = fast.encodes
        ids = renderer.text_token_ids(text, add_special_tokens=False)
        assert ids == rust_ids(renderer, text) and fast.encodes == before, text
        assert set(ids) & {renderer._tokenizer.token_to_id(t) for t in renderer.added_tokens()}
    assert renderer.text_token_ids("qq ~ @mention TAB", False) == rust_ids(
        renderer, "qq ~ @mention TAB")
    assert fast.encodes == before + 1


def test_a_post_processor_that_adds_tokens_keeps_add_special_tokens_on_the_rust_path(
        tmp_path: Path) -> None:
    renderer = gpt2_style(tmp_path, post_processor=True)
    fast = renderer.pretokenizer
    assert fast is not None and not fast.specials_free
    text = "It's a test.\n"
    with_bos = renderer.text_token_ids(text, add_special_tokens=True)
    assert with_bos == rust_ids(renderer, text, True)
    assert with_bos[1:] == renderer.text_token_ids(text, add_special_tokens=False)
    assert with_bos[0] == renderer._tokenizer.token_to_id("<|endoftext|>")


def test_the_word_memo_is_bounded(qwen_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretokenize, "WORD_MEMO_WORDS", 50)
    renderer = HFRenderer(qwen_dir)
    fast = renderer.pretokenizer
    assert fast is not None
    for i in range(40):
        text = " ".join(f"w{i}x{j}" for j in range(10)) + " " + "=" * 200
        assert renderer.text_token_ids(text, False) == rust_ids(renderer, text)
        assert fast.memo_words <= 50
    assert "=" * 200 not in fast._memo and " " + "=" * 200 not in fast._memo


# -- tokenizers the fast path does not take --------------------------------------------------

def _metaspace(tmp_path: Path) -> HFRenderer:
    """SentencePiece style: Metaspace pre-tokenizer, BPE."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    _train(tokenizer, ["<unk>", "<s>", "</s>"])
    return HFRenderer(_folder(tmp_path, "metaspace", tokenizer))


def _wordpiece(tmp_path: Path) -> HFRenderer:
    """BERT style: WordPiece, BertPreTokenizer, lower-casing normalizer."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]", "[CLS]"],
                                        show_progress=False)
    tokenizer.train_from_iterator(TRAINING * 10, trainer)
    return HFRenderer(_folder(tmp_path, "wordpiece", tokenizer))


def _byte_level_variant(tmp_path: Path, name: str, normalizer: normalizers.Normalizer | None,
                        add_prefix_space: bool) -> HFRenderer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space,
                                                       use_regex=True)
    _train(tokenizer, ["<|endoftext|>"], pre_tokenizers.ByteLevel.alphabet())
    return HFRenderer(_folder(tmp_path, name, tokenizer))


@pytest.mark.parametrize("kind", ["metaspace", "wordpiece", "lowercase", "prefix-space"])
def test_unsupported_tokenizers_keep_the_rust_path(kind: str, tmp_path: Path) -> None:
    if kind == "metaspace":
        renderer, reason = _metaspace(tmp_path), "pre-tokenizer 'Metaspace'"
    elif kind == "wordpiece":
        renderer, reason = _wordpiece(tmp_path), "model WordPiece"
    elif kind == "lowercase":
        renderer = _byte_level_variant(tmp_path, kind, normalizers.Lowercase(), False)
        reason = "normalizer 'Lowercase'"
    else:
        renderer = _byte_level_variant(tmp_path, kind, None, True)
        reason = "pre-tokenizer 'ByteLevel'"
    assert not renderer.fast_pretokenize and renderer.pretokenizer is None
    assert renderer.fast_pretokenize_reason.startswith(reason), renderer.fast_pretokenize_reason
    for text in TRAINING + ["Hello World", "  two  spaces  ", ""]:
        for special in (False, True):
            assert renderer.text_token_ids(text, special) == rust_ids(renderer, text, special)


def test_an_nfc_sequence_normalizer_is_taken(tmp_path: Path) -> None:
    renderer = _byte_level_variant(tmp_path, "nfc", normalizers.Sequence([normalizers.NFC()]),
                                   False)
    assert renderer.fast_pretokenize, renderer.fast_pretokenize_reason


def test_the_self_check_turns_the_fast_path_off_on_a_difference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GPT-2's split without its contractions: the Python side now splits "it's" otherwise.
    monkeypatch.setattr(pretokenize, "GPT2_PATTERN",
                        r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    renderer = gpt2_style(tmp_path)
    assert not renderer.fast_pretokenize
    assert renderer.fast_pretokenize_reason.startswith("self-check: different ids")
    text = "It's what they'll say."
    assert renderer.text_token_ids(text, False) == rust_ids(renderer, text)


# -- the split pattern -----------------------------------------------------------------------

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_python_pattern_translates_letters_and_numbers_for_re() -> None:
    translated, plain_re = python_pattern(QWEN_PATTERN)
    assert plain_re
    assert translated == (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
                          r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    assert python_pattern(r"\p{N}{1,3}|(ab)+|[\x41-\x5a]") == (r"[0-9]{1,3}|(?:ab)+|[\x41-\x5a]",
                                                               True)
    # Other properties stay as they are, for the regex module.
    assert python_pattern(r"[\p{Lu}\p{Lt}]+\p{Ll}*|\P{L}") == (r"[\p{Lu}\p{Lt}]+\p{Ll}*|\P{L}",
                                                               False)
    pretokenize.compile_split(r"[\p{Lu}\p{Lt}]+\p{Ll}*|\P{L}")  # compiles with regex


@pytest.mark.parametrize("pattern", [
    r"^\s+", r"\s+$", r"a.b", r"\h+", r"\bword", r"\Aa", r"(a)\1", r"[a[b]]", r"[a-z&&[^aeiou]]",
    r"[]a]", r"(?i)abc", r"(?<name>a)", r"(?m:a)", r"a{,3}", r"a{2}+", r"a{b", r"[abc", "a\\",
    r"\x{41}",
])
def test_python_pattern_refuses_what_oniguruma_reads_otherwise(pattern: str) -> None:
    with pytest.raises(Unsupported):
        python_pattern(pattern)


def test_offsets_give_the_rust_encodings_spans(renderer: HFRenderer) -> None:
    """What the piece reuse cuts long pieces with: every token's span and every
    character's token, as the Rust tokenizer's ``Encoding`` reports them."""
    fast = renderer.pretokenizer
    assert fast is not None
    rng = random.Random(7)
    added = renderer.added_tokens()
    taken = 0
    for _ in range(400):
        text = _fuzz_text(rng, added) * rng.randint(1, 12)
        text = text[:RELEASE_GIL_CHARS - 1]
        encoded = renderer.encode_with_offsets(text)
        assert encoded is not None
        ids, offsets = encoded
        encoding = renderer._encode(text, False)
        assert ids == list(encoding.ids), repr(text)
        if isinstance(offsets, pretokenize.FastOffsets):
            taken += 1
        for index in range(len(ids) + 1):
            assert offsets.token_to_chars(index) == encoding.token_to_chars(index), (text, index)
        for position in range(len(text) + 2):
            assert offsets.char_to_token(position) == encoding.char_to_token(position), (
                text, position)
    assert taken > 200  # most texts went the fast way
