"""One routed request, start to finish: the front door every HTTP request
meets first (``front``: drain, admission, the relayed routes' table in
``route_table``), then parse (``exchange``, ``body``), decide (``dispatch``,
``decider``), forward and relay (``proxy``, ``streaming``), and the lifecycle
its observers hear (``lifecycle``: the decider's learning, the recorder),
and the drain on shutdown.

Imports ``gateway.prompt``, ``gateway.ops`` (metrics), ``gateway.auth.keys`` (a
request's admission and the grant it carries), ``engine`` and ``policies``;
never the linter, the KV tools, the HTTP face or the fleet: the gateway's own
routes reach the front door as an ASGI app it is handed.
"""
