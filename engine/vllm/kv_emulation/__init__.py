"""A transformers reference whose KV cache is round-tripped through a quantized dtype.

For machines where vLLM cannot store the KV dtype being judged (vLLM on CPU
stores FP8 KV only on x86 with AVX-512 or AMX), this stands in for a vLLM
replica so ``prefixgate kv-quality`` can be exercised end to end. It is an
**emulation**: the numbers say what the rounding of K and V costs this model,
not what a vLLM kernel does, and every response says so.

* ``quantize`` -- the round trips (bf16 ``auto``, FP8 E4M3, INT8 per token
  and head, a broken 2-bit one) and a ``DynamicCache`` that applies them.
* ``reference`` -- prompt log-probabilities and greedy decoding through it.
* ``server`` -- ``/v1/completions`` in vLLM's shapes, one model name per mode.
* ``process`` -- starts the server under the vLLM-on-CPU venv's interpreter
  (importing nothing heavy, so the gateway's venv can use it).

Only ``process`` may be imported without torch.
"""
