"""What one instance's routing learns, handed to the others: a lifecycle observer.

Between one gateway's workers, a request's way there travels too: sent (its
prefix is pending at the replica for the siblings as for this worker) and
failed before its first byte (it is not).

When a replica confirms a prefix-routed request's prefill (its first byte:
``gateway.request.lifecycle``), the policy learns the request's blocks there
(``gateway.request.decider``) and this observer queues the same for the other
gateway instances (``SharedRouting.routed``, published in batches through Redis between
instances, through the supervisor's hub between one gateway's workers).
"""

from __future__ import annotations

from gateway.fleet.shared import SharedRouting
from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent


class FleetPublisher(Silent):
    def __init__(self, fleet: SharedRouting) -> None:
        self.fleet = fleet

    def on_sent(self, exchange: Exchange, replica_id: str) -> None:
        if exchange.request is not None and exchange.decision is not None:
            self.fleet.sent(exchange.request, replica_id, exchange.uncached_tokens(replica_id))

    def on_first_byte(self, exchange: Exchange, replica_id: str) -> None:
        if exchange.request is not None and exchange.decision is not None:
            self.fleet.routed(exchange.request, replica_id)

    def on_failed(self, exchange: Exchange, replica_id: str) -> None:
        if exchange.request is not None and exchange.decision is not None:
            self.fleet.abandoned(exchange.request, replica_id)
