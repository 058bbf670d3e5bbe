"""Where a parsed request goes: its model, its prompt's blocks, the decision.

Each route says how it is routed (``Route.routing``, table in
``gateway.server.vllm_routes``):

* ``prefix`` (chat, completions, responses, the render routes): the prompt
  is rendered and hashed (``GatewayState.describe``) and the configured
  policy decides (``GatewayState.decider``). A body with no prompt the
  gateway can render (an unknown shape: ``gateway.request.prompt_shapes``) is routed
  by load instead of being refused; the replica answers it as vLLM does.
* ``load`` (tokenize, detokenize, embeddings, pooling, classify, score,
  rerank, audio): the least loaded healthy replica of the model
  (``policies.least_load``); nothing is rendered and the cache-aware policy
  learns nothing from it. Failover still follows the load order.
* ``home``, and any ``/v1/responses`` naming ``previous_response_id``: the
  replica that holds the stored response (``gateway.request.response_homes``), and
  only it, since no other has the response. An id the gateway has not seen
  is looked for: each healthy replica is asked ``GET /v1/responses/{id}``
  and the one that has it becomes its home. When none has it, the request
  goes by load to a healthy replica, which answers vLLM's own 404.

A stored response whose replica is out of rotation is a 503 with
``retry-after`` (it may come back), not an answer from a replica that never
had it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from urllib.parse import quote

from engine.errors import EngineError
from engine.pool.replicas import ReplicaPool
from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyReplica, ResponseNotFound
from gateway.request.decider import Decider
from gateway.request.exchange import Exchange
from gateway.request.response_homes import Home, ResponseHomes, named_response, owner_of
from gateway.request.state import GatewayState
from policies.least_load import LeastLoad
from policies.types import Decision, RouteRequest

log = logging.getLogger("prefixgate.dispatch")

HOME = "response-home"
"""The decision's reason for a request sent where its stored response lives."""


def resolve_model(pool: ReplicaPool, requested: str | None, retry_after: int = 1) -> str:
    """The model a request is for: the one it names, or the one base model served (under
    one or several names; LoRA adapters aside), as vLLM picks its first served name.

    A model no replica has reported is a 404, unless some replica has not
    answered yet (its models are unknown), or there is no replica at all: then it is
    a 503 with ``retry-after``, since a replica still to come may well serve it."""
    known = pool.known_models()
    if requested is not None and requested in known:
        return requested
    base = [name for name in known if pool.model_parent(name) is None]  # not adapters
    if requested is None and (len(base) == 1 or _aliases(pool, base)):
        return base[0]  # vLLM's default: its first served name
    silent = [replica for replica in pool if not replica.models]
    if not known and not silent:  # no replica at all (DNS that resolves to none yet)
        raise NoHealthyReplica(
            f"no replica serves model `{requested or '(default)'}`: the gateway has no "
            "replica yet (a --replicas-from name that resolves to no address, or every "
            "replica left); retry shortly", headers={"retry-after": str(retry_after)})
    if silent and (requested is not None or not known):
        names = ", ".join(f"{r.id} ({r.spec.url})" for r in silent[:5])
        raise NoHealthyReplica(
            f"no reachable replica serves model `{requested or '(default)'}`: "
            f"{len(silent)} replica(s) have not answered yet: {names}; retry shortly",
            headers={"retry-after": str(retry_after)})
    if requested is None:
        raise InvalidRequest("model: field required", param="model")
    raise ModelNotFound(f"The model `{requested}` does not exist. "
                        f"Valid aliases: {', '.join(base)}.", param="model")


def _aliases(pool: ReplicaPool, names: list[str]) -> bool:
    """Whether the served base models' names are one model's (``--served-model-name a
    b``): every replica serves all of them, and they report one root."""
    if not names:
        return False
    roots = {pool.model_root(name) for name in names}
    return len(roots) == 1 and None not in roots and all(
        set(names) <= set(replica.models) for replica in pool if replica.models)


def _new_everywhere(decision: Decision) -> bool:
    """No replica holds or awaits any block of the prompt."""
    return not any(decision.matched_blocks.values())


