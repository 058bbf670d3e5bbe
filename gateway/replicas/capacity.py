"""A replica's KV capacity from the planner, for replicas that publish none.

vLLM publishes its capacity in ``vllm:cache_config_info`` (``num_gpu_blocks``);
the cache-aware policy sizes each replica's part of the prefix index by it.
A replica behind something that hides its metrics, or an older build, gives
nothing: ``capacity:`` in its replica settings (``CapacitySettings``) lets the
gateway use ``prefixgate plan``'s arithmetic instead. What the replica
publishes, once it does, always wins (``engine.pool.replicas.Replica.capacity_blocks``).
"""

from __future__ import annotations

from gateway.config import CapacitySettings, ConfigError
from gateway.kv.model import ModelShape, PlanError, load_config
from gateway.kv.plan import PlanInput, plan


def planned_blocks(settings: CapacitySettings) -> int:
    """KV blocks the planner gives the replica; ``ConfigError`` when it cannot plan."""
    try:
        shape = ModelShape.from_config(load_config(settings.config))
        result = plan(shape, PlanInput(
            tensor_parallel_size=settings.tensor_parallel_size,
            kv_cache_dtype=settings.kv_cache_dtype, weight_dtype=settings.weight_dtype,
            gpu_memory_gib=settings.gpu_memory_gb,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len, block_size=settings.block_size))
    except (PlanError, ValueError) as exc:
        raise ConfigError(f"replica capacity: {exc}") from None
    return result.num_blocks
