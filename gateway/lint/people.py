"""Find person names without a cue: "Help the customer Maria Lopez", "为客户王小明处理订单".

The cue patterns of ``names`` see a name only after a phrase that announces
one ("The user's name is", "用户：", "様"). This module finds names where the
prompt just uses them, with a name resource per script, every one offline
with its data inside the installed package:

* Latin script: Faker's first- and last-name lists for the locales in
  ``LATIN_LOCALES`` (about 6,800 first and 6,000 last names). A name is a
  known first name followed by one or two known last names ("Maria Lopez",
  "Maria Lopez Garcia", "Maria J. Lopez"), or any capitalised words after a
  role or title ("the customer Maria", "patient John Smith", "Dr. Okafor"),
  or after "You are helping" (assisting, serving ...) a known first name and
  the surname after it, listed or not ("Priya Raghunathan"), that end the
  phrase (``_served``: "Summer Camp parents" are not a person). First names
  that are also common words ("Grace", "Max", "Will") count only after a role,
  a title or that cue.
* Chinese: jieba's part-of-speech tags; a word tagged ``nr`` (person) counts
  when it starts with a common surname followed by a two-character given
  name, or a one-character one with a title after it or a role before it
  ("张伟经理", "联系人张伟"). jieba sees only windows around characters that
  can start a surname (``ZH_MARGIN`` either side).
  Brands that jieba tags as names ("华为") are two characters and so need
  that context.
* Japanese: MeCab (fugashi) with the IPA dictionary; a surname followed by a
  given name (both ``名詞,固有名詞,人名``), or either one followed by an
  honorific (様, さん, 氏 ...), which is not part of the span.

Each resource is loaded on the first text of its script and kept
(``NameResources``). Measured in CPU time on the project's 2-core machine
under load: the Latin lists 0.15 s, jieba's dictionary about 2 s, MeCab
10 ms. ``needs_loading(text)`` says whether scanning ``text`` would load
one, so the gateway does that first scan off its event loop, and ``cost``
weighs Chinese text for its choice of thread. A whole detector scan, names
included, then costs about 1.4 us per character of English (0.3 before
names), 7 us of Chinese (1.0) and 3 us of Japanese (0.6); the gateway pays
it once per distinct field text (memoized). Memory once loaded (RSS): the
Latin lists 13 MB, jieba 87 MB (its prefix dictionary), MeCab 23 MB (the
dictionary, mapped from the package's file).

A name every request shares (a product, a company, the assistant's persona)
is still a hit here; the batch linter and the gateway's live learning demote
it once they see it never varies.

The three resources are the ``names`` extra (``pip install 'prefixgate[names]'``:
jieba, fugashi, ipadic, faker, about 120 MB). Without it, a script whose
packages are missing is not scanned here (the cue patterns of ``names`` still
run), and ``PersonNames.notice`` says so (``NAMES_NOTICE``): the linter's
outputs carry that line, and the gateway logs it at start-up. Whether a
package is installed is asked in one place, ``installed``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gateway.lint.model import Hit
from gateway.lint.patterns import (
    JA_WEEKDAYS,
    MONTHS,
    WEEKDAYS,
    ZH_COMPOUND_SURNAMES,
    ZH_SURNAMES,
)

LATIN_LOCALES = ("en_US", "en_GB", "en_IN", "es_ES", "es_MX", "fr_FR", "de_DE", "it_IT",
                 "pt_BR", "nl_NL", "pl_PL", "tr_TR", "vi_VN", "id_ID")
WORDLIKE_FIRST = frozenset(
    ["Grace", "Hope", "Joy", "Faith", "Max", "Mark", "Rose", "Summer", "Chase", "Ray", "Guy", "Will", "Bill", "Sunny", "Dawn", "Iris", "Ivy", "Lily", "Amber", "Ruby", "Jade", "Pearl", "Penny", "Crystal", "Sky", "Star", "Page", "Art", "Frank", "Rich", "Sage", "Honor", "Major", "Claude", "Nova", "Ada", "Alexa", "Siri", "Jarvis", "Gemini", "Victoria", "Georgia", "Virginia", "Florida", "Carolina", "Austin", "Dallas", "Paris", "London", "Sydney", "Jordan", "Lincoln", "Ford", "Tesla", "Mercedes", "Harley", "Dell", "Wendy", "Angel", "Gene", "Bob"])
"""First names that are also words, brands, places or assistant personas: names only after
a role or a title."""
ROLE_WORDS = (
    "customer|user|client|patient|member|caller|guest|student|employee|applicant|candidate"
    "|buyer|seller|tenant|traveler|traveller|passenger|subscriber|cardholder|account holder"
    "|policyholder|agent|representative|contact|recipient|sender|driver|owner")
SERVING = (r"(?i:\b(?:you\ are|you['’]re|you\ will\ be|you['’]ll\ be)\ (?:now\ |currently\ )?"
           r"(?:helping|assisting|serving|supporting|working\ with))")
"""A cue for the person a conversation is about, with no role word: "You are helping
Priya Raghunathan today" (a known first name, then any surname: ``_served``)."""
SERVED_FOLLOWERS = frozenset(
    ["today", "now", "with", "who", "on", "in", "at", "for", "through", "to", "about", "and",
     "from", "as", "again", "during", "this", "until", "by", "whose"])
