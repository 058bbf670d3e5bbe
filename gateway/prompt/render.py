"""Render a request as the engine will see it, and hash its KV blocks.

``PromptHasher`` turns a request body into a :class:`RouteRequest`: the
prompt's token count and the chained hashes of its full KV blocks (see
``policies.hashing``). Chat requests are rendered with the model's own chat
template (``engine.tokenizer``), exactly as vLLM renders them.

Memoization, so a warm prefix costs almost nothing:

* Hugging Face tokenizers split text on added tokens (``<|im_start|>``,
  ``<|im_end|>`` ...) *before* anything else, so the pieces between them are
  tokenized independently. The rendered prompt is cut at those tokens and
  each piece's ids are memoized (LRU): only text never seen before is
  tokenized. At load time this property is checked on a sample; a tokenizer
  that breaks it falls back to memoizing whole prompts.
* The block chain is memoized per piece too: the state before a piece (parent
  hash + the tokens of the unfinished block) and the piece give the hashes it
  completes and the state after it. A request that repeats a conversation and
  adds a turn re-hashes only the new turn.

* A piece never seen whole that shares leading text with a known one (a
  message that grows, a document with a new question) reuses that piece's
  tokens up to a verified clean cut and tokenizes only the rest
  (``gateway.prompt.piece_reuse``).

* Rendering: a follow-up in a conversation the gateway has seen is rendered
  from the last known user turn on (``gateway.prompt.conversations``), so its cost
  grows with the new messages, not with the whole chat.

When the text still to tokenize is long, ``plan``/``finish`` let the caller
run the tokenizing in a worker thread so the event loop never stalls. The
result is the prompt's blocks exactly as a full render and tokenize gives
them, up to the routing bounds (``gateway.prompt.bounds``: at most
``max_routed_messages`` messages, ``max_routed_chars`` characters of content
and ``max_routed_tokens`` tokens are analysed; the rest is forwarded, not
analysed). A request's own ``chat_template`` is never rendered: the model's
template stands in for it. Every memo is bounded in entries (tokens, blocks)
and in estimated bytes (``LimitSettings``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.tokenizer import Renderer, RenderError, UnencodableText
from gateway.config import LimitSettings
from gateway.prompt.bounds import (
    ENTRY_BYTES,
    RENDER_FAILURES,
    ModelTemplate,
    Unanalysed,
    hashes_bytes,
    ids_bytes,
    routable_chat,
    routable_ids,
    text_bytes,
)
from gateway.prompt.conversations import ConversationMemo, Keys, KnownTurn
from gateway.prompt.in_flight import InFlight
from gateway.prompt.piece_reuse import Mark, Offsets, PieceKey, PieceReuse, Shifted
from policies.hashing import chain_seed, extend
from policies.lru import LRU
from policies.types import RouteRequest

log = logging.getLogger("prefixgate.prefix")

ChainState = tuple[int, tuple[int, ...]]
"""Where a block chain stands: the last full block's hash and the tokens of the
block not yet full. A plain tuple of ints, not a class: the garbage collector
stops tracking such tuples, so the chain memo (up to a million entries) adds
nothing to a full collection's walk, where instances would make it take
seconds."""


@dataclass(slots=True)
class RenderPlan:
    """A rendered prompt cut into pieces, with the pieces still to tokenize."""

    model: str
    seed: int
    block_size: int
    pieces: list[str]
    token_ids: list[tuple[int, ...] | None]
    missing: list[int]
    missing_chars: int
    add_special_tokens: bool = False
    """Completions prompts get the tokenizer's special tokens (BOS), chats do not."""
    direct_ids: tuple[int, ...] | None = None
    """A completions prompt given as token ids needs no tokenizing."""
    base: KnownTurn | None = None
    """The known conversation turn the pieces continue (incremental rendering)."""
    store_key: int | None = None
    store_offset: int | None = None
    """Remember the chain at this offset into the pieces' text under ``store_key``."""
    audit: Mapping[str, Any] | None = None
    """The request body, when this incremental result is to be checked."""
    units: int = 1
    """Token-id units per real token (the byte renderer's bytes); ``block_size``
    above is in units, the request reports tokens."""
    learned: list[tuple[PieceKey, Offsets]] = field(default_factory=list)
    """Long pieces tokenized for this request, to mark for reuse (``PieceReuse``)."""
    reused: list[tuple[PieceKey, tuple[int, ...]]] = field(default_factory=list)
    """Pieces tokenized from a known piece's tokens, for the sampled audit."""
    marks: dict[int, Mark] = field(default_factory=dict)
    """Per missing piece, the known piece it extends (``PieceReuse.find``)."""
    max_units: int = 1 << 62
    """Token-id units hashed at most (``max_routed_tokens``); the rest is not analysed."""
    cut: bool = False
    """Routing analyses only the leading part of this prompt (the routing bounds)."""
    keep_tokens: int | None = None
    """The request's ``truncate_prompt_tokens``: vLLM keeps only this many of the prompt's
    tokens, its last ones (a generation prompt's default), or its first with
    ``truncation_side: "right"``."""
    keep_first: bool = False
    """``truncation_side: "right"``: the kept tokens are the prompt's first."""


