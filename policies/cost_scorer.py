"""``cost`` scorer (the default): estimated time to first token, lowest wins.

::

    cost(r) = running(r) * (running_request_seconds
                            + output_tokens * decode_seconds_per_sequence)
            + waiting(r) * waiting_request_seconds
            + (pending_prefill(r) + uncached_tokens(r)) * prefill_seconds_per_token
            + kv_pressure(r) * kv_pressure_seconds
            - session_affinity_seconds   (only the session's last replica)

The cost is the request's estimated latency: its time to first token, and
what the replica's other running requests add to its decode. The second
term is what keeps a crowd off one replica once it holds a prefix: each
running request makes every decode step a little longer
(``decode_seconds_per_sequence``), so an answer of ``output_tokens`` tokens
takes that much longer there per running request. ``output_tokens`` is the
request's own limit (``max_tokens``, ``max_completion_tokens``,
``max_output_tokens``) up to ``max_expected_output_tokens``, or
``expected_output_tokens`` when it sets none. Without it, side by side on
``vllm bench serve``'s burst the replica that confirmed a new prefix first
took a third more of the burst and TTFT p99 doubled; with it, TTFT p99 on
the shared-prefix and multi-turn benchmarks halved (docs/benchmarks/bursts.md).

``uncached_tokens = prompt_tokens - matched(r) * block_size``: what the
replica must prefill for this request. ``matched`` counts the blocks the
replica holds *and* the blocks on their way there (a prefix an earlier
request is still prefilling: :mod:`policies.pending`), because the engine
serves a queued request the blocks an earlier one is computing.

``pending_prefill`` is the work that request would queue behind: the prompt
tokens the gateway has sent to the replica whose prefill is not confirmed
yet (``ReplicaView.pending_prefill_tokens``, its own bookkeeping, fresh on
every decision). This is what keeps a burst honest: a hundred requests
decided in the same millisecond no longer all see an idle replica. For a
burst of one new prefix, the first request pays the prefill; the next one
either joins it (its cost: the prefill already queued there plus its own
uncached tail) or pays the prefill on an idle replica (the whole prompt):
whichever finishes first by this estimate. Requests keep spreading until
the queued work everywhere exceeds one prefix's prefill, then they join
the replicas already holding it. Conversations that share a system prompt
spread the same way, each conversation then following its own history.

``waiting`` is the engine's queue beyond the gateway's own pending requests
(``max(0, vllm:num_requests_waiting - pending_requests)``: another client's
requests, whose prompts the gateway cannot see, are priced as a typical
prefill each). ``running`` is the rest of the replica's outstanding requests
(``ReplicaView.load`` less those others' waiting and the gateway's own pending
ones), plus the pending ones whose prefill the estimate has drained
(``ReplicaView.prefilled_requests``): each slows the shared engine steps a
little. A request the gateway sent costs its prefill while the estimate says
it is prefilling and a running slot after, never nothing. (Before, one whose
prefill was drained but whose first token had not come cost nothing, and a
replica was priced by how early its requests got their first tokens: in
``vllm bench serve``'s 1,000 prompts, decided over a few seconds while first
tokens came back, a replica holding 153 requests scored 0.45 s against 0.22 s
for one holding 208, and got 154 of the 1,000 against 340. Counting every
pending request as running from the moment it is sent evened that out too,
but weighed a burst's queued requests twice, their prefill and their slot,
and split a prefix of a burst of eight over two replicas.) ``kv_pressure``
rises linearly from 0 at ``kv_pressure_threshold`` KV usage to 1 at full: a
nearly full cache makes the engine queue, preempt and evict. The trade-off is
explicit: with the defaults a cached 1,000-token prefix is worth one more
waiting request, 1,000 tokens of prefill queued ahead, or more running
requests the shorter the answer: about 19 for a 16-token answer, 12 for
one of unknown length, 4 for one of 128 tokens or more. Equal costs are broken by the rotating turn, so identical
replicas share load.

**A spill's work, when every replica is busy.** The estimate above is the
request's own TTFT; it does not see what the request does to the requests
after it. Sending a request away from the replica that holds (or is already
prefilling) its prefix adds that prefix's prefill to another replica's queue,
and every request that queues there later waits for it. While some replica
has nothing queued that costs no one anything, so a burst of one new prefix
still spreads over the idle replicas. But once every replica is busy
(unconfirmed prefill of the gateway's own, or the engine's waiting queue), a
spill only moves work around and adds more: in a burst of 100 behind eight new
1,024-token prefixes the scorer split a prefix over two replicas to save ~10 ms
of its own estimate, paying 1,024 more prefill tokens that the next requests
on that replica waited for (cached tokens 97% of the bound, TTFT p99 16% over
the ``prefix`` index's run that happened not to split). So with every replica
busy, the prompt tokens a candidate would prefill beyond the best candidate's
are priced once more (``spill_prefill_weight``): a request still moves when
the queue it leaves is longer than the one it joins by more than twice its
extra prefill. The scores reported stay the TTFT estimates; only the ranking
adds this.

Reasons: ``session`` (the affinity discount decided), ``miss`` (no replica
holds any of the prompt), ``hit`` (the chosen replica holds the best match),
``load-fallback`` (a better match was passed over for load). Scores are the
estimated TTFT in seconds.

Options (``policy_options`` of ``prefix`` / ``precise`` with ``scorer: cost``):

* ``prefill_seconds_per_token`` (default 0.0001): prefill time per uncached
  token, i.e. 10k tokens/s. The gateway's pool drains each replica's queue of
  unconfirmed prefill at this speed too (:func:`drain_seconds_per_token`).
* ``running_request_seconds`` (default 0.002): TTFT added per running
  request. A running request slows each engine step by about one decode slot
  (a few milliseconds at most on a GPU, 0.2 ms in the simulator's default
  model); it does not delay our prefill the way a waiting request does. With
  0.01 the side-by-side shared-prefix benchmark lost 3.5 points of hit rate
  and had a worse TTFT p99 than with 0.002 (BENCHMARKS.md): affinity was
  given up for load differences that cost less than the prefill it caused.
* ``waiting_request_seconds`` (default 0.1): TTFT added per waiting request
  (about the prefill of a 1,000-token prompt).
* ``decode_seconds_per_sequence`` (default 0.0002; 0 turns the term off): how
  much longer each decode step takes per running sequence (the simulator's
  default, calibrated against vLLM on CPU; a large model's decode step on a
  GPU grows by about 0.1-0.3 ms per sequence it batches).
* ``expected_output_tokens`` (default 32): a request's answer length when it
  sets no limit. Low on purpose: the cost model does not price what a
  spilled request evicts on the replica it spills to, so an unknown answer
  length should not weigh more than a cached prefix (in an offline replay
  with tight caches, 128 cost 14 points of hit rate).
* ``max_expected_output_tokens`` (default 128): the most a limit counts for
  (limits are often ceilings far above the answer).
* ``spill_prefill_weight`` (default 1.0; 0 turns it off): with every replica
  busy, the weight of the extra prefill tokens a spill adds, in units of
  ``prefill_seconds_per_token`` (above).
* ``kv_pressure_threshold`` (default 0.9): KV usage where pressure starts.
* ``kv_pressure_seconds`` (default 1.0): TTFT added at 100% KV usage.
* ``session_affinity_seconds`` (default 0.02): the discount for the
  session's last replica, about 200 tokens of prefill: a tie-breaker. The
  index already sends a turn to the replica holding its history; in replays
  of multi-turn chats a large discount (0.25) cost 11 points of hit rate by
  pinning sessions to replicas whose copy of the history was evicted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.scoring import Candidates, prompt_token_count
from policies.types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class CostConfig:
    prefill_seconds_per_token: float = 0.0001
    running_request_seconds: float = 0.002
    waiting_request_seconds: float = 0.1
    kv_pressure_threshold: float = 0.9
    kv_pressure_seconds: float = 1.0
    session_affinity_seconds: float = 0.02
    decode_seconds_per_sequence: float = 0.0002
    expected_output_tokens: int = 32
    max_expected_output_tokens: int = 128
    spill_prefill_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill_seconds_per_token", "running_request_seconds", "spill_prefill_weight",
                     "waiting_request_seconds", "kv_pressure_seconds",
                     "session_affinity_seconds", "decode_seconds_per_sequence",
                     "expected_output_tokens", "max_expected_output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0.0 <= self.kv_pressure_threshold < 1.0:
            raise ValueError("kv_pressure_threshold must be in [0, 1)")

    def running_seconds(self, request: RouteRequest) -> float:
        """What one more running request on a replica adds to this request's latency:
        to its first token, and to each of its answer's decode steps."""
        if not self.decode_seconds_per_sequence:
            return self.running_request_seconds
        output = min(request.output_tokens or self.expected_output_tokens,
                     self.max_expected_output_tokens)
        return self.running_request_seconds + output * self.decode_seconds_per_sequence


