"""How to talk to one replica: the ``Backend`` protocol and its
implementations (aiohttp, httpx, vLLM in-process), errors translated where they enter.
"""
