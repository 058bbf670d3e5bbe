"""How to talk to one replica: the ``Backend`` protocol and its
implementations (HTTP/1.1 of our own, ``h1``; httpx; vLLM in-process), errors translated where they enter.
"""