def drain_seconds_per_token(policy_options: Mapping[str, Any]) -> float:
    """The speed the gateway assumes a replica gets through the prefill it was sent and has
    not confirmed (``engine.pool.prefill``): the speed the cost model prices prefill at,
    ``prefill_seconds_per_token`` where the policy's options set it above 0, else its
    default. The queue a request is priced behind then drains at the speed it is priced
    at: with 10k tokens/s assumed for a replica configured at 2k, a burst arriving over a
    slow prefill saw that prefill done five times too soon and joined it; at 50k, a
    replica that had long finished still looked busy and the burst spread for nothing. A
    value the policy would reject gives the default here: the policy fails the start with
    the reason."""
    default = CostConfig.prefill_seconds_per_token
    value = policy_options.get("prefill_seconds_per_token")
    try:
        seconds = float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return default
    return seconds if seconds > 0 and math.isfinite(seconds) else default


def estimated_ttft(replica: ReplicaView, matched_blocks: int, request: RouteRequest,
                   config: CostConfig) -> float:
    """The cost of sending ``request`` to ``replica`` without the session discount, in seconds."""
    prompt_tokens = prompt_token_count(request)
    cached_tokens = min(prompt_tokens, matched_blocks * request.block_size)
    prefill = (replica.pending_prefill_tokens + prompt_tokens - cached_tokens) \
        * config.prefill_seconds_per_token
    waiting = max(0, replica.waiting - replica.pending_requests)
    running = max(0, replica.load - waiting - replica.pending_requests
                  + replica.prefilled_requests)
    queue = running * config.running_seconds(request) + waiting * config.waiting_request_seconds
    headroom = 1.0 - config.kv_pressure_threshold
    pressure = max(0.0, min(1.0, (replica.kv_usage - config.kv_pressure_threshold) / headroom))
    return queue + prefill + pressure * config.kv_pressure_seconds


