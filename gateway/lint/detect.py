"""Find the spans of one text that are likely to change from request to request.

``Detector.scan(text, now)`` returns typed hits with exact character spans:

1. Fold the text (NFKC per character, ``normalize``) so full-width digits and
   punctuation match like ASCII.
2. Seed small windows cheaply: digit clusters (one linear scan; a bare short
   number in prose such as "30 days" is skipped at once), and literal cue
   words found with ``str.find``: ``@``, ``eyJ``, ``年``, relative phrases
   (``today``, ``今天``), name cues (``name``, ``Hello``, ``様``),
   username cues (``username``, ``user_id``), counter cues (``#``,
   ``remaining``, ``attempt``, ``seed``, ``unread``, ``page``, ``未读``, ``第``) and time-to-go
   cues (``ends in``). Each kind of window runs
   only the families that can match there, and only when the characters
   they need are present.
3. Validate each match by parsing it (``temporal``, ``identifiers``).
4. Longest span wins where hits overlap (ties: higher confidence, then the
   more specific family).
5. Compose adjacent temporal pieces: ``Monday, 30 November 2026 at 15:25 CET``
   and ``2026年11月30日（月）15時25分`` are one timestamp.
6. Context: after a relative phrase ("today is", "current time", "今天是") a
   hit is nearly certain; a bare weekday or a round clock time without one
   is left alone (a schedule, "open 9:00-17:00"), as is a time range. A
   value introduced as an example ("e.g. ORD-2024-88812", "the example UUID
   ...", the turns after an "Example:" label up to the next blank line) is
   one fixed illustration: its confidence drops below the warning level
   (``EXAMPLE_CONFIDENCE``), unless a relative phrase marks it as now.

Parameters: ``MARGIN`` (40) characters around a digit seed; ``TOKEN_REACH``
(300) how far a window grows to take in a whole token (ids, nonces).
"""

from __future__ import annotations

import datetime as dt
import re
from bisect import bisect_right
from collections.abc import Iterator

from gateway.lint import names, temporal
from gateway.lint.identifiers import Identifiers
from gateway.lint.model import Hit
from gateway.lint.normalize import Folder
from gateway.lint.patterns import (
    COUNTER_LITERALS,
    CUE_LITERALS,
    FUTURE_LITERALS,
    MONTHS,
    NAME_LITERALS,
    RELATIVE_BEFORE,
    USERNAME_LITERALS,
    PatternSet,
)
from gateway.lint.people import PersonNames
from gateway.lint.spans import TEMPORAL, longest_wins, merge, pieces
from gateway.lint.windows import (
    TOKEN_CHARS,
    TOKEN_REACH,
    DigitWindow,
    find_all,
    find_words,
    group_hit,
    merged,
    positions,
    text_before,
    token_end,
    valid,
)


def _first(match: re.Match[str], *groups: str) -> str:
    """The group of an alternation that matched."""
    return next(g for g in groups if match[g] is not None)


def _kana(word: str) -> bool:
    return any("\u3040" <= c <= "\u30ff" for c in word) or word in ("様", "会員", "氏名", "名前")


MARGIN = 40
SPACED_HOUR = re.compile(r"[0-9][ \u00a0\u202f]h[ \u00a0\u202f][0-5][0-9]")
"""``14 h 05``: French typography's time of day, spaces (often no-break ones) around the h."""
CUE_REACH = 24
"""How far before a window a token's name may start (``Session token: k8Jd9sLq2Xz7``)."""
CUE_CONFIDENCE = 0.97
EXAMPLE_CONFIDENCE = 0.45
"""An example's value: below the linter's warning level, so it is reported as ``info``."""
EXAMPLE_REACH = 40
"""How far after "e.g." or "example" the value it introduces may start (same sentence)."""
EXAMPLE_BLOCK = 2000
"""How far back an "Example:" label may open the block a hit is in."""
SENTENCE_END = re.compile(r"[.!?;。！？；](?:\s|$)|\n")
MAX_GAP = 12
MONTH_HEADS = frozenset(name[:3] for name in MONTHS)
CJK_TIME_CHARS = ("点", "點", "時", "时")
NAME_LITERALS_EN = tuple(w for w in NAME_LITERALS if w.isascii())
NAME_LITERALS_ZH = tuple(w for w in NAME_LITERALS if not w.isascii() and not _kana(w))
NAME_LITERALS_JA = tuple(w for w in NAME_LITERALS if not w.isascii() and _kana(w))
COUNTER_LITERALS_EN = tuple(w for w in COUNTER_LITERALS if w[0].isascii())
COUNTER_LITERALS_CJK = tuple(w for w in COUNTER_LITERALS if not w[0].isascii())