"""Words that may follow the name after that cue; another lowercase word makes the
capitalised words a modifier ("You are helping Summer Camp parents")."""
TITLES = "Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Señor|Señora|Sr|Sra|Herr|Frau|Mme|Mlle|M"
ZH_TITLES = ("先生", "女士", "小姐", "老师", "同学", "经理", "总监", "主任", "医生", "律师",
             "阿姨", "师傅", "总", "同志", "教授", "博士", "老板", "店长", "专员")
ZH_ROLES = ("客户", "用户", "会员", "顾客", "联系人", "负责人", "经办人", "患者", "学员", "乘客",
            "收件人", "寄件人", "业主", "租客", "联系", "致", "尊敬的", "亲爱的", "您好")
JA_HONORIFICS = ("様", "さん", "氏", "殿", "先生", "くん", "君", "ちゃん", "さま")
MAX_TAGGED_CHARS = 16384
"""Per scanned text and script, at most this many characters go to jieba or MeCab (about
65 ms of jieba): beyond, only the cue patterns of ``names`` look for names."""
HAN_COST = 4
"""Measured CPU per character, Chinese (jieba) over Latin text: about 4 times."""
ZH_MARGIN = 6
"""Characters of context on each side of a possible surname that jieba segments."""
ZH_SURNAME_STARTS = frozenset(ZH_SURNAMES) | {s[0] for s in ZH_COMPOUND_SURNAMES}
LATIN_CONFIDENCE = 0.8
CUED_CONFIDENCE = 0.85
CJK_CONFIDENCE = 0.8


SCRIPT_PACKAGES: dict[str, tuple[str, ...]] = {
    "latin": ("faker",), "zh": ("jieba",), "ja": ("fugashi", "ipadic")}
"""The packages each script's name resource loads (``LOADERS``): the ``names`` extra."""
SCRIPT_LABELS = {"latin": "Latin", "zh": "Chinese", "ja": "Japanese"}
NAMES_EXTRA = "prefixgate[names]"
NAMES_NOTICE = ("names: not checked without a cue (such as \"my name is\") in {scripts} text; "
                f"install {NAMES_EXTRA}")
"""What a linter without (all of) the ``names`` extra says, once, in its output."""


def installed(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it."""
    return importlib.util.find_spec(package) is not None


def unchecked_scripts() -> tuple[str, ...]:
    """The scripts whose name resources are not installed."""
    return tuple(script for script, packages in SCRIPT_PACKAGES.items()
                 if not all(installed(package) for package in packages))


def names_notice(unchecked: tuple[str, ...]) -> str | None:
    """The line that says which scripts' names go unchecked, or None when none do."""
    if not unchecked:
        return None
    labels = [SCRIPT_LABELS[script] for script in unchecked]
    scripts = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]
    return NAMES_NOTICE.format(scripts=scripts)


_KANA = re.compile("[\u3040-\u30ff]")
_HAN = re.compile("[\u4e00-\u9fff]")
_LATIN = re.compile("[A-ZÀ-Þ][a-z]")


