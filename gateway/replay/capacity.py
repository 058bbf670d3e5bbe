"""Each replayed replica's KV capacity, in blocks: given, from a launch profile, or planned.

In order of precedence:

* ``blocks``: that many (``--blocks``), e.g. what ``vllm:cache_config_info``
  says a replica has, or half of it for a what-if;
* ``profile`` (``prefixgate profiles``): the profile's launch settings planned
  over ``model_config`` (the model's ``config.json``: the profiles name
  Hugging Face repositories, the planner needs their shape), with its
  ``kv_cache_dtype`` replaced when one is given -- "what does an FP8 KV cache
  do to our hit rate" is the same profile with ``fp8``;
* ``model_config`` alone: ``prefixgate plan``'s arithmetic with the given
  tensor parallelism, KV dtype, GPU memory and utilisation;
* nothing: the latency model's own ``num_blocks`` (what the fitted replicas had).

The block size is the replay's (``prefixgate replay --block-size``, by default
the trace's), passed to the planner so blocks and tokens agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.kv.model import ModelShape, PlanError, load_config
from gateway.kv.plan import PlanInput, plan
from gateway.kv.profiles import UnknownProfile, get_profile


class CapacityError(ValueError):
    """The KV capacity cannot be worked out (the message says why)."""


@dataclass(frozen=True, slots=True)
class CapacityChoice:
    blocks: int | None = None
    profile: str | None = None
    model_config: str | None = None
    kv_cache_dtype: str | None = None
    tensor_parallel_size: int = 1
    gpu_memory_gb: float = 80.0
    gpu_memory_utilization: float = 0.92
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    blocks: int
    block_size: int
    source: str
    """How the number was arrived at, for the report."""
    max_model_len: int | None = None
    """The planned replicas' ``max_model_len``, when a plan gave the capacity."""

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


def resolve_capacity(choice: CapacityChoice, block_size: int, default_blocks: int) -> Capacity:
    if choice.blocks is not None:
        if choice.blocks <= 0:
            raise CapacityError("--blocks must be positive")
        return Capacity(choice.blocks, block_size, "--blocks")
    if choice.profile is None and choice.model_config is None:
        return Capacity(default_blocks, block_size, "the latency model's num_blocks")
    if choice.model_config is None:
        raise CapacityError(f"--profile {choice.profile} needs --model-config: the model's "
                            "config.json (or its folder), for the planner")
    if choice.profile is not None:
        try:
            profile = get_profile(choice.profile)
        except UnknownProfile as exc:
            raise CapacityError(str(exc)) from None
        inputs = profile.plan_input()
        source = f"profile {profile.name}"
    else:
        inputs = PlanInput(tensor_parallel_size=choice.tensor_parallel_size,
                           gpu_memory_gib=choice.gpu_memory_gb,
                           gpu_memory_utilization=choice.gpu_memory_utilization,
                           max_model_len=choice.max_model_len)
        source = f"plan tp={choice.tensor_parallel_size}"
    if choice.kv_cache_dtype:
        inputs = replace(inputs, kv_cache_dtype=choice.kv_cache_dtype)
    inputs = replace(inputs, block_size=block_size)
    try:
        planned = plan(ModelShape.from_config(load_config(choice.model_config)), inputs)
    except (PlanError, ValueError) as exc:
        raise CapacityError(f"plan: {exc}") from None
    if planned.num_blocks <= 0:
        raise CapacityError(f"plan: no room for a KV cache ({source})")
    return Capacity(planned.num_blocks, block_size,
                    f"{source}, KV {planned.kv_cache_dtype} ({choice.model_config})",
                    max_model_len=planned.max_model_len)
