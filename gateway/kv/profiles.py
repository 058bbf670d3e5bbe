"""Named vLLM launch profiles: one source for the command line, the config and the manifests.

A :class:`Profile` is a model plus the ``vllm serve`` flags the reference
deployment runs it with (tensor parallelism, memory, context, prefix caching,
KV-cache and weight dtypes) and the KV-event publisher the gateway follows.
From it come, with no second copy to drift:

* :meth:`Profile.serve_args` -- the arguments after ``vllm serve`` (what the
  Kubernetes StatefulSets and the compose services run; a CI test holds the
  manifests equal to it, an e2e test parses it with vLLM's own parser);
* :meth:`Profile.inprocess_replica` -- the ``replicas:`` entry of an in-process
  replica (its ``vllm:`` block; the gateway adds the KV-event sockets itself);
* :meth:`Profile.remote_replica` and :meth:`Profile.discovery_source` -- how the
  gateway reaches a server started from it, one address or a DNS name;
* :meth:`Profile.plan_input` -- the same settings for ``prefixgate plan``.

KV events: vLLM binds its ZMQ PUB socket only for an endpoint holding ``*``
(a host address makes it *connect*), so a server publishes on
``tcp://*:5557`` (replay ROUTER ``tcp://*:5558``, topic ``kv``) and the gateway
connects to ``tcp://HOST:5557`` (``gateway.replicas.kv_feed``).

The INT8 KV cache is ``--kv-cache-dtype int8_per_token_head``: vLLM 0.32's
name for it (its choices have no plain ``int8``), the same name
``gateway.kv.plan`` resolves ``int8`` to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.config import VllmSettings
from gateway.kv.plan import PlanInput

VLLM_PORT = 8000
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
KV_TOPIC = "kv"
MODELS_DIR = "/models"
"""Where the deployments mount the model weights (Kubernetes volume, compose bind)."""


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    hf_repo: str
    """Hugging Face repository the weights come from (downloaded into ``MODELS_DIR``)."""
    served_model_name: str
    tensor_parallel_size: int
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    gpu_memory_utilization: float = 0.92
    max_model_len: int = 32768
    gpu_memory_gib: float = 80.0
    """Memory of one GPU the profile is sized for (H100/A100 80 GB)."""

    @property
    def model_path(self) -> str:
        return f"{MODELS_DIR}/{self.hf_repo.rsplit('/', 1)[-1]}"

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size

    def vllm_settings(self) -> VllmSettings:
        """The ``vllm:`` block: what both an in-process replica and ``vllm serve`` get."""
        return VllmSettings.model_validate({
            "model": self.model_path, "served_model_name": self.served_model_name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len, "enable_prefix_caching": True,
            "kv_cache_dtype": self.kv_cache_dtype, "quantization": self.quantization,
            # cached tokens in usage.prompt_tokens_details: the gateway's hit-rate figures
            "extra_args": ["--enable-prompt-tokens-details"],
        })

    def kv_events_config(self) -> dict[str, Any]:
        """vLLM's ``--kv-events-config`` object for a server the gateway reaches over TCP."""
        return {"enable_kv_cache_events": True, "publisher": "zmq",
                "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
                "replay_endpoint": f"tcp://*:{KV_REPLAY_PORT}", "topic": KV_TOPIC}

    def serve_args(self, host: str = "0.0.0.0", port: int = VLLM_PORT) -> list[str]:
        """Everything after ``vllm serve``: the model first, positional (vLLM 0.32 warns
        that ``serve --model`` will go away), then the flags."""
        flag, model, *flags = self.vllm_settings().to_args()
        assert flag == "--model"
        return [model, *flags, "--host", host, "--port", str(port),
                "--kv-events-config", json.dumps(self.kv_events_config(), separators=(",", ":"))]

    def command(self, host: str = "0.0.0.0", port: int = VLLM_PORT) -> list[str]:
        return ["vllm", "serve", *self.serve_args(host, port)]

    def inprocess_replica(self, replica_id: str | None = None) -> dict[str, Any]:
        """A ``replicas:`` entry starting the engine inside the gateway (``kind: inprocess``)."""
        return {"id": replica_id or self.name, "kind": "inprocess",
                "model": self.served_model_name,
                "vllm": self.vllm_settings().model_dump(exclude_defaults=True)}

    def remote_replica(self, host: str, replica_id: str | None = None) -> dict[str, Any]:
        """A ``replicas:`` entry for a server started with :meth:`command` on ``host``."""
        return {"id": replica_id or self.name, "url": f"http://{host}:{VLLM_PORT}",
                "model": self.served_model_name,
                "kv_events": {"endpoint": f"tcp://{host}:{KV_EVENTS_PORT}",
                              "replay_endpoint": f"tcp://{host}:{KV_REPLAY_PORT}",
                              "topic": KV_TOPIC}}

    def discovery_source(self, dns: str) -> dict[str, Any]:
        """A ``replicas_from:`` entry: every address of ``dns`` is a server of this profile."""
        return {"dns": dns, "port": VLLM_PORT, "model": self.served_model_name,
                "kv_events": {"port": KV_EVENTS_PORT, "replay_port": KV_REPLAY_PORT,
                              "topic": KV_TOPIC}}

    def plan_input(self) -> PlanInput:
        return PlanInput(tensor_parallel_size=self.tensor_parallel_size,
                         kv_cache_dtype=self.kv_cache_dtype or "auto",
                         weight_dtype=self.quantization or "auto",
                         gpu_memory_gib=self.gpu_memory_gib,
                         gpu_memory_utilization=self.gpu_memory_utilization,
                         max_model_len=self.max_model_len)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "hf_repo": self.hf_repo,
                "gpus": self.gpus, "command": self.command(),
                "kv_events_config": self.kv_events_config(),
                "inprocess_replica": self.inprocess_replica(),
                "remote_replica": self.remote_replica("HOST"),
                "discovery_source": self.discovery_source("NAME")}


QWEN_72B = "Qwen/Qwen2.5-72B-Instruct"
SERVED = "qwen2.5-72b-instruct"

PROFILES: tuple[Profile, ...] = (
    Profile("qwen2.5-72b-tp4", "Qwen2.5-72B-Instruct in bf16 on 4 GPUs", QWEN_72B, SERVED,
            tensor_parallel_size=4),
    Profile("qwen2.5-72b-tp4-fp8", "Qwen2.5-72B-Instruct, fp8 weights and KV cache, 4 GPUs",
            QWEN_72B, SERVED, tensor_parallel_size=4, kv_cache_dtype="fp8",
            quantization="fp8"),
    Profile("qwen2.5-72b-awq-tp2-int8kv",
            "Qwen2.5-72B-Instruct-AWQ (4-bit weights), INT8 KV cache, 2 GPUs",
            "Qwen/Qwen2.5-72B-Instruct-AWQ", SERVED, tensor_parallel_size=2,
            kv_cache_dtype="int8_per_token_head", quantization="awq"),
)


class UnknownProfile(KeyError):
    def __str__(self) -> str:
        return (f"unknown profile {self.args[0]!r}: use one of "
                + ", ".join(p.name for p in PROFILES))


def get_profile(name: str) -> Profile:
    for profile in PROFILES:
        if profile.name == name:
            return profile
    raise UnknownProfile(name)
