"""One routed request, start to finish: parse (``exchange``), decide
(``dispatch``, ``decider``), forward and relay (``proxy``, ``streaming``), and the
lifecycle its observers hear (``lifecycle``: the decider's learning, the recorder),
and the drain on shutdown.

Imports ``gateway.prompt``, ``gateway.ops`` (metrics), ``gateway.auth.keys`` (the grant a
request carries), ``engine`` and ``policies``; never the linter or the KV tools.
"""