class Dispatcher:
    def __init__(self, state: GatewayState, homes: ResponseHomes) -> None:
        """``homes``: where stored responses live (a lifecycle observer learns them)."""
        self.state = state
        self.pool = state.pool
        self.homes = homes
        self.by_load = Decider(state.pool, LeastLoad(), state.metrics,
                              retry_after=state.settings.retry_after_seconds)
        self._placing = asyncio.Lock()
        """Held while a new prefix is claimed (``_claimed``)."""

    async def decide(self, exchange: Exchange) -> None:
        """Fill in the exchange's model, routing request and decision."""
        named = named_response(exchange)
        home = await self.home(named, exchange.fields.model, owner_of(exchange)) if named else None
        if home is not None:
            exchange.set_model(exchange.fields.model or home.model)
            exchange.decision = self._at_home(home, named or "")
        elif exchange.route.routing == "home":
            exchange.set_model(exchange.fields.model or self._any_model())
            exchange.decision = self._by_load(exchange)
        else:
            retry_after = self.state.settings.retry_after_seconds
            try:
                model = resolve_model(self.pool, exchange.fields.model, retry_after)
            except ModelNotFound:
                # loaded since the last models probe (a LoRA adapter, say)? ask once now
                if not await self.pool.refresh_models():
                    raise
                model = resolve_model(self.pool, exchange.fields.model, retry_after)
            exchange.set_model(model)
            if exchange.route.routing == "prefix" and exchange.prompt is not None:
                await self._by_prefix(exchange)
            else:
                exchange.decision = self._by_load(exchange)

    async def _by_prefix(self, exchange: Exchange) -> None:
        state = self.state
        exchange.request = request = await state.describe(exchange)
        decision = state.decider.decide(request)
        if state.workers is not None and request.block_hashes and _new_everywhere(decision):
            decision = await self._claimed(request, decision)
        exchange.decision = decision

    async def _claimed(self, request: RouteRequest, decision: Decision) -> Decision:
        """A prefix new everywhere, placed with the sibling workers (``gateway.fleet.local``):
        two workers taking its burst's first requests at once would each place it, and two
        new prefixes decided at once by two workers could land on one replica; the hub
        answers where it goes.

        One at a time in this worker: a claim waits for the hub, and a new prefix decided
        meanwhile would not see this one's prefill queued where it goes (one process
        decides and sends without waiting in between). The lock is let go before the
        request is sent, but the request that waited runs only on a later turn of the
        loop: by then this one is on its way (``Policy.sent``)."""
        workers = self.state.workers
        decider = self.state.decider
        assert workers is not None and request.block_hashes
        waited = self._placing.locked()
        async with self._placing:
            if waited:  # what was placed while it waited, it now sees
                decision = decider.decide(request, counted=False)
                if not _new_everywhere(decision):
                    return decision
            claimed = await workers.claim(request.block_hashes[0], decision.replica_id,
                                          decision.fallbacks)
            # Meanwhile the siblings' requests were heard of: a prefix now on its way
            # somewhere is decided by cost (follow it, or spill past a long queue), not
            # by the claim.
            decision = decider.decide(request, counted=False)
        if _new_everywhere(decision) and claimed != decision.replica_id \
                and claimed in decision.order:
            decision = dataclasses.replace(
                decision, replica_id=claimed,
                fallbacks=tuple(r for r in decision.order if r != claimed))
        return decision

    def _by_load(self, exchange: Exchange) -> Decision:
        model = exchange.model
        return self.by_load.decide(RouteRequest(
            model, block_size=self.by_load.block_size(model),
            session_key=exchange.session_key, request_id=exchange.request_id))

    def _at_home(self, home: Home, response_id: str) -> Decision:
        routable = any(view.id == home.replica_id and view.healthy
                       for view in self.pool.snapshot())
        if not routable:
            raise NoHealthyReplica(
                f"replica {home.replica_id}, which holds response {response_id}, is out of "
                "rotation; retry shortly",
                headers={"retry-after": str(self.state.settings.retry_after_seconds)})
        return Decision(replica_id=home.replica_id, reason=HOME)

    def _any_model(self) -> str:
        models = self.pool.healthy_models() or self.pool.known_models()
        if not models:
            raise NoHealthyReplica("no replica serves any model; retry shortly",
                                   headers={"retry-after": str(
                                       self.state.settings.retry_after_seconds)})
        return models[0]

    async def home(self, response_id: str, model: str | None,
                   owner: str | None = None) -> Home | None:
        """Where ``response_id`` is stored: remembered, else asked of the replicas.

        With client keys (``owner`` set) only the owner's own responses are found:
        another tenant's, or one the gateway does not remember, is vLLM's 404."""
        known = self.homes.get(response_id)
        if owner is not None and (known is None or known.owner != owner):
            raise ResponseNotFound(response_id)
        if known is not None:
            return known
        candidates = [r for r in self.pool if r.healthy and (model is None or model in r.models)]
        found = await asyncio.gather(*(self._holds(r.id, response_id) for r in candidates))
        for replica, holds in zip(candidates, found):
            if holds:
                home = Home(replica.id, model or (replica.models[0] if replica.models else ""))
                self.homes.put(response_id, home)
                return home
        return None

    async def _holds(self, replica_id: str, response_id: str) -> bool:
        try:
            status, _ = await self.pool.get(replica_id).backend.get(
                f"/v1/responses/{quote(response_id, safe='')}")
        except EngineError as exc:
            log.debug("asking %s for response %s: %s", replica_id, response_id, exc.detail)
            return False
        return status == 200