OFFLOAD_CHARS = 8192
"""Text still to tokenize above which the work goes to a worker thread."""

UNBOUNDED = LimitSettings(max_routed_tokens=1 << 40, max_routed_chars=1 << 40,
                          max_routed_messages=1 << 40)
"""No routing bounds: ``token_ids`` gives the whole prompt (the linter has its own)."""

REUSE_AUDIT_EVERY = 32
"""One piece tokenized from a known piece in this many is checked against a full
tokenization, off the request's path."""


class PromptHasher:
    def __init__(self, renderer: Renderer, limits: LimitSettings | None = None,
                 reuse_step: int = 256, reuse_min_chars: int = 1024) -> None:
        self.renderer: Renderer = ModelTemplate(renderer)
        self.limits = limits = limits if limits is not None else LimitSettings()
        # Keyed by the chain seed too (model and cache_salt): tenants salted apart share
        # no memo, so how fast a prompt is hashed says nothing of another's prompts.
        self._pieces: LRU[tuple[int, bool, str], tuple[int, ...]] = LRU(
            limits.piece_memo_tokens, limits.piece_memo_bytes)
        self._chain: LRU[tuple[ChainState, str], tuple[tuple[int, ...], ChainState]] = LRU(
            limits.chain_memo_blocks, limits.chain_memo_bytes)
        self._split = self._splitter()
        self.conversations: ConversationMemo | None = None
        if self._split is not None:
            self.conversations = ConversationMemo(
                renderer.render_chat, self._split,
                LRU(limits.turn_memo_blocks, limits.turn_memo_bytes),
                memo_entries=limits.template_memo_entries, memo_bytes=limits.template_memo_bytes)
        self._audits: deque[tuple[str, Mapping[str, Any], int, RouteRequest]] = deque(maxlen=16)
        self.reuse: PieceReuse | None = None
        self._special_prefix: tuple[int, ...] | None = None
        if renderer.encode_with_offsets("probe") is not None:
            self.reuse = PieceReuse(self._encode_plain, step=reuse_step,
                                    min_chars=reuse_min_chars, max_marks=limits.reuse_marks,
                                    max_bytes=limits.reuse_marks_bytes)
            self._special_prefix = self._prefix_specials()
        self._to_learn: deque[tuple[PieceKey, Offsets]] = deque(maxlen=64)
        self._reuse_audits: deque[tuple[PieceKey, tuple[int, ...]]] = deque(maxlen=16)
        self.reused_pieces = 0
        self.reuse_audit_failures = 0
        self.fallbacks: dict[str, int] = {}
        """Requests routing did not analyse as sent, by reason (``gateway.prompt.bounds``)."""
        self.truncated = 0
        """Requests of which routing analysed only the leading part."""
        self._tasks: set[asyncio.Future[int]] = set()
        self._tokenizing: InFlight[tuple[int, bool, str], tuple[int, ...]] = InFlight()
        """Long pieces being tokenized in a worker thread now, by piece memo key."""

    def memos(self) -> dict[str, LRU[Any, Any]]:
        """Every memo this hasher keeps, by name (for ``prefixgate_memo_*``)."""
        out: dict[str, LRU[Any, Any]] = {"pieces": self._pieces, "chain": self._chain}
        if self.conversations is not None:
            out["turns"] = self.conversations.turns
            out["anchors"] = self.conversations.anchors
            out["generation_prompts"] = self.conversations.generation
        if self.reuse is not None:
            out["reuse_marks"] = self.reuse.marks
        return out

    def fell_back(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    # -- set-up -------------------------------------------------------------------

    def _splitter(self) -> re.Pattern[str] | None:
        """A regex that cuts text at added tokens, if doing so is provably safe."""
        added: list[str] = getattr(self.renderer, "added_tokens", list)()
        if not added:
            return None
        pattern = re.compile("(" + "|".join(re.escape(t) for t in
                                            sorted(added, key=len, reverse=True)) + ")")
        sample = {"messages": [
            {"role": "system", "content": "You are a helpful assistant. 系统提示 "},
            {"role": "user", "content": "  Hello!\n\nHow are   you? 你好，世界"},
            {"role": "assistant", "content": "Fine.  "},
            {"role": "user", "content": "\ttabs\r\nand spaces "}]}
        try:
            text = self.renderer.render_chat(sample)
        except RenderError:
            return None
        whole = self.renderer.text_token_ids(text, add_special_tokens=False)
        pieced: list[int] = []
        for piece in pattern.split(text):
            if piece:
                pieced += self.renderer.text_token_ids(piece, add_special_tokens=False)
        if pieced != whole:
            log.warning("tokenizer %s does not split on added tokens; memoizing whole prompts",
                        self.renderer.name)
            return None
        return pattern

    # -- the two phases -------------------------------------------------------------

    def plan(self, model: str, body: Mapping[str, Any], kind: str, block_size: int,
             incremental: bool = True, limits: LimitSettings | None = None) -> RenderPlan | None:
        """Render and look pieces up; None when routing will not analyse the prompt
        (it cannot be rendered, or is not what routing reads: ``gateway.prompt.bounds``).
        ``limits`` replaces the hasher's routing bounds for this call."""
        try:
            plan = self._plan(model, body, kind, block_size, incremental,
                              limits if limits is not None else self.limits)
            if plan is not None and limits is not None:
                plan.max_units = limits.max_routed_tokens * plan.units
            if plan is not None:
                plan.keep_tokens = keep_tokens(body)
                plan.keep_first = body.get("truncation_side") == "right"
            return plan
        except Unanalysed as exc:
            self.fell_back(exc.reason)
        except RENDER_FAILURES as exc:
            log.debug("cannot render for routing: %s", exc)
            self.fell_back("render")
        return None

    def _plan(self, model: str, body: Mapping[str, Any], kind: str, block_size: int,
              incremental: bool, limits: LimitSettings) -> RenderPlan | None:
        seed = _seed(model, body)
        units = self.renderer.units_per_token
        if kind != "chat":
            return self._plan_completion(model, seed, body, block_size, limits)
        # vLLM's roles first (a developer message may move to the front), then the cut
        body = self.renderer.as_vllm_reads(body)
        routable = routable_chat(body, limits.max_routed_chars, limits.max_routed_messages)
        if routable.client_template:
            self.fell_back("client_template")
        if routable.media:
            self.fell_back("media")
        body = routable.body
        plan: RenderPlan | None = None
        if body.get("add_special_tokens") is True:  # vLLM adds the tokenizer's BOS, say
            plan = self._plan_text(model, seed, block_size * units,
                                   self.renderer.render_chat(body), True)
        elif incremental and self.conversations is not None:
            keys = self.conversations.keys(model, body, block_size)
            if keys is not None:
                plan = self._plan_conversation(model, seed, body, block_size * units, keys)
        if plan is None:
            plan = self._plan_text(model, seed, block_size * units,
                                   self.renderer.render_chat(body), False)
        plan.cut = routable.cut
        return plan

    def _plan_completion(self, model: str, seed: int, body: Mapping[str, Any],
                         block_size: int, limits: LimitSettings) -> RenderPlan | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch: route by its first prompt
        max_chars = limits.max_routed_chars
        if isinstance(prompt, list):
            ids = routable_ids(prompt, limits.max_routed_tokens)
            return RenderPlan(model, seed, block_size, [], [], [], 0, direct_ids=ids,
                        cut=len(ids) < len(prompt))
        if not isinstance(prompt, str):
            raise Unanalysed("render")
        plan = self._plan_text(model, seed, block_size * self.renderer.units_per_token,
                               prompt[:max_chars], body.get("add_special_tokens") is not False)
        plan.cut = len(prompt) > max_chars
        return plan

    def _plan_conversation(self, model: str, seed: int, body: Mapping[str, Any],
                           block_size: int, keys: Keys) -> RenderPlan | None:
        memo = self.conversations
        assert memo is not None
        delta = memo.delta(body, keys)
        if delta is None:
            text = self.renderer.render_chat(body)
            offset = memo.store_offset(body, keys, text)
        else:
            text, offset = delta.text, delta.store_offset
        plan = self._plan_text(model, seed, block_size, text, False)
        if offset is not None:
            plan.store_key, plan.store_offset = keys.prefixes[-1], offset
        if delta is not None:
            plan.base = delta.turn
            if memo.should_audit():
                plan.audit = body
        return plan

    def _plan_text(self, model: str, seed: int, block_size: int, text: str,
                   add_special: bool) -> RenderPlan:
        if add_special or self._split is None:
            pieces = [text]
        else:
            pieces = [p for p in self._split.split(text) if p]
        ids: list[tuple[int, ...] | None] = []
        missing: list[int] = []
        missing_chars = 0
        marks: dict[int, Mark] = {}
        for index, piece in enumerate(pieces):
            cached = self._pieces.get((seed, add_special, piece))
            ids.append(cached)
            if cached is None:
                missing.append(index)
                # What is still to tokenize decides whether a thread is worth it
                # (a thread hop costs milliseconds when the loop is busy).
                mark = self.reuse.find((add_special, piece)) if self.reuse is not None else None
                if mark is not None:
                    marks[index] = mark
                missing_chars += len(piece) - (mark.cut_chars if mark is not None else 0)
        units = self.renderer.units_per_token
        return RenderPlan(model, seed, block_size, pieces, ids, missing, missing_chars,
                    add_special_tokens=add_special, units=units, marks=marks,
                    max_units=self.limits.max_routed_tokens * units)

    def tokenize_missing(self, plan: RenderPlan) -> list[tuple[int, ...]]:
        """The CPU-heavy part; only reads shared state, so it may run in a thread."""
        return self._tokenize_pieces(plan, plan.missing)

    def _tokenize_pieces(self, plan: RenderPlan, indexes: Sequence[int]) -> list[tuple[int, ...]]:
        return [self._tokenize_piece(plan, (plan.add_special_tokens, plan.pieces[index]),
                                     plan.marks.get(index))
                for index in indexes]

    def _tokenize_piece(self, plan: RenderPlan, key: PieceKey,
                        mark: Mark | None) -> tuple[int, ...]:
        add_special, text = key
        reuse = self.reuse
        if reuse is None or len(text) < reuse.min_chars or (
                add_special and self._special_prefix is None):
            return tuple(self.renderer.text_token_ids(text, add_special_tokens=add_special))
        found = (reuse.tokenize(key, lambda known: self._pieces.peek((plan.seed, *known)), mark)
                 if mark is not None else None)
        if found is not None:
            plan.learned.append((key, found.offsets))
            plan.reused.append((key, found.ids))
            return found.ids
        ids, encoding = self._encode_plain(text)
        prefix = self._special_prefix or () if add_special else ()
        plan.learned.append((key, Shifted(encoding, 0, len(prefix))))
        return prefix + tuple(ids)

    def _encode_plain(self, text: str) -> tuple[list[int], Offsets]:
        encoded = self.renderer.encode_with_offsets(text)
        assert encoded is not None  # only called when the renderer gives offsets
        return encoded

    def _prefix_specials(self) -> tuple[int, ...] | None:
        """What ``add_special_tokens`` puts before a text, if that is all it adds."""
        prefix = tuple(self.renderer.text_token_ids("", add_special_tokens=True))
        sample = "Hello, world. 你好"
        with_specials = tuple(self.renderer.text_token_ids(sample, add_special_tokens=True))
        plain = tuple(self.renderer.text_token_ids(sample, add_special_tokens=False))
        return prefix if with_specials == prefix + plain else None

    def finish(self, plan: RenderPlan, tokenized: Sequence[tuple[int, ...]],
               session_key: str | None = None, request_id: str = "") -> RouteRequest:
        for index, ids in zip(plan.missing, tokenized):
            plan.token_ids[index] = ids
            piece = plan.pieces[index]
            self._pieces.put((plan.seed, plan.add_special_tokens, piece), ids, len(ids) + 1,
                             ENTRY_BYTES + text_bytes(piece) + ids_bytes(len(ids)))
        self._to_learn.extend(plan.learned)
        for reused in plan.reused:
            self.reused_pieces += 1
            if self.reused_pieces % REUSE_AUDIT_EVERY == 1:
                self._reuse_audits.append(reused)
        if plan.direct_ids is not None:
            self.truncated += plan.cut
            return self._kept(plan, RouteRequest(
                plan.model, tuple(extend(plan.seed, plan.direct_ids, plan.block_size)),
                len(plan.direct_ids), plan.block_size, session_key, request_id))
        hashes, total, turn = self._chain_pieces(plan, len(plan.pieces))
        self.truncated += plan.cut
        if turn is not None and self.conversations is not None and plan.store_key is not None:
            self.conversations.turns.put(plan.store_key, turn, len(turn.hashes) + 1,
                                         ENTRY_BYTES + hashes_bytes(len(turn.hashes))
                                         + ids_bytes(len(turn.carry)))
        result = RouteRequest(plan.model, hashes, -(-total // plan.units),
                              plan.block_size // plan.units, session_key, request_id)
        if plan.audit is not None:
            self._audits.append((plan.model, plan.audit, plan.block_size, result))
        return self._kept(plan, result)

    def _kept(self, plan: RenderPlan, result: RouteRequest) -> RouteRequest:
        """``result``, or, when vLLM will cut the prompt's start (``truncate_prompt_tokens``
        below its length, or a length routing did not read to the end), a request with no
        blocks to match (routed by load; the ``truncated`` fallback): the blocks vLLM
        caches then start wherever the cut falls, not at the prompt's start. Cut at its
        end instead (``truncation_side: "right"``), it keeps the blocks before the cut."""
        keep = plan.keep_tokens
        if keep is None or (not plan.cut and result.prompt_tokens <= keep):
            return result
        if plan.keep_first:  # the prompt's start is kept: its blocks, up to the cut
            return RouteRequest(result.model, result.block_hashes[:keep // result.block_size],
                                keep, result.block_size, result.session_key,
                                result.request_id)
        self.fell_back("truncated")
        return RouteRequest(result.model, (), min(result.prompt_tokens, keep),
                            result.block_size, result.session_key, result.request_id)

    def _chain_pieces(self, plan: RenderPlan,
                      count: int) -> tuple[tuple[int, ...], int, KnownTurn | None]:
        """Block hashes and tokens of the first ``count`` pieces (after ``plan.base``),
        and the turn to remember at ``plan.store_offset`` when it is reached."""
        base = plan.base
        state: ChainState
        before: tuple[int, ...]
        if base is None:
            state, before, total = (plan.seed, ()), (), 0
        else:
            state, before, total = (base.parent, base.carry), base.hashes, base.tokens
        hashes: list[int] = []
        offset = 0
        turn = None
        for piece, ids in zip(plan.pieces[:count], plan.token_ids[:count]):
            assert ids is not None
            if offset == plan.store_offset:
                turn = KnownTurn(*state, before + tuple(hashes), total)
            room = plan.max_units - total
            if len(ids) > room:  # the routing bound: the rest is forwarded, not analysed
                if room > 0:
                    hashes.extend(self._advance(state, ids[:room], plan.block_size)[0])
                plan.cut = True
                return before + tuple(hashes), plan.max_units, None
            total += len(ids)
            offset += len(piece)
            key = (state, piece)
            memo = self._chain.get(key)
            if memo is None:
                memo = self._advance(state, ids, plan.block_size)
                self._chain.put(key, memo, len(memo[0]) + 1,
                                ENTRY_BYTES + text_bytes(piece) + hashes_bytes(len(memo[0]))
                                + 2 * ids_bytes(len(memo[1][1])))
            new_hashes, state = memo
            hashes.extend(new_hashes)
        return before + tuple(hashes), total, turn

    # -- checking the incremental path ------------------------------------------------

    @property
    def work_pending(self) -> bool:
        """Audits and learning left to run off the request's path (``run_pending``)."""
        return bool(self._audits or self._to_learn or self._reuse_audits)

    def run_pending(self) -> int:
        """Learn the long pieces just tokenized, and run the sampled audits (in this thread)."""
        done = self._learn(self._take_learning())
        while self._reuse_audits:
            key, ids = self._reuse_audits.popleft()
            self._check_reuse(key, ids, self._full_ids(key))
            done += 1
        return done + self.run_audits()

    async def run_pending_async(self) -> int:
        """``run_pending`` on the event loop, with the long work in a worker thread:
        learning a long piece's cuts (the offsets of a 128k-character piece take
        ~85 ms to read) and an audit's tokenizing of a whole piece."""
        batch = self._take_learning()
        if sum(len(key[1]) for key, _ in batch) > OFFLOAD_CHARS:
            done = await asyncio.to_thread(self._learn, batch)
        else:
            done = self._learn(batch)
        while self._reuse_audits:
            key, ids = self._reuse_audits.popleft()
            full = (await asyncio.to_thread(self._full_ids, key) if len(key[1]) > OFFLOAD_CHARS
                    else self._full_ids(key))
            self._check_reuse(key, ids, full)
            done += 1
        while self._audits:
            audit = self._audits.popleft()
            plan = self._audit_plan(*audit)
            if plan is not None:
                self._audit_result(audit[3], plan, await self.tokenize(plan))
            done += 1
        return done

    def _take_learning(self) -> list[tuple[PieceKey, Offsets]]:
        """The pieces waiting to be learned, taken on the loop (a worker thread then
        learns them: nothing else reads the list)."""
        batch = list(self._to_learn)
        self._to_learn.clear()
        return batch

    def _learn(self, batch: list[tuple[PieceKey, Offsets]]) -> int:
        reuse = self.reuse
        if reuse is not None:
            for key, offsets in batch:
                reuse.learn(key, offsets)
        return len(batch)

    def _full_ids(self, key: PieceKey) -> tuple[int, ...]:
        add_special, text = key
        return tuple(self.renderer.text_token_ids(text, add_special_tokens=add_special))

    def _check_reuse(self, key: PieceKey, ids: tuple[int, ...], full: tuple[int, ...]) -> None:
        if full != ids and self.reuse is not None:
            self.reuse = None
            self.reuse_audit_failures += 1
            log.warning("tokenizer %s: a piece tokenized from a known piece's tokens "
                        "differs from a full tokenization (%d vs %d tokens); piece reuse "
                        "is off for this model", self.renderer.name, len(ids), len(full))

    def run_audits(self) -> int:
        """Re-derive sampled incremental results from a full render; returns how many ran.

        Off the request's path: the gateway runs it (``run_pending_async``) once the
        request that sampled it has been described; a full render of 1 in 64.
        """
        done = 0
        while self._audits:
            audit = self._audits.popleft()
            plan = self._audit_plan(*audit)
            if plan is not None:
                self._audit_result(audit[3], plan, self.tokenize_missing(plan))
            done += 1
        return done

    def _audit_plan(self, model: str, body: Mapping[str, Any], block_size: int,
                    result: RouteRequest) -> RenderPlan | None:
        memo = self.conversations
        if memo is None or not memo.enabled:
            return None
        try:
            text = self.renderer.render_chat(body)
        except RENDER_FAILURES as exc:
            memo.audit_failed(f"full render failed: {type(exc).__name__}")
            return None
        return self._plan_text(model, _seed(model, body), block_size, text, False)

    def _audit_result(self, result: RouteRequest, plan: RenderPlan,
                      tokenized: Sequence[tuple[int, ...]]) -> None:
        full = self.finish(plan, tokenized)
        memo = self.conversations
        if memo is not None and (full.block_hashes, full.prompt_tokens) != (
                result.block_hashes, result.prompt_tokens):
            memo.audit_failed(f"{result.prompt_tokens} vs {full.prompt_tokens} tokens")

    async def tokenize(self, plan: RenderPlan) -> list[tuple[int, ...]]:
        """``tokenize_missing``, in a worker thread when what is left to tokenize is long
        (the tokenizer releases the GIL on long texts, so the loop runs meanwhile). A
        long piece another request is tokenizing already is not tokenized again: this
        one waits for that result (``gateway.prompt.in_flight``: a burst behind a new
        long prefix)."""
        if plan.missing_chars <= OFFLOAD_CHARS:
            return self.tokenize_missing(plan)
        keys = [(plan.seed, plan.add_special_tokens, plan.pieces[index])
                for index in plan.missing]
        joined = {position: share for position, key in enumerate(keys)
                  if (share := self._tokenizing.get(key)) is not None}
        own = [position for position in range(len(keys)) if position not in joined]
        found: list[tuple[int, ...]] = [()] * len(keys)
        if own:
            indexes = [plan.missing[position] for position in own]
            task = self._tokenizing.start([keys[position] for position in own],
                                          asyncio.to_thread(self._tokenize_pieces, plan, indexes))
            for position, ids in zip(own, await asyncio.shield(task)):
                found[position] = ids
        for position, share in joined.items():
            found[position] = await asyncio.shield(share)
        return found

    async def analyse(self, model: str, body: Mapping[str, Any], kind: str, block_size: int,
                      session_key: str | None = None, request_id: str = "") -> RouteRequest:
        """What routing knows of a request: both phases, the long tokenizing in a worker
        thread, learning and audits scheduled after it. Never raises: routing is an
        optimisation, and a request it cannot analyse is routed by load (counted,
        ``reason="error"``) and answered by the replica."""
        empty = RouteRequest(model, (), 0, block_size, session_key, request_id)
        try:
            plan = self.plan(model, body, kind, block_size)
            if plan is None:
                return empty
            request = self.finish(plan, await self.tokenize(plan), session_key, request_id)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if not isinstance(exc, UnencodableText):  # that one is the replica's 400, as vLLM's
                log.warning("routing could not analyse a request (%s); routed by load",
                            type(exc).__name__)
            self.fell_back("error")
            return empty
        if self.work_pending:
            task = asyncio.ensure_future(self.run_pending_async())
            self._tasks.add(task)
            task.add_done_callback(self._pending_done)
        return request

    def _pending_done(self, task: asyncio.Future[int]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("prompt memo upkeep failed (%s)", type(task.exception()).__name__)

    @staticmethod
    def _advance(state: ChainState, ids: tuple[int, ...],
                 block_size: int) -> tuple[tuple[int, ...], ChainState]:
        parent, carry = state
        tokens = carry + ids
        full = len(tokens) - len(tokens) % block_size
        new_hashes = extend(parent, tokens[:full], block_size) if full else []
        return tuple(new_hashes), (new_hashes[-1] if new_hashes else parent, tokens[full:])

    def describe(self, model: str, body: Mapping[str, Any], kind: str, block_size: int,
                 session_key: str | None = None, request_id: str = "") -> RouteRequest:
        """Both phases in the calling thread."""
        plan = self.plan(model, body, kind, block_size)
        if plan is None:
            return RouteRequest(model, (), 0, block_size, session_key, request_id)
        return self.finish(plan, self.tokenize_missing(plan), session_key, request_id)

    def token_ids(self, model: str, body: Mapping[str, Any], kind: str) -> list[int]:
        """The full prompt token ids (for tests and the linter)."""
        plan = self.plan(model, body, kind, 1 << 30, incremental=False, limits=UNBOUNDED)
        if plan is None:
            raise RenderError("request cannot be rendered")
        if plan.direct_ids is not None:
            return list(plan.direct_ids)
        tokenized = iter(self.tokenize_missing(plan))
        out: list[int] = []
        for ids in plan.token_ids:
            out.extend(ids if ids is not None else next(tokenized))
        return out


def keep_tokens(body: Mapping[str, Any]) -> int | None:
    """A request's ``truncate_prompt_tokens`` when it asks vLLM to keep that many of the
    prompt's tokens (its last, or with ``truncation_side: "right"`` its first); None when
    unset or -1 (what fits the model's context: vLLM cuts
    only a prompt longer than the context, which it refuses without the option)."""
    keep = body.get("truncate_prompt_tokens")
    if isinstance(keep, int) and not isinstance(keep, bool) and keep >= 0:
        return keep
    return None


def _seed(model: str, body: Mapping[str, Any]) -> int:
    salt = body.get("cache_salt")
    return chain_seed(model, salt if isinstance(salt, str) else None)
