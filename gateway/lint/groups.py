"""What the gateway learns about one app's live traffic: a group.

A group is one model + one tenant (a hash of the API key, or ``user``) + one
template shape (leading system messages, set of tool names) + one template:
its stable prefix text is the system messages and tool strings, joined, and
a request joins the group whose text it mostly repeats (common head and tail
at least ``SAME_TEMPLATE`` of the longer text). One key serving several
agents with different system prompts of the same shape thus makes several
groups, not one whose every request looks like a template change (found in
a benchmark: 8 interleaved 2k-token system prompts under one key made the
linter report false drifts and mark the whole prompt varying, at 0.6 ms a
request). A template with a dynamic span (a date, a name, a counter, even a
timestamp at the very start) still shares most of its text and stays one
group. Each group keeps, memory-bounded:

* a ``Variance`` (which spans of that text vary: names, tiers, counters),
  reset when the prefix drifts so it learns the new template;
* a ``DriftTracker``;
* the last few prefix texts (to show examples of varying spans), the last
  cache salts and the first tool order seen.

``GroupTable`` holds at most ``max_groups`` groups, and at most
``MAX_TEMPLATES`` per model, tenant and shape, forgetting the least
recently seen. Each group has its own lock: the gateway's event loop never
waits for a worker thread aligning a long prefix, it skips learning from
that one request instead.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import xxhash

from gateway.lint.drift import Drift, DriftSettings, DriftTracker
from gateway.lint.structure import TextField
from gateway.lint.textdiff import common_prefix, common_suffix
from gateway.lint.variance import Alignment, Atomizer, Variance
from policies.lru import LRU

SEPARATOR = "\x1e"
RECENT_TEXTS = 4
LIVE_MAX_ATOMS = 256
"""On live traffic, a differing middle longer than this many atoms is not aligned:
the alignment is quadratic, and two unrelated prompts that share a group (two
apps with the same message shape) would otherwise cost the gateway most of its
CPU (measured: 75% of it at 25 req/s with 32 apps of 1k-token system prompts).
Real dynamic spans (a date, a name, a counter) leave a short middle once the
common head and tail are trimmed."""
RECENT_SALTS = 8
SAME_TEMPLATE = 0.5
"""A text belongs to a group when its common head and tail with the group's
reference cover at least this share of the longer of the two."""
MAX_TEMPLATES = 64
"""Templates kept per model, tenant and shape: a platform that sends many apps' system
prompts under one key (16 made a key with more never learn: each template was forgotten
before it came back). A prompt that is like none of them is told apart from each by
comparing its first and last ``_EDGE`` characters, in C."""
_EDGE = 64


@dataclass(frozen=True, slots=True)
class Prefix:
    """A request's stable prefix text and where each field sits in it."""

    text: str
    segments: tuple[tuple[int, TextField], ...]
    digest: int
    """xxh3 of ``text``: computed once, used to find the group and to skip re-aligning."""

    @staticmethod
    def of(fields: list[TextField], max_chars: int) -> Prefix:
        parts: list[str] = []
        segments: list[tuple[int, TextField]] = []
        offset = 0
        for field in fields:
            if field.region not in ("system", "tools"):
                continue
            segments.append((offset, field))
            parts.append(field.text)
            offset += len(field.text) + len(SEPARATOR)
        text = SEPARATOR.join(parts)[:max_chars]
        return Prefix(text, tuple(segments),
                      xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass")))

    def offset_of(self, path: str) -> int | None:
        return next((offset for offset, field in self.segments if field.path == path), None)

    def path_at(self, offset: int) -> str:
        path = "messages"
        for start, field in self.segments:
            if start > offset:
                break
            path = field.path
        return path


@dataclass(slots=True)
class Observation:
    alignment: Alignment | None
    drift: Drift | None
    stable_known: bool
    """Enough requests seen to call a span stable."""
    salt_unique: bool
    order_changed: bool


def same_template(reference: str, text: str) -> bool:
    longest = max(len(reference), len(text))
    if not longest:
        return True
    if longest >= 4 * _EDGE and reference[:_EDGE] != text[:_EDGE] \
            and reference[-_EDGE:] != text[-_EDGE:]:
        return False  # head and tail each under _EDGE: together under half of the longer
    head = common_prefix(reference, text)
    return head + common_suffix(reference, text, head) >= SAME_TEMPLATE * longest


class Group:
    def __init__(self, group_id: str, model: str, shape: str, atomizer: Atomizer,
                 drift: DriftSettings, max_chars: int, reference: str = "") -> None:
        self.id = group_id
        self.reference = reference[:max_chars]
        """The text the group's template is recognised by (its latest regime's first)."""
        self.model = model
        self.shape = shape
        self.atomizer = atomizer
        self.max_chars = max_chars
        self.lock = threading.Lock()
        self.seen = 0
        self.learned = 0
        """Requests since the variance was (re)started."""
        self.variance: Variance | None = None
        self.last_hash: int | None = None
        self.last_alignment: Alignment | None = None
        self.tracker = DriftTracker(drift)
        self.recent: deque[str] = deque(maxlen=RECENT_TEXTS)
        self.salts: deque[str] = deque(maxlen=RECENT_SALTS)
        self.tool_order: tuple[str, ...] | None = None

    def observe(self, prefix: Prefix, salt: str | None, order: tuple[str, ...],
                min_seen: int) -> Observation:
        text, digest = prefix.text, prefix.digest
        if self.variance is None:
            self.variance = Variance(self.atomizer, text, self.max_chars, LIVE_MAX_ATOMS)
            alignment = self.variance.align(text)
        elif digest == self.last_hash and self.last_alignment is not None:
            alignment = self.last_alignment
        else:
            alignment = self.variance.observe(text)
        drift = self.tracker.observe(text)
        self.learned += 1
        if drift is not None:  # learn the new template from here on
            self.reference = text[:self.max_chars]
            self.variance = Variance(self.atomizer, text, self.max_chars, LIVE_MAX_ATOMS)
            alignment = self.variance.align(text)
            self.learned = 1
        if digest != self.last_hash:
            self.recent.append(text)
        self.last_hash, self.last_alignment = digest, alignment
        self.seen += 1
        salt_unique = False
        if salt is not None:
            self.salts.append(salt)
            salt_unique = len(self.salts) >= 4 and len(set(self.salts)) == len(self.salts)
        if self.tool_order is None:
            self.tool_order = order
        order_changed = order != self.tool_order
        return Observation(alignment, drift, self.learned >= min_seen, salt_unique, order_changed)

    def varying(self) -> list[dict[str, object]]:
        """The spans learned to vary, with examples from the last prefixes seen."""
        variance = self.variance
        if variance is None:
            return []
        alignments = [variance.align(text) for text in self.recent]
        out = []
        for slot in variance.slots():
            values = list(dict.fromkeys(a.text[s:e] for a in alignments
                                        for s, e in [variance.value(a, slot)]))
            out.append({"offset": slot[0], "text": variance.reference[slot[0]:slot[1]],
                        "examples": values[:5]})
        return out


class GroupTable:
    def __init__(self, atomizer: Atomizer, drift: DriftSettings, max_groups: int,
                 max_chars: int) -> None:
        self.atomizer = atomizer
        self.drift = drift
        self.max_groups = max_groups
        self.max_chars = max_chars
        self._groups: LRU[tuple[str, str, str, int], Group] = LRU(max_groups)
        self._templates: dict[tuple[str, str, str], list[int]] = {}
        """Per model, tenant and shape: its groups' serials, most recently seen first."""
        self._serial = 0
        self._lock = threading.Lock()
        self._last_to: LRU[tuple[str, str, str, int], int] = LRU(max_groups * 4)
        """The group each prefix text (by digest) last went to: the scan below in one
        lookup when that group's last request is still that text (under 1 us, where the
        scan over a key's 64 templates took ~25)."""

    def get(self, model: str, tenant: str, shape: str, prefix: Prefix) -> Group:
        """The group of ``prefix``'s template; a new one when no group's text is like it."""
        base = (model, tenant, shape)
        text, digest = prefix.text, prefix.digest
        with self._lock:
            serials = self._templates.setdefault(base, [])
            # The same text as a group's last request (the common case), else the
            # most recently seen group whose template it mostly repeats. The group this
            # text last went to, if its last request is still this text, is the one the
            # scan would find: any other group whose last request is this text got it
            # earlier and nothing since, so was seen less recently.
            found = self._last_went_to(base, digest, serials)
            if found is None:
                found = next((i for i, serial in enumerate(serials)
                              if self._group(base, serial).last_hash == digest), None)
            if found is None:
                found = next((i for i, serial in enumerate(serials)
                              if same_template(self._group(base, serial).reference, text)),
                             None)
            if found is not None:
                serial = serials.pop(found)
                serials.insert(0, serial)
                self._last_to.put((*base, digest), serial)
                return self._group(base, serial, touch=True)
            self._serial += 1
            key = (*base, self._serial)
            group_id = xxhash.xxh3_64_hexdigest(
                "\x00".join((*base, str(self._serial))).encode())[:12]
            group = Group(group_id, model, shape, self.atomizer, self.drift, self.max_chars,
                          text)
            serials.insert(0, self._serial)
            self._last_to.put((*base, digest), self._serial)
            if len(serials) > MAX_TEMPLATES:
                self._groups.pop((*base, serials.pop()))
            for old, _ in self._groups.put(key, group):
                rest = self._templates[old[:3]]
                rest.remove(old[3])
                if not rest:
                    del self._templates[old[:3]]
            return group

    def _last_went_to(self, base: tuple[str, str, str], digest: int,
                      serials: list[int]) -> int | None:
        """The index in ``serials`` of the group ``digest``'s text last went to, when that
        group is still held and its last request is still that text."""
        serial = self._last_to.peek((*base, digest))
        if serial is None:
            return None
        group = self._groups.peek((*base, serial))
        if group is None or group.last_hash != digest:
            return None
        return serials.index(serial)  # a group held is one of its key's serials

    def _group(self, base: tuple[str, str, str], serial: int, touch: bool = False) -> Group:
        key = (*base, serial)
        group = self._groups.get(key) if touch else self._groups.peek(key)
        assert group is not None  # serials name only groups still held
        return group

    def snapshot(self) -> list[Group]:
        with self._lock:
            return [group for _, group in reversed(list(self._groups.items()))]