class CostScorer:
    name = "cost"

    def __init__(self, config: CostConfig) -> None:
        self.config = config

    def rank(self, request: RouteRequest, candidates: Candidates) -> Decision:
        # estimated_ttft, inlined: at 64 replicas this loop is most of a decision's
        # cost, and attribute lookups and calls are what it spends (tests hold the
        # two equal).
        config, matched, turn = self.config, candidates.matched, candidates.turn
        prompt_tokens = prompt_token_count(request)
        block_size, per_token = request.block_size, config.prefill_seconds_per_token
        per_running, per_waiting = config.running_seconds(request), config.waiting_request_seconds
        threshold, pressure_seconds = config.kv_pressure_threshold, config.kv_pressure_seconds
        headroom = 1.0 - threshold
        base: dict[str, float] = {}
        uncached: dict[str, int] = {}
        all_busy = len(candidates.replicas) > 1
        for replica in candidates.replicas:
            cached = matched[replica.id] * block_size
            if cached > prompt_tokens:  # noqa: PLR1730 (min() is a call: slower here)
                cached = prompt_tokens
            uncached[replica.id] = prompt_tokens - cached
            pending = replica.pending_requests
            waiting = replica.waiting - pending
            if waiting < 0:  # noqa: PLR1730
                waiting = 0
            if all_busy and not (replica.pending_prefill_tokens or waiting):
                all_busy = False
            load = replica.running + replica.waiting
            if replica.inflight > load:  # noqa: PLR1730
                load = replica.inflight
            running = load - waiting - pending + replica.prefilled_requests
            if running < 0:  # noqa: PLR1730
                running = 0
            cost = running * per_running + waiting * per_waiting \
                + (replica.pending_prefill_tokens + prompt_tokens - cached) * per_token
            if replica.kv_usage > threshold:
                cost += min(1.0, (replica.kv_usage - threshold) / headroom) * pressure_seconds
            base[replica.id] = cost
        cost_of = dict(base)
        session = candidates.session_replica
        if session is not None:
            cost_of[session] -= config.session_affinity_seconds
        # The spill's price (every replica busy): ranking only, never in the scores.
        spill = config.spill_prefill_weight * per_token if all_busy else 0.0
        least = min(uncached.values())
        rank_of = {rid: cost + (uncached[rid] - least) * spill for rid, cost in base.items()}
        keys = {rid: (rank_of[rid] - (config.session_affinity_seconds if rid == session
                                      else 0.0), turn[rid]) for rid in rank_of}
        ranked = sorted(keys, key=keys.__getitem__)
        chosen = ranked[0]
        best_match = max(matched.values())
        if chosen == session and min(rank_of, key=lambda rid: (rank_of[rid], turn[rid])) != chosen:
            reason = "session"
        elif best_match == 0:
            reason = "miss"
        elif matched[chosen] == best_match:
            reason = "hit"
        else:
            reason = "load-fallback"
        return Decision(replica_id=chosen, reason=reason, fallbacks=tuple(ranked[1:]),
                        matched_blocks=matched, scores=cost_of)
