"""Recording the traffic's shape, never its text: one Mooncake-format line per request.

``format`` is the line and its keyed hash ids; ``writer`` the bounded,
rotated file and the thread that writes it; ``recorder`` the lifecycle
observer that feeds it; ``metrics`` its series; ``setup`` builds them from
``trace:`` in the settings. ``gateway.replay`` reads what this writes. The
request path (``gateway.request``) never imports this package; ``format``
imports nothing of the gateway, so the offline tools read traces without it.
"""
