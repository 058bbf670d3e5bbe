"""Validate date and time matches by building the value they name.

Each function takes a match of one ``PatternSet`` family and the day it is
now, and returns a :class:`~gateway.lint.model.Hit` or None. A match only
becomes a hit when it names a real calendar date or clock time; how close it
is to now sets the confidence (today's date is almost surely dynamic; a date
years away is more likely fixed text such as a policy's effective date).
"""

from __future__ import annotations

import datetime as dt
import re

from gateway.lint.model import Hit
from gateway.lint.patterns import (
    CJK_NUMERALS,
    CJK_WEEKDAYS,
    ERAS,
    JA_WEEKDAYS,
    LONG_WEEKDAYS,
    MONTH_ABBREVIATIONS,
    MONTHS,
    SPANISH_AUGUST,
    WEEKDAYS,
)

NEAR_DAYS = 45
RECENT_DAYS = 400
EPOCH_PAST_DAYS = 3 * 365
EPOCH_FUTURE_DAYS = 365


def date_confidence(value: dt.date, today: dt.date) -> float:
    distance = abs((value - today).days)
    if distance <= NEAR_DAYS:
        return 0.95
    if distance <= RECENT_DAYS:
        return 0.8
    return 0.45


YEARLESS_NEAR = 0.85
YEARLESS_FAR = 0.45


def yearless_confidence(month: int, day: int, today: dt.date) -> float:
    """A day of the year written without its year ("7 December", "12月7日"): near today it is
    likely today's date written short; further off it is more likely a day that comes back
    every year -- a holiday, a fiscal year's start, a deadline -- that is, fixed text."""
    days = [abs((value - today).days) for year in (today.year - 1, today.year, today.year + 1)
            if (value := make_date(year, month, day)) is not None]
    return YEARLESS_NEAR if days and min(days) <= NEAR_DAYS else YEARLESS_FAR


def make_date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _year(text: str, today: dt.date) -> int:
    year = int(text)
    if len(text) == 2:
        century = today.year - today.year % 100
        year += century if century + year <= today.year + 20 else century - 100
    return year


def _date_hit(match: re.Match[str], value: dt.date | None, today: dt.date,
              yearless: bool = False, detail: str = "") -> Hit | None:
    if value is None:
        return None
    confidence = (yearless_confidence(value.month, value.day, today) if yearless
                  else date_confidence(value, today))
    return Hit("date", match.start(), match.end(), confidence, detail or value.isoformat())


def iso_datetime(match: re.Match[str], today: dt.date) -> Hit | None:
    end = match.start("zone") if match["zone"] else match.end()
    text = match.string[match.start():end].replace(" ", "T").replace(",", ".")
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    # as sure as its date: a time on a date years away (1970-01-01T00:00:00Z, an example's
    # 2024-01-15 14:30) is as likely fixed text as that date alone
    confidence = date_confidence(value.date(), today)
    return Hit("timestamp", match.start(), match.end(), confidence, value.isoformat())


def num_date(match: re.Match[str], today: dt.date) -> Hit | None:
    g = match.groupdict()
    if g["y1"]:
        return _date_hit(match, make_date(int(g["y1"]), int(g["m1"]), int(g["d1"])), today)
    if g["y4"]:
        # 7.12.26: the German (and much of Europe's) short date, day first. Three small
        # numbers with dots are a version as often: a date only near today (NEAR_DAYS).
        value = make_date(_year(g["y4"], today), int(g["m4"]), int(g["d4"]))
        if value is None or abs((value - today).days) > NEAR_DAYS:
            return None
        return Hit("date", match.start(), match.end(), 0.6, value.isoformat())
    a, b, year_text = (g["a2"], g["b2"], g["y2"]) if g["a2"] else (g["a3"], g["b3"], g["y3"])
    year = _year(year_text, today)
    # Day-first and month-first orders are both in use; either reading may be valid.
    candidates = [d for d in (make_date(year, int(b), int(a)), make_date(year, int(a), int(b)))
                  if d is not None]
    if not candidates:
        return None
    best = min(candidates, key=lambda d: abs((d - today).days))
    hit = _date_hit(match, best, today)
    if hit and not g["a2"]:  # two-digit year: weaker evidence
        return Hit(hit.kind, hit.start, hit.end, min(hit.confidence, 0.7), hit.detail)
    return hit


