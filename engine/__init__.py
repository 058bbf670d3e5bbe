"""The replicas' side: how the gateway talks to inference engines, and the simulated one.

    backends/    one replica: the ``Backend`` protocol, over HTTP or vLLM in-process
    pool/        all replicas: health and breakers, scraped metrics, load and work in
                 flight, slow-replica detection, DNS discovery
    kv_events.py vLLM's KV-cache events, subscribed to over ZMQ
    sim/         ``prefixgate sim``: a vLLM-compatible server with a simulated engine
    vllm/        vLLM itself, started here (vLLM-on-CPU servers, KV-event emulation)

Never imports ``gateway`` (import-linter).
"""
