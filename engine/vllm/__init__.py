"""vLLM itself, started by this project: local vLLM-on-CPU servers for
tests and the embedded default, and KV-event emulation.
"""