EXAMPLE_LITERALS = ("e.g", "eg.", "exampl", "instance", "such as", "sample", "z.b", "z. b",
                    "exemple", "ejemplo", "例")


class Examples:
    """The ends of the words that introduce examples in one text, found once per scan."""

    def __init__(self, t: str, inline: list[int], labels: list[int], breaks: list[int]) -> None:
        self.t, self.inline, self.labels, self.breaks = t, inline, labels, breaks

    def holds(self, start: int) -> bool:
        """After "e.g." or "example" in the same sentence, or in a block an "Example:"
        label opens (to the next blank line)."""
        i = bisect_right(self.inline, start) - 1
        if i >= 0 and start - self.inline[i] <= EXAMPLE_REACH and not SENTENCE_END.search(
                self.t, self.inline[i], start):
            return True
        i = bisect_right(self.labels, start) - 1
        if i < 0:
            return False
        j = bisect_right(self.breaks, start) - 1
        paragraph = self.breaks[j] if j >= 0 else 0
        return self.labels[i] > max(paragraph, start - EXAMPLE_BLOCK)


class Detector:
    def __init__(self, people: PersonNames | None = None) -> None:
        self.patterns = PatternSet()
        self.ids = Identifiers()
        self.folder = Folder()
        self.people = people or PersonNames()

    def scan(self, text: str, now: float) -> list[Hit]:
        if not text:
            return []
        folded = self.folder.fold(text)
        t = folded.text
        today = dt.datetime.fromtimestamp(now, dt.UTC).date()
        hits = list(self._digit_hits(t, now, today))
        hits.extend(self._literal_hits(t, today))
        hits.extend(self.people.scan(t))
        hits = longest_wins(hits)
        hits = longest_wins(hits + list(self._adjacent_weekdays(t, hits)))
        hits = self._context(t, self._compose(t, hits))
        out = []
        for hit in hits:
            start, end = folded.to_original(hit.start, hit.end)
            out.append(Hit(hit.kind, start, end, hit.confidence, hit.detail))
        return out

    # -- digit windows --------------------------------------------------------------------

    def _digit_windows(self, t: str) -> list[DigitWindow]:
        windows: list[DigitWindow] = []
        n = len(t)
        split = self.patterns.non_digits.split
        for match in self.patterns.seed_digits.finditer(t):
            s, e = match.span()
            cluster = match.group()
            if self._plain_number(t, s, e, cluster):
                continue
            runs = split(cluster)
            longest, digits = max(map(len, runs)), sum(map(len, runs))
            tokenish = (s > 0 and t[s - 1].isalpha()) or (e < n and t[e].isalpha())
            a, b = max(0, s - MARGIN), min(n, e + MARGIN)
            if windows and a <= windows[-1].end:
                last = windows[-1]
                last.end = max(last.end, b)
                last.longest = max(last.longest, longest)
                last.digits += digits
                last.tokenish = last.tokenish or tokenish
                continue
            if s and t[s - 1] in TOKEN_CHARS:  # inside a token: take all of it in
                low = max(0, s - TOKEN_REACH)
                while a > low and t[a - 1] in TOKEN_CHARS:
                    a -= 1
            windows.append(DigitWindow(a, b, longest, digits, tokenish))
        for window in windows:  # end where a token ends: no match is cut short by the edge
            window.end = token_end(t, window.end)
        return windows

    @staticmethod
    def _plain_number(t: str, s: int, e: int, cluster: str) -> bool:
        """A bare number in prose ("30 days", "tier 2", "Python 3.10", "v4.2"): no date,
        time, id or address can be made of it, so there is nothing to look at."""
        after = t[e] if e < len(t) else " "
        if after.isalnum():
            return False
        if not (cluster.isdigit() and len(cluster) <= 3):
            groups = cluster.rstrip(".").split(".")
            if len(groups) > 3 or not all(g.isdigit() and len(g) <= 3 for g in groups):
                return False
            if len(groups) == 3 and len(groups[0]) <= 2 and len(groups[1]) <= 2 \
                    and len(groups[2]) == 2:
                return False  # 7.12.26, a short date (near today: temporal.num_date)
        before = t[s - 1] if s else " "
        if before in "vV" and (s < 2 or not t[s - 2].isalnum()):
            return True  # v4.2
        if before.isalnum() or before in "+(#$@:/-.":
            return False
        following = t[e:e + 16]
        if SPACED_HOUR.match(t, e - 1):
            return False  # 14 h 05
        if " ago" in following or "前" in following[:6]:
            return False  # "12 minutes ago", "3小时前"
        if t[max(0, s - 8):s].lower().endswith(RELATIVE_BEFORE):
            return False  # "vor 3 Minuten", "il y a 3 minutes", "hace 3 minutos"
        if after == " " and (following[1:4].lower() in MONTH_HEADS
                             or following[1:4].lower() in ("of ", "de ")):
            return False
        if before == " ":
            words = t[max(0, s - 14):s - 1].rstrip(".,").rsplit(" ", 1)
            if words[-1][:3].lower() in MONTH_HEADS:
                return False
        return True

    def _digit_hits(self, t: str, now: float, today: dt.date) -> Iterator[Hit]:
        p, ids = self.patterns, self.ids
        for window in self._digit_windows(t):
            a, b = window.start, window.end
            w = t[a:b]
            colon, dash, slash, dot = ":" in w, "-" in w, "/" in w, "." in w
            found: list[Hit | None] = []
            if colon and dash:
                found += [temporal.iso_datetime(m, today) for m in p.iso_datetime.finditer(t, a, b)]
            if dash or slash or dot:
                found += [self._not_version(t, m, temporal.num_date(m, today))
                          for m in p.num_date.finditer(t, a, b)]
            if window.longest >= 8:
                found += [temporal.compact_date(m, today) for m in p.compact_date.finditer(t, a, b)]
            found += [temporal.month_date(m, t, today, p.month_before)
                      for m in p.month_date.finditer(t, a, b)]
            if window.tokenish and (dash or slash):
                found += [temporal.dash_month_date(m, today)
                          for m in p.dash_month_date.finditer(t, a, b)]
            if "月" in w or "월" in w:
                found += [temporal.cjk_date(m, t, today, p.era_before)
                          for m in p.cjk_date.finditer(t, a, b)]
            if colon:
                found += [temporal.clock(m) for m in p.time.finditer(t, a, b)]
            if "h" in w and (window.tokenish or SPACED_HOUR.search(w)):
                found += [temporal.french_clock(m) for m in p.french_time.finditer(t, a, b)]
            if any(c in w for c in CJK_TIME_CHARS):
                found += [temporal.cjk_time(m, t, p.ampm_before) for m in p.cjk_time.finditer(t, a, b)]
            if window.longest >= 10:
                found += [temporal.epoch(m, now) for m in p.epoch.finditer(t, a, b)]
            if "ago" in w or "前" in w or any(r in w.lower() for r in RELATIVE_BEFORE):
                found += [temporal.relative_time(m) for m in p.relative_time.finditer(t, a, b)]
            if w.count("-") >= 4:
                found += [ids.uuid(m, now) for m in p.uuid.finditer(t, a, b)]
            if window.tokenish or window.longest >= 16:
                found += [ids.ulid(m, now) for m in p.ulid.finditer(t, a, b)]
                found += [ids.hex_id(m, text_before(t, m.start()), p.fingerprint_before)
                          for m in p.hex_id.finditer(t, a, b)]
                found += [ids.nonce(m) for m in p.nonce.finditer(t, a, b)]
            if window.tokenish:
                found += [ids.cued_nonce(m) for m in p.cued_nonce.finditer(t, max(0, a - CUE_REACH), b)
                          if m.start("value") >= a]
            if "W" in w:
                found += [temporal.iso_week(m, today) for m in p.iso_week.finditer(t, a, b)]
            if (dash or "_" in w) and (window.tokenish or window.longest >= 6):
                found += [self._prefixed(t, m) for m in p.prefixed_id.finditer(t, a, b)]
            if window.tokenish or window.digits >= 4 or "#" in w:
                found += [ids.record_id(m, self._record_cued(t, m.start()))
                          for m in p.record_id.finditer(t, a, b)]
            if w.count(".") >= 3:
                found += [ids.ipv4(m, text_before(t, m.start()), p.version_before)
                          for m in p.ipv4.finditer(t, a, b)]
            if w.count(":") >= 2:
                found += [ids.ipv6(m) for m in p.ipv6.finditer(t, a, b)]
            if window.digits >= 7 or "+" in w or "(" in w:
                found += [ids.phone(m) for m in p.phone.finditer(t, a, b)]
            if any(x in w for x in ("st ", "nd ", "rd ", "th ")):
                found += [group_hit(m, "n", "counter", 0.8)
                          for m in p.counter_ordinal.finditer(t, a, b)]
            yield from valid(t, b, found)

    def _prefixed(self, t: str, match: re.Match[str]) -> Hit | None:
        before = self.patterns.prefix_before.search(t, max(0, match.start() - 8), match.start())
        if before is None:
            return None
        hit = self.ids.prefixed_id(before["prefix"], match["body"])
        if hit is None:
            return None
        return Hit(hit.kind, before.start(), match.end(), hit.confidence, hit.detail)

    def _record_cued(self, t: str, start: int) -> bool:
        return self.patterns.record_cue.search(t, max(0, start - 32), start) is not None

    def _not_version(self, t: str, match: re.Match[str], hit: Hit | None) -> Hit | None:
        if hit is not None and self.patterns.version_before.search(text_before(t, match.start())):
            return None
        return hit

    # -- literal windows ------------------------------------------------------------------

    def _literal_hits(self, t: str, today: dt.date) -> Iterator[Hit]:
        p, ids = self.patterns, self.ids
        lowered = t.lower()
        if len(lowered) != len(t):
            lowered = t
        n = len(t)
        for a, b in merged(find_all(t, "@", 64, 260), n):
            found = [ids.email(m) for m in p.email.finditer(t, a, b)]
            found += [names.handle(m, p.handle_cue.search(t, max(0, m.start() - 16), m.start())
                                   is not None) for m in p.handle.finditer(t, a, b)]
            yield from valid(t, b, found)
        for a, b in merged(find_words(lowered, USERNAME_LITERALS, 0, 64), n):
            yield from valid(t, b, [names.username(m) for m in p.username.finditer(t, a, b)])
        for a, b in merged(((i, i + 12400) for i in positions(t, "eyJ")), n):
            yield from valid(t, b, [ids.jwt(m) for m in p.jwt.finditer(t, a, b)])
        numeral_years = (i for i in positions(t, "年") if i and t[i - 1] in "〇零一二三四五六七八九")
        for a, b in merged(((i - 4, i + 10) for i in numeral_years), n):
            yield from valid(t, b, [temporal.cjk_numeral_date(m, today)
                                     for m in p.cjk_numeral_date.finditer(t, a, b)])
        for a, b in merged(find_words(lowered, NAME_LITERALS_EN, 48, 64), n):
            yield from valid(t, b, [names.name_en(m) for m in p.name_en.finditer(t, a, b)])
        for a, b in merged(find_words(t, NAME_LITERALS_ZH, 8, 24), n):
            yield from valid(t, b, [names.name_zh(m) for m in p.name_zh.finditer(t, a, b)])
        for a, b in merged(find_words(t, NAME_LITERALS_JA, 12, 24), n):
            yield from valid(t, b, [names.name_ja(m) for m in p.name_ja.finditer(t, a, b)])
        for a, b in merged(find_words(lowered, COUNTER_LITERALS_EN, 48, 48), n):
            found = [group_hit(m, "n", "counter", 0.85) for m in p.counter_label.finditer(t, a, b)]
            found += [group_hit(m, "n", "counter", 0.7)
                      for m in p.counter_position.finditer(t, a, b)]
            found += [group_hit(m, _first(m, "n1", "n2", "n3", "n4", "n5", "n6"), "counter", 0.8)
                      for m in p.counter_progress.finditer(t, a, b)]
            found += [group_hit(m, _first(m, "n1", "n2", "n3", "n4"), "counter", 0.8)
                      for m in p.counter_amount.finditer(t, a, b)
                      if m["n4"] is None or not p.limit_before.search(t, max(0, m.start() - 16),
                                                                      m.start())]
            found += [Hit("nonce", *m.span(g), 0.8, "random seed")
                      for m in p.seed.finditer(t, a, b) for g in [_first(m, "n1", "n2")]]
            yield from valid(t, b, found)
        for a, b in merged(find_words(lowered, FUTURE_LITERALS, 48, 32), n):
            yield from valid(t, b, [group_hit(m, _first(m, "r1", "r2"), "relative_time", 0.85)
                                     for m in p.relative_future.finditer(t, a, b)])
        for a, b in merged(find_words(t, COUNTER_LITERALS_CJK, 8, 16), n):
            yield from valid(t, b, [
                group_hit(m, _first(m, "n1", "n2", "n3", "n4", "n5"), "counter", 0.85)
                for m in p.counter_cjk.finditer(t, a, b)])
        for a, b in merged(find_words(lowered, CUE_LITERALS, 0, 48), n):
            yield from valid(t, b, [temporal.weekday(m) for m in p.weekday.finditer(t, a, b)])

    def _adjacent_weekdays(self, t: str, hits: list[Hit]) -> Iterator[Hit]:
        """``Monday,`` before a date, ``（月）`` or ``星期一`` after one."""
        weekday = self.patterns.weekday
        for hit in hits:
            if hit.kind not in ("date", "timestamp", "time"):
                continue
            for m in weekday.finditer(t, max(0, hit.start - 16), hit.start):
                if not t[m.end():hit.start].strip(" ,，、"):
                    found = temporal.weekday(m)
                    if found:
                        yield found
            for m in weekday.finditer(t, hit.end, min(len(t), hit.end + 16)):
                if not t[hit.end:m.start()].strip(" ,，、"):
                    found = temporal.weekday(m)
                    if found:
                        yield found
                break

    # -- composition and context ----------------------------------------------------------

    def _compose(self, t: str, hits: list[Hit]) -> list[Hit]:
        out: list[Hit] = []
        chain: list[Hit] = []
        for hit in hits + [Hit("", len(t) + MAX_GAP + 1, 0, 0.0)]:
            if hit.kind in TEMPORAL and chain and self._joins(t, chain, hit):
                chain.append(hit)
                continue
            if chain:
                out.append(merge(chain))
                chain = []
            if hit.kind in TEMPORAL:
                chain = [hit]
            elif hit.kind:
                out.append(hit)
        return sorted(out, key=lambda h: h.start)

    def _joins(self, t: str, chain: list[Hit], hit: Hit) -> bool:
        gap = t[chain[-1].end:hit.start]
        if len(gap) > MAX_GAP or "\n" in gap or not self.patterns.temporal_gap.fullmatch(gap):
            return False
        parts = pieces(chain)
        new = pieces([hit])
        return not (parts & new)

    def _context(self, t: str, hits: list[Hit]) -> list[Hit]:
        out = []
        examples = self._examples(t)
        for hit in hits:
            cued = self._cued(t, hit.start)
            if hit.kind in TEMPORAL or hit.kind == "epoch":
                if hit.kind == "weekday" and not cued:
                    continue
                if hit.kind == "time" and not cued and (
                        self._in_range(t, hit) or hit.detail == "round"):
                    continue
                if cued:
                    hit = Hit(hit.kind, hit.start, hit.end, max(hit.confidence, CUE_CONFIDENCE),
                              hit.detail)
            if not cued and examples.holds(hit.start):
                detail = f"{hit.detail}; in an example" if hit.detail else "in an example"
                hit = Hit(hit.kind, hit.start, hit.end, min(hit.confidence, EXAMPLE_CONFIDENCE),
                          detail)
            out.append(hit)
        return out

    def _examples(self, t: str) -> Examples:
        """Where examples are: one pass over the text for the words that introduce them."""
        lowered = t.lower()
        if not any(w in lowered for w in EXAMPLE_LITERALS):
            return Examples(t, [], [], [])
        p = self.patterns
        return Examples(t, [m.end() for m in p.example_inline.finditer(t)],
                        [m.end() for m in p.example_label.finditer(t)], list(positions(t, "\n\n")))

    def _cued(self, t: str, start: int) -> bool:
        before = t[max(0, start - 40):start]
        last = None
        for last in self.patterns.cue.finditer(before):
            pass
        return last is not None and not before[last.end():].strip(" :=,，：\t")

    def _in_range(self, t: str, hit: Hit) -> bool:
        after = t[hit.end:hit.end + 12]
        before = t[max(0, hit.start - 12):hit.start]
        return bool(self.patterns.time_range_after.match(after)
                    or self.patterns.time_range_before.search(before))


