"""The offline KV-cache tools: the capacity planner, the quality gate for
quantized KV caches, the vLLM launch profiles. Never imported by the request path.
"""
