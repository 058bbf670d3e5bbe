"""The HTTP face: the ASGI app and its wiring (``create_app``), the HTTP
server and its bounds on slow clients, the routes (the OpenAI API's, the gateway's own, the linter's), the live
linter's lifecycle observer.

May import every other gateway package: this is where they are composed.
"""
