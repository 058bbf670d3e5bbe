"""Prometheus metrics of the simulated replica, named exactly as vLLM's.

Checked against ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) and
``vllm/config/cache.py`` (``CacheConfig.metrics_info``). Every series carries
``model_name`` (the served model name) and ``engine="0"``. Counters are
declared without the ``_total`` suffix, as vLLM does, so the client library
exposes ``vllm:prompt_tokens_total`` etc. Prefix-cache counters are in
tokens. Times are *modeled* seconds (see ``engine.sim.scheduler``), so a
``--time-scale 10`` run reports the latencies the model describes, not the
ten-times-shorter wall times.

Each app gets its own :class:`CollectorRegistry`; nothing is registered
globally, so several simulated replicas can live in one process (tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.sim.config import SimConfig
from engine.sim.request import EngineRequest

FINISH_REASONS = ("stop", "length", "abort", "error")

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's helper)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def cache_config_labels(config: SimConfig) -> dict[str, str]:
    """``CacheConfig.metrics_info()``: every field, stringified, in order."""
    fields: dict[str, object] = {
        "block_size": config.block_size,
        "gpu_memory_utilization": 0.9,
        "swap_space": 4,
        "cache_dtype": "auto",
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": "sha256",
        "cpu_offload_gb": 0,
        "calculate_kv_scales": False,
        "cpu_kvcache_space_bytes": None,
        "mamba_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "num_gpu_blocks": config.num_blocks,
        "num_cpu_blocks": None,
        "kv_sharing_fast_prefill": False,
        "kv_cache_memory_bytes": None,
        "kv_offloading_size": None,
        "kv_offloading_backend": None,
    }
    return {key: str(value) for key, value in fields.items()}


class SimMetrics:
    """vLLM's engine metrics in a private registry; implements ``EngineObserver``."""

    def __init__(self, config: SimConfig, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("model_name", "engine")
        values = (config.served_model_name, "0")
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, buckets: object) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)  # type: ignore[arg-type]

        length_buckets = build_1_2_5_buckets(config.max_model_len)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*values)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*values)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*values)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(*values)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*values)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*values)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*values)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*values)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=reg,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", length_buckets
        ).labels(*values)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            length_buckets,
        ).labels(*values)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        ).labels(*values)
        self.max_tokens_param = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            length_buckets,
        ).labels(*values)
        self.n_param = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)
        ).labels(*values)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(*values)
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TPOT_BUCKETS,
        ).labels(*values)
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TPOT_BUCKETS,
        ).labels(*values)
        self.request_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TPOT_BUCKETS,
        ).labels(*values)
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*values)
        cache_labels = cache_config_labels(config)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(cache_labels),
            registry=reg,
        ).labels(**cache_labels).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- EngineObserver -----------------------------------------------------

    def on_step(self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if scheduled_tokens:
            self.iteration_tokens.observe(scheduled_tokens)

    def on_admitted(
        self, request: EngineRequest, queried_tokens: int, hit_tokens: int, first_admission: bool
    ) -> None:
        # vLLM 0.32 keeps a preempted request's second look-up out of these two
        # counters (``PrefixCacheStats.record(preempted=True)`` counts it apart), so
        # a replica that preempts does not report its own recomputation as cache hits.
        if first_admission:
            self.prefix_queries.inc(queried_tokens)
            self.prefix_hits.inc(hit_tokens)
        if first_admission and request.first_scheduled_time is not None:
            self.queue_time.observe(max(request.first_scheduled_time - request.arrival_time, 0.0))

    def on_token(self, request: EngineRequest, now: float) -> None:
        self.generation_tokens.inc()
        if request.first_token_time == now and request.last_token_time is None:
            self.prompt_tokens.inc(request.num_prompt_tokens)
            self.ttft.observe(max(now - request.arrival_time, 0.0))
        elif request.last_token_time is not None:
            interval = max(now - request.last_token_time, 0.0)
            self.itl.observe(interval)
            self.tpot.observe(interval)

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None:
        self.success[reason if reason in self.success else "error"].inc()
        if reason == "abort":
            return
        outputs = request.num_output_tokens
        self.request_prompt_tokens.observe(request.num_prompt_tokens)
        self.request_generation_tokens.observe(outputs)
        self.max_tokens_param.observe(request.max_tokens)
        if request.index % max(request.n, 1) == 0:
            self.n_param.observe(request.n)
        self.e2e.observe(max(now - request.arrival_time, 0.0))
        scheduled = (
            request.first_scheduled_time if request.first_scheduled_time is not None else now
        )
        first = request.first_token_time if request.first_token_time is not None else now
        self.inference_time.observe(max(now - scheduled, 0.0))
        self.prefill_time.observe(max(first - scheduled, 0.0))
        self.decode_time.observe(max(now - first, 0.0))
        if outputs > 1:
            self.request_tpot.observe(max(now - first, 0.0) / (outputs - 1))

    def on_preempted(self, request: EngineRequest) -> None:
        self.preemptions.inc()
