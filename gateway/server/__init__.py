"""The HTTP face: the ASGI app and its wiring (``app.create_app``; the running
gateway's parts composed in ``start``, each built in ``parts``), the HTTP
server and its bounds on slow clients (``http``), the gateway's own routes
(``api``: the OpenAI API's models and versions, ops, the linter's, the
trace's; ``vllm_routes`` the table of the relayed ones, ``openapi`` their
document), the live linter's lifecycle observer.

May import every other gateway package: this is where they are composed.
"""