def compact_date(match: re.Match[str], today: dt.date) -> Hit | None:
    value = make_date(int(match["y"]), int(match["m"]), int(match["d"]))
    if value is None or abs((value - today).days) > RECENT_DAYS:
        return None  # eight digits far from now are more likely a number than a date
    return Hit("date", match.start(), match.end(), 0.6, value.isoformat())


def iso_week(match: re.Match[str], today: dt.date) -> Hit | None:
    """``2026-W49`` (a planning week, a report's period): a date when it is near now."""
    try:
        monday = dt.date.fromisocalendar(int(match["y"]), int(match["w"]), 1)
    except ValueError:
        return None  # week 53 of a 52-week year
    if abs((monday - today).days) > RECENT_DAYS:
        return None  # a week far from now is an example or a record, not today's
    return Hit("date", match.start(), match.end(), date_confidence(monday, today),
               f"ISO week starting {monday.isoformat()}")


def month_date(match: re.Match[str], t: str, today: dt.date,
               month_before: re.Pattern[str]) -> Hit | None:
    """``30 November 2026``, ``1er décembre``, ``30. November`` or, looking back from the
    day, ``November 30, 2026`` and ``Nov. 30th``."""
    g = match.groupdict()
    start, end = match.start(), match.end()
    month = MONTHS.get(g["mon"].lower()) if g["mon"] else None
    if g["mon"] and g["mon"].lower() == SPANISH_AUGUST and g["y2"] and t[match.end("mon")] == ".":
        month = 8  # "7 ago. 2026"; English "ago" never has a dot and a year right after it
    year = g["y2"] if month else g["y1"]
    if month is None:
        before = month_before.search(t, max(0, start - 14), start)
        month = MONTHS.get(before["mon"].lower()) if before else None
        if month is None:
            return None
        assert before is not None
        start = before.start()
        end = match.end("y1") if g["y1"] else match.end("day")
        if t[end - 1] == ".":
            end -= 1
    elif not year and t[end - 1] == "." and g["mon"].lower() not in MONTH_ABBREVIATIONS:
        end -= 1  # "7th of December.": the sentence's full stop, not an abbreviation's dot
    value = make_date(int(year) if year else today.year, month, int(g["d"]))
    if value is None and not year:
        value = make_date(2024, month, int(g["d"]))  # Feb 29 without a year is a real day
    if value is None:
        return None
    confidence = (yearless_confidence(value.month, value.day, today) if not year
                  else date_confidence(value, today))
    return Hit("date", start, end, confidence, value.isoformat())


def dash_month_date(match: re.Match[str], today: dt.date) -> Hit | None:
    """``7-Dec-2026``: day, month name, year joined by dashes or slashes."""
    month = MONTHS.get(match["mon"].lower())
    if month is None:
        return None
    return _date_hit(match, make_date(int(match["y"]), month, int(match["d"])), today)


def cjk_date(match: re.Match[str], t: str, today: dt.date,
             era_before: re.Pattern[str]) -> Hit | None:
    """``2026年11月30日``, ``11月30号``, ``令和8年11月30日``, ``令和元年5月1日``."""
    g = match.groupdict()
    start = match.start()
    era = era_before.search(t, max(0, start - 5), start)
    if era and (bool(era["first"]) == (g["y"] is None)):
        era_year = 1 if era["first"] else int(g["y"])
        value = make_date(ERAS[era["era"]] + era_year, int(g["m"]), int(g["d"]))
        if value is None:
            return None
        return Hit("date", era.start(), match.end(), date_confidence(value, today),
                   f"{era['era']}{era_year}年 = {value.isoformat()}")
    if g["y"]:
        return _date_hit(match, make_date(_year(g["y"], today), int(g["m"]), int(g["d"])), today)
    value = make_date(today.year, int(g["m"]), int(g["d"])) or make_date(2024, int(g["m"]),
                                                                         int(g["d"]))
    return _date_hit(match, value, today, yearless=True)


