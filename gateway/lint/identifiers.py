"""Validate identifier-like matches: UUID, ULID, JWT, ids, emails, IPs, phones, nonces.

A shape is not enough: a UUID must carry a version and variant, a ULID and a
UUIDv7 a time near now, a JWT a JSON header, an IP real octets, a nonce must
look random (short alternating runs of letters and digits rather than words).
Shared, stable look-alikes are left alone: role mailboxes (``support@``),
documentation addresses (``example.com``, ``192.0.2.x``), toll-free numbers,
commit hashes and checksums.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import ipaddress
import json
import re

from gateway.lint.model import Hit
from gateway.lint.patterns import STANDARD_PREFIXES

ROLE_MAILBOXES = frozenset(
    ["support", "help", "info", "sales", "contact", "noreply", "no-reply", "donotreply", "admin", "billing", "security", "privacy", "team", "hello", "feedback", "press", "careers", "jobs", "legal", "abuse", "postmaster", "webmaster", "service", "customerservice", "care", "office", "enquiries", "inquiries", "accounts", "orders", "returns"])
ROLE_WORDS = frozenset(
    ["team", "ops", "devops", "marketing", "partners", "compliance", "dpo",
     "client", "clients", "customer", "customers", "kundenservice", "kundendienst", "kontakt",
     "datenschutz", "service", "support", "soporte", "ventas", "atencion", "contacto", "ventes",
     "relation", "relations", "assistance", "helpdesk", "servicedesk", "reservations", "booking",
     "bookings", "notifications", "alerts", "newsletter", "kefu"])
"""Words that make a mailbox a shared one when its name is made of them and others
(``relation.client@``, ``ops-team@``, ``service-client@``): no person's name is."""
EXAMPLE_DOMAINS = ("example.com", "example.org", "example.net", "example.edu")
EXAMPLE_SUFFIXES = (".example", ".test", ".invalid", ".localhost", ".local")
TOLL_FREE_NANP = frozenset({"800", "888", "877", "866", "855", "844", "833"})
TOLL_FREE_PREFIXES = ("400", "800", "0120", "0800", "0570", "+1800", "+1888", "+1877", "+1866",
                      "+1855", "+1844", "+1833", "+86400", "+86800", "+81120", "+81800")
DOC_NETWORKS = ("192.0.2.", "198.51.100.", "203.0.113.")
FIXED_ADDRESSES = frozenset({"169.254.169.254", "169.254.170.2", "168.63.129.16",
                             "100.100.100.200"})
"""Cloud metadata and platform endpoints: the same address in every request."""
PRIVATE_CONFIDENCE = 0.45
"""A private or link-local address (``10.0.0.2``) names a host of the app's own network, the
same for every user, more often than a client: below the warning level."""
EXAMPLE_UUIDS = frozenset({"123e4567-e89b-12d3-a456-426614174000",
                           "550e8400-e29b-41d4-a716-446655440000"})
"""The UUIDs that documentation uses as examples (RFC 4122's, Wikipedia's)."""
HEX_LITERAL = re.compile(r"0[xX][0-9A-Fa-f]{1,16}(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU])")
"""A code constant such as ``0x9E3779B97F4A7C15ULL``: a machine word, with C's suffixes."""
SESSION_PREFIXES = frozenset({"sess", "session", "conv", "thread"})
SECRET_PREFIXES = frozenset({"sk", "pk", "key"})
RECORD_PREFIXES = frozenset({"ord", "order", "inv", "acct", "cus", "sub", "txn"})
"""Prefixes of a business record's number (``INV-000731``): a ``record_id``, unless the body
is random (then the id was minted per request)."""
SHARED_NETWORK = ipaddress.IPv4Network("100.64.0.0/10")
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
ULID_WINDOW_DAYS = 5 * 365
RANDOM_MEAN_SEGMENT = 2.8
"""Mean length of letter/digit segments at or under which a string looks random."""