def _has_kana(text: str) -> bool:
    return _KANA.search(text) is not None


def _has_han(text: str) -> bool:
    return _HAN.search(text) is not None


class NameResources:
    """The three name resources, each loaded once on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, Any] = {}

    def loaded(self, script: str) -> bool:
        return script in self._loaded

    def get(self, script: str) -> Any:
        found = self._loaded.get(script)
        if found is not None:
            return found
        with self._lock:
            if script not in self._loaded:
                self._loaded[script] = LOADERS[script]()
            return self._loaded[script]


def _load_latin() -> tuple[frozenset[str], frozenset[str]]:
    first: set[str] = set()
    last: set[str] = set()
    for locale in LATIN_LOCALES:
        provider = importlib.import_module(f"faker.providers.person.{locale}").Provider
        for attribute in vars(provider):
            values = getattr(provider, attribute)
            if attribute.startswith("first_names"):
                first.update(v for v in values if isinstance(v, str) and v[:1].isupper())
            elif attribute.startswith("last_names"):
                last.update(v for v in values if isinstance(v, str) and v[:1].isupper())
    not_names = {name.capitalize() for name in (*MONTHS, *WEEKDAYS)}
    return frozenset(first - not_names), frozenset(last - not_names)


def _load_chinese() -> Any:
    jieba = importlib.import_module("jieba")
    # jieba logs its dictionary loading at DEBUG to stderr (set when it is imported): noise
    # in a CLI run and in the gateway's log.
    logging.getLogger("jieba").setLevel(logging.WARNING)
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    # jieba's plain segmenter, whose 4-state HMM finds new words (a name it has never
    # seen), and the dictionary's person tags (nr, nrt, nrfg) read from its word list:
    # jieba.posseg's per-tag HMM costs 50 times more per character, and importing it loads
    # the tags of every word twice (measured: seconds).
    tags: dict[str, str] = {}
    with tokenizer.get_dict_file() as handle:
        for raw in handle:
            parts = raw.decode("utf-8").split()
            if len(parts) == 3 and parts[2].startswith("nr"):
                tags[parts[0]] = parts[2]
    # One cut at a time: jieba's lazy state is not reentrant.
    return tokenizer, tags, threading.Lock()


def _load_japanese() -> Any:
    fugashi = importlib.import_module("fugashi")
    ipadic = importlib.import_module("ipadic")
    tagger = fugashi.GenericTagger(ipadic.MECAB_ARGS)
    return tagger, threading.Lock()


LOADERS: dict[str, Callable[[], Any]] = {
    "latin": _load_latin, "zh": _load_chinese, "ja": _load_japanese}


class PersonNames:
    def __init__(self, resources: NameResources | None = None,
                 unchecked: tuple[str, ...] | None = None) -> None:
        self.resources = resources or NameResources()
        self.unchecked = unchecked_scripts() if unchecked is None else unchecked
        """Scripts left to the cue patterns: their name resources are not installed."""
        self.notice = names_notice(self.unchecked)
        """``NAMES_NOTICE`` for those scripts; None when every resource is installed."""
        word = r"(?:O['’]|Mc|Mac)?[A-ZÀ-Þ][a-zß-ÿ'’-]+"
        self._words = re.compile(rf"(?<![\w@./#-]){word}(?:\ (?:[A-Z]\.\ )?{word})*")
        self._word = re.compile(word)
        self._role = re.compile(rf"(?:(?i:\b(?:{ROLE_WORDS})s?)(?:\ (?i:named|called))?,?"
                                rf"|(?P<serving>{SERVING}))\ $")
        self._title = re.compile(rf"\b(?:{TITLES})\.?\ $")

    def needs_loading(self, text: str) -> bool:
        return any(not self.resources.loaded(script) for script in self._scripts(text))

    def cost(self, text: str) -> int:
        """What scanning ``text`` costs, in characters of Latin text: a Chinese character
        costs about ``HAN_COST`` of them (jieba), bounded by ``MAX_TAGGED_CHARS``."""
        han = min(len(_HAN.findall(text)), MAX_TAGGED_CHARS) if _has_han(text) else 0
        return len(text) + (HAN_COST - 1) * han

    def scan(self, text: str) -> list[Hit]:
        hits: list[Hit] = []
        for script in self._scripts(text):
            if script == "latin":
                hits.extend(self._latin(text))
                continue
            budget = MAX_TAGGED_CHARS
            for start, line in _lines(text):
                if budget <= 0:
                    break
                if script == "ja" and _has_kana(line):
                    line = line[:budget]
                    budget -= len(line)
                    hits.extend(_shift(self._japanese(line), start))
                elif script == "zh" and not _has_kana(line) and _has_han(line):
                    for a, b in _surname_windows(line):
                        piece = line[a:min(b, a + budget)]
                        budget -= len(piece)
                        hits.extend(_shift(self._chinese(piece), start + a))
                        if budget <= 0:
                            break
        return hits

    def _scripts(self, text: str) -> list[str]:
        scripts = []
        if _LATIN.search(text):
            scripts.append("latin")
        if _has_kana(text):
            scripts.append("ja")
        if _has_han(text) and any(not _has_kana(line) and _has_han(line)
                                  for _, line in _lines(text)):
            scripts.append("zh")
        return [script for script in scripts if script not in self.unchecked]

    # -- Latin script -----------------------------------------------------------------------

    def _latin(self, text: str) -> Iterator[Hit]:
        first, last = self.resources.get("latin")
        for run in self._words.finditer(text):
            words = [(m.start() + run.start(), m.group()) for m in self._word.finditer(run.group())]
            before = max(0, run.start() - 40), run.start()
            if self._title.search(text, *before):  # "Dr. Okafor", "Ms. Ana María Ruiz"
                end_start, end_word = words[min(len(words), 3) - 1]
                yield Hit("name", run.start(), end_start + len(end_word), CUED_CONFIDENCE,
                          "person name")
                continue
            role = self._role.search(text, *before)
            served = _served(words, text[run.end():run.end() + 24], first) if (
                role is not None and role["serving"]) else None
            if served is not None:
                yield served
                continue
            yield from self._names_in(words, role is not None and not role["serving"], first,
                                      last)

    @staticmethod
    def _names_in(words: list[tuple[int, str]], cued: bool, first: frozenset[str],
                  last: frozenset[str]) -> Iterator[Hit]:
        index = 0
        while index < len(words):
            start, word = words[index]
            surnames = 0
            while (index + 1 + surnames < len(words) and surnames < 2
                   and (_surname(words[index + 1 + surnames][1], last)
                        or (cued and index == 0 and _unlisted_surname(words[index + 1 + surnames][1])))):
                surnames += 1
            known = word in first and (word not in WORDLIKE_FIRST or cued)
            if (known and (surnames or cued)) or (cued and index == 0 and word in last):
                end_start, end_word = words[index + surnames]
                yield Hit("name", start, end_start + len(end_word),
                          CUED_CONFIDENCE if cued else LATIN_CONFIDENCE, "person name")
                index += surnames + 1
                continue
            index += 1

    # -- Chinese ----------------------------------------------------------------------------

    def _chinese(self, line: str) -> Iterator[Hit]:
        tokenizer, tags, lock = self.resources.get("zh")
        with lock:
            words = list(tokenizer.cut(line, HMM=True))
        # A word the dictionary does not know came from the HMM: tagged a possible name.
        pairs = _join_compound([(w, tags.get(w) or ("x" if w in tokenizer.FREQ else "nr"))
                                for w in words])
        position = 0
        for word, flag in pairs:
            start = line.find(word, position)
            if start < 0:
                continue
            position = start + len(word)
            if flag not in ("nr", "nrfg") or not 2 <= len(word) <= 4:
                continue
            if word[0] in JA_WEEKDAYS and word[1:] in ("曜日", "曜"):
                continue  # "金曜日" (Friday) in Japanese without kana: jieba tags it a name
            compound = word[:2] in ZH_COMPOUND_SURNAMES
            if not (compound or word[0] in ZH_SURNAMES):
                continue
            given = len(word) - (2 if compound else 1)
            if given > 2:
                continue  # "简体中文": four characters are a name only with a compound surname
            context = (line[position:].startswith(ZH_TITLES)
                       or line[max(0, start - 4):start].endswith(ZH_ROLES))
            if given >= 2 or (given == 1 and context):
                yield Hit("name", start, position, CJK_CONFIDENCE, "person name")

    # -- Japanese ---------------------------------------------------------------------------

    def _japanese(self, line: str) -> Iterator[Hit]:
        tagger, lock = self.resources.get("ja")
        with lock:
            nodes = [(node.surface, tuple(node.feature)) for node in tagger(line)]
        position = 0
        placed: list[tuple[int, int, str]] = []  # start, end, 姓 / 名 / "" (not a name)
        for surface, feature in nodes:
            start = line.find(surface, position)
            if start < 0:
                continue
            position = start + len(surface)
            part = feature[3] if len(feature) > 3 and feature[2] == "人名" else ""
            placed.append((start, position, part))
        index = 0
        while index < len(placed):
            start, end, part = placed[index]
            if not part:
                index += 1
                continue
            span_end, parts = end, 1
            if part == "姓" and index + 1 < len(placed) and placed[index + 1][2] == "名":
                span_end, parts = placed[index + 1][1], 2
            if parts == 2 or line[span_end:].startswith(JA_HONORIFICS):
                yield Hit("name", start, span_end, CJK_CONFIDENCE, "person name")
            index += parts


def _served(words: list[tuple[int, str]], after: str, first: frozenset[str]) -> Hit | None:
    """The person "You are helping" names: a known first name, and the one or two
    capitalised words after it (its surname, listed or not), when they end the phrase:
    punctuation, the end, or a word such as "today" or "with" after them ("You are helping
    Grace Hopper Academy students" names a school's students)."""
    if not words or words[0][1] not in first or len(words) > 3:
        return None
    if not all(_unlisted_surname(word) for _, word in words[1:]):
        return None
    if len(words) == 1 and words[0][1] in WORDLIKE_FIRST:
        return None  # "You are helping Max" may be a product
    following = after.split(maxsplit=1)
    if after[:1].isspace() and following and following[0][:1].islower() and (
            following[0].rstrip(".,;:!?") not in SERVED_FOLLOWERS):
        return None
    end_start, end_word = words[-1]
    return Hit("name", words[0][0], end_start + len(end_word), LATIN_CONFIDENCE, "person name")


def _unlisted_surname(word: str) -> bool:
    """After a role ("the patient Emily Rosewater"), a capitalised word right after the first
    name is its surname, listed or not, unless it is a month or a weekday."""
    return word.lower() not in MONTHS and word.lower() not in WEEKDAYS


def _surname(word: str, last: frozenset[str]) -> bool:
    return word in last or (len(word) > 3 and word.startswith(("O'", "O’", "Mc", "Mac"))
                            and word[2 if word[1] in "'’c" else 3].isupper())


def _join_compound(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """jieba cuts "欧阳娜娜" as 欧阳 + 娜娜: a compound surname and a name-like word are one."""
    out: list[tuple[str, str]] = []
    for word, flag in pairs:
        if (out and out[-1][0] in ZH_COMPOUND_SURNAMES and flag.startswith("nr")
                and 1 <= len(word) <= 2):
            out[-1] = (out[-1][0] + word, "nr")
            continue
        out.append((word, flag))
    return out


def _surname_windows(line: str) -> Iterator[tuple[int, int]]:
    """Merged spans around each character that can start a Chinese name: all jieba sees."""
    window: list[int] | None = None
    for index, char in enumerate(line):
        if char not in ZH_SURNAME_STARTS:
            continue
        a, b = max(0, index - ZH_MARGIN), min(len(line), index + ZH_MARGIN + 4)
        if window is not None and a <= window[1]:
            window[1] = b
            continue
        if window is not None:
            yield window[0], window[1]
        window = [a, b]
    if window is not None:
        yield window[0], window[1]


def _lines(text: str) -> Iterator[tuple[int, str]]:
    start = 0
    for line in text.split("\n"):
        yield start, line
        start += len(line) + 1


def _shift(hits: Iterator[Hit], offset: int) -> Iterator[Hit]:
    for hit in hits:
        yield Hit(hit.kind, hit.start + offset, hit.end + offset, hit.confidence, hit.detail)