def cjk_number(text: str) -> int | None:
    """一 .. 九十九 (and 〇-style digit strings: 二〇二六)."""
    values = [CJK_NUMERALS.get(c) for c in text]
    if any(v is None for v in values):
        return None
    digits = [v for v in values if v is not None]
    if "十" not in text:
        return int("".join(str(v) for v in digits))
    tens, _, ones = text.partition("十")
    tens_value = CJK_NUMERALS[tens] if tens else 1
    ones_value = CJK_NUMERALS[ones] if ones else 0
    return tens_value * 10 + ones_value


def cjk_numeral_date(match: re.Match[str], today: dt.date) -> Hit | None:
    year, month, day = (cjk_number(match["y"]), cjk_number(match["m"]), cjk_number(match["d"]))
    if year is None or month is None or day is None:
        return None
    return _date_hit(match, make_date(year, month, day), today)


def clock(match: re.Match[str]) -> Hit | None:
    """``15:25``, ``3:25 PM``, ``15:25:07.123+08:00``: a real time of day."""
    hour, minute = int(match["h"]), int(match["mi"])
    ampm = match["ap"]
    if ampm:
        if not 1 <= hour <= 12:
            return None
    elif hour > 24 or (hour == 24 and minute):
        return None
    end = match.end()
    tz = match["tz"]
    if tz and not match["s"] and tz.strip()[:1] in "+-":
        # "9:00-17:00" is a range, not a time at UTC-17: offsets only count after seconds.
        end = match.start("tz")
    detail = "seconds" if match["s"] else ("round" if minute % 15 == 0 else "")
    return Hit("time", match.start(), end, 0.9 if match["s"] else 0.6, detail)


def french_clock(match: re.Match[str]) -> Hit | None:
    """``14h32``, ``9h05``: a real time of day."""
    hour, minute = int(match["h"]), int(match["mi"])
    if hour > 23:
        return None
    return Hit("time", match.start(), match.end(), 0.6, "round" if minute % 15 == 0 else "")


def relative_time(match: re.Match[str]) -> Hit:
    """``12 minutes ago``, ``3小时前``, ``5分前``: it moves with the clock."""
    return Hit("relative_time", match.start(), match.end(), 0.9)


def cjk_time(match: re.Match[str], t: str, ampm_before: re.Pattern[str]) -> Hit | None:
    hour = int(match["h"])
    minute = int(match["mi"]) if match["mi"] else (30 if match["half"] else 0)
    if hour > 24 or minute > 59 or (match["s"] and int(match["s"]) > 60):
        return None
    start = match.start()
    before = ampm_before.search(t, max(0, start - 3), start)
    if before:
        if hour > 12:
            return None
        start = before.start()
    end = match.end()
    while end > start and t[end - 1].isspace():
        end -= 1
    detail = "seconds" if match["s"] else ("round" if minute % 15 == 0 else "")
    return Hit("time", start, end, 0.9 if match["s"] else 0.6, detail)


def weekday(match: re.Match[str]) -> Hit | None:
    g = match.groupdict()
    if g["en"]:
        name = g["en"].lower()
        if g["plural"] and name in LONG_WEEKDAYS:
            return None  # "on Mondays": a schedule, not a day
        if name not in WEEKDAYS:
            return None
        detail = "long" if name in LONG_WEEKDAYS else "short"
        start = match.start()
        end = match.end()
        if g["plural"]:
            end = match.start("plural")
        elif g["dot"] and name in LONG_WEEKDAYS:
            end = match.start("dot")  # a full stop, not an abbreviation's dot
        return Hit("weekday", start, end, 0.6, detail)
    if g["zhd"]:
        return Hit("weekday", match.start(), match.end(), 0.6,
                   f"long:{CJK_WEEKDAYS[g['zhd']]}")
    if g["ja"]:
        return Hit("weekday", match.start(), match.end(), 0.6, f"long:{JA_WEEKDAYS[g['ja']]}")
    return Hit("weekday", match.start(), match.end(), 0.6, "paren")



def epoch(match: re.Match[str], now: float) -> Hit | None:
    seconds = int(match["sec"])
    if match["ms"]:
        seconds = int(match["sec"] + match["ms"]) // 1000
    if not now - EPOCH_PAST_DAYS * 86400 <= seconds <= now + EPOCH_FUTURE_DAYS * 86400:
        return None
    when = dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat()
    unit = "milliseconds" if match["ms"] else "seconds"
    return Hit("epoch", match.start(), match.end(), 0.9, f"Unix {unit}: {when}")