class Identifiers:
    def __init__(self) -> None:
        self._segments = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
        self._separators = re.compile(r"[-_./+=]+")

    # -- randomness ---------------------------------------------------------------------

    def looks_random(self, text: str, min_length: int = 16) -> bool:
        """Short alternating runs of case and digits, unlike words and identifiers."""
        parts = [p for p in self._separators.split(text) if p]
        if not parts:
            return False
        longest = max(parts, key=len)
        if len(longest) < min(min_length, 12):
            return False
        digits = sum(c.isdigit() for c in longest)
        letters = sum(c.isalpha() for c in longest)
        if digits < 2 or letters < 2:
            return False
        segments = self._segments.findall(longest)
        return bool(segments) and len(longest) / len(segments) <= RANDOM_MEAN_SEGMENT

    # -- families -----------------------------------------------------------------------

    def uuid(self, match: re.Match[str], now: float) -> Hit | None:
        text = match.group(0).lower()
        if set(text) <= {"0", "-"} or set(text) <= {"f", "-"} or text in EXAMPLE_UUIDS:
            return None  # nil and max UUIDs, and documentation's examples, are constants
        version, variant = text[14], text[19]
        if variant not in "89ab" or version not in "12345678":
            return Hit("uuid", match.start(), match.end(), 0.7, "UUID-shaped id")
        detail = f"UUIDv{version}"
        confidence = 0.9
        minted = None
        if version == "7":
            minted = int(text[:8] + text[9:13], 16) / 1000
        elif version == "1":
            ticks = (int(text[15:18], 16) << 48) | (int(text[9:13], 16) << 32) | int(text[:8], 16)
            minted = ticks / 1e7 - 12219292800
        if minted is not None:
            if abs(minted - now) <= ULID_WINDOW_DAYS * 86400:
                confidence = 0.97
            detail += f" minted {_iso(minted)}"
        return Hit("uuid", match.start(), match.end(), confidence, detail)

    def ulid(self, match: re.Match[str], now: float) -> Hit | None:
        text = match.group(0)
        if not any(c.isalpha() for c in text):
            return None
        millis = 0
        for char in text[:10]:
            millis = millis * 32 + CROCKFORD.index(char)
        minted = millis / 1000
        if abs(minted - now) > ULID_WINDOW_DAYS * 86400:
            return None
        return Hit("ulid", match.start(), match.end(), 0.95, f"ULID minted {_iso(minted)}")

    def hex_id(self, match: re.Match[str], before: str, fingerprint: re.Pattern[str]) -> Hit | None:
        text = match.group(0)
        if fingerprint.search(before):
            return None  # commit hashes and checksums are fixed text
        digits = sum(c.isdigit() for c in text)
        if digits < 2 or len(text) - digits < 2:
            return None
        return Hit("request_id", match.start(), match.end(), 0.75, f"{len(text)} hex digits")

    def prefixed_id(self, prefix: str, body: str) -> Hit | None:
        """``req_8f3a91c2``, ``sess_Zx81kLm0``, ``chatcmpl-9f8e7d6c``: the kind and the evidence.

        The caller places the span (prefix start to body end)."""
        prefix = prefix.lower()
        compact = body.replace("-", "").replace("_", "")
        hexish = all(c in HEX_DIGITS for c in compact)
        digits = sum(c.isdigit() for c in compact)
        if not (self.looks_random(body, 8) or (body.isdigit() and len(body) >= 6)
                or (hexish and digits >= 2 and len(compact) - digits >= 2 and len(compact) >= 8)):
            return None
        if prefix in SECRET_PREFIXES:
            return Hit("nonce", 0, 0, 0.85, "secret-looking key")
        if prefix in RECORD_PREFIXES and not self.looks_random(body, 8):
            return Hit("record_id", 0, 0, 0.9, f"{prefix} number")
        kind = "session_id" if prefix in SESSION_PREFIXES else "request_id"
        return Hit(kind, 0, 0, 0.9, f"{prefix} id")

    def record_id(self, match: re.Match[str], cued: bool) -> Hit | None:
        """An order, account or ticket number: ``ORD-2024-88812``, ``A7F3K9``, ``#48213``,
        or any value with a digit after a cue word ("order", "账号", "会員番号")."""
        text = match["id"]
        start, end = match.span("id")
        digits = sum(c.isdigit() for c in text)
        letters = sum(c.isalpha() for c in text)
        if text.startswith("#"):
            if len(text) >= 5 or cued:
                return Hit("record_id", start, end, 0.9 if cued else 0.7, "number after #")
            return None
        if cued and digits and len(text) >= 4:
            return Hit("record_id", start, end, 0.85, "after an id cue")
        groups = [g for g in re.split(r"[-_/]", text) if g]
        if (len(groups) >= 2 and groups[0].isalpha() and groups[0].upper() not in STANDARD_PREFIXES
                and all(any(c.isdigit() for c in g) for g in groups[1:]) and digits >= 5):
            return Hit("record_id", start, end, 0.8, f"{groups[0]}- id")
        if (text.isalnum() and text.upper() == text and 5 <= len(text) <= 24
                and digits >= 2 and letters >= 2 and len(self._segments.findall(text)) >= 4):
            return Hit("record_id", start, end, 0.7, "letter-digit code")
        return None

    def jwt(self, match: re.Match[str]) -> Hit | None:
        head, payload, _ = match.group(0).split(".", 2)
        header = _b64json(head)
        if not isinstance(header, dict) or "alg" not in header:
            return None
        claims = _b64json(payload)
        detail = f"JWT alg={header['alg']}"
        if isinstance(claims, dict) and isinstance(claims.get("exp"), (int, float)):
            detail += f", expires {_iso(float(claims['exp']))}"
        return Hit("jwt", match.start(), match.end(), 0.97, detail)

    def email(self, match: re.Match[str]) -> Hit | None:
        local, domain = match["local"].lower(), match["domain"].lower()
        if local in ROLE_MAILBOXES or local.split("+")[0] in ROLE_MAILBOXES:
            return None  # a shared mailbox is the same in every request
        if not ROLE_WORDS.isdisjoint(re.split(r"[._+-]", local.split("+")[0])):
            return None  # relation.client@, ops-team@: a shared mailbox too
        if domain in EXAMPLE_DOMAINS or domain.endswith(EXAMPLE_SUFFIXES):
            return None
        if self.looks_random(local, 12) or self._uuid_like(local):
            return None  # a Message-ID or bounce address: the id inside is the finding
        return Hit("email", match.start(), match.end(), 0.8)

    @staticmethod
    def _uuid_like(text: str) -> bool:
        return len(text) == 36 and text.count("-") == 4 and all(
            c in HEX_DIGITS or c == "-" for c in text)

    def ipv4(self, match: re.Match[str], before: str, version: re.Pattern[str]) -> Hit | None:
        text = match.group(0)
        octets = [int(p) for p in text.split(".")]
        if any(o > 255 for o in octets) or version.search(before):
            return None
        if text.startswith(DOC_NETWORKS) or octets[0] in (0, 127, 255) or text in FIXED_ADDRESSES:
            return None
        address = ipaddress.IPv4Address(text)
        if address.is_private or address.is_link_local or address in SHARED_NETWORK:
            return Hit("ip", match.start(), match.end(), PRIVATE_CONFIDENCE,
                       "IPv4, private network")
        return Hit("ip", match.start(), match.end(), 0.8, "IPv4")

    def ipv6(self, match: re.Match[str]) -> Hit | None:
        text = match.group(0)
        try:
            address = ipaddress.IPv6Address(text)
        except ValueError:
            return None
        if address.is_loopback or address.is_unspecified:
            return None
        if address in ipaddress.IPv6Network("2001:db8::/32"):
            return None  # documentation prefix
        return Hit("ip", match.start(), match.end(), 0.8, "IPv6")

    def phone(self, match: re.Match[str]) -> Hit | None:
        text = match.group(0)
        digits = "".join(c for c in text if c.isdigit())
        compact = ("+" if text.startswith("+") else "") + digits
        if match["intl"] and not 8 <= len(digits) <= 15:
            return None
        if match["nanp"]:
            area = digits[1:4] if len(digits) == 11 else digits[:3]
            if len(digits) == 11 and digits[0] != "1":
                return None
            if area in TOLL_FREE_NANP:
                return None
        if compact.startswith(TOLL_FREE_PREFIXES) or digits.startswith(TOLL_FREE_PREFIXES):
            return None
        if match["jp"] and not 10 <= len(digits) <= 11:
            return None
        return Hit("phone", match.start(), match.end(), 0.8)

    def cued_nonce(self, match: re.Match[str]) -> Hit | None:
        """A value of 8-15 characters right after a token's or a secret's name
        (``Session token: k8Jd9sLq2Xz7``): random-looking, hex included."""
        value = match["value"].rstrip("=")
        if not self.looks_random(value, 8):
            return None
        start = match.start("value")
        cue = match.group(0)[:start - match.start()].rstrip(" :=\"'").lower()
        if cue.endswith("id"):
            kind = "session_id" if cue.startswith("session") else "request_id"
        else:
            kind = "nonce"
        return Hit(kind, start, start + len(value), 0.85, "random-looking value after its name")

    def nonce(self, match: re.Match[str]) -> Hit | None:
        text = match.group(0).rstrip("=")
        if all(c in HEX_DIGITS for c in text):
            return None  # hex strings are the hex-id family's (and checksums are fixed text)
        if HEX_LITERAL.fullmatch(text):
            return None  # a constant in a code snippet
        if not self.looks_random(text):
            return None
        return Hit("nonce", match.start(), match.end(), 0.8, "random-looking string")


def _iso(seconds: float) -> str:
    try:
        return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return "?"


def _b64json(part: str) -> object:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        return json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
