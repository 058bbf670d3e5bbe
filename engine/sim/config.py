"""Settings of one simulated vLLM replica.

Everything the simulator needs is in one frozen value, :class:`SimConfig`,
built by the CLI (``engine.sim.cli``) or directly by tests. It is validated on
construction so a bad flag fails at start-up, not on the first request.

Latency model (all in *modeled* seconds; see ``engine.sim.scheduler``)::

    step = step_overhead_s
         + prefill_tokens_in_step * prefill_per_token_s
         + sampling_seqs_in_step  * decode_per_seq_s

(``sampling_seqs_in_step``: the requests that sample a token at its end, every
decoding one and every prompt whose last chunk the step computes.)

``time_scale`` divides every sleep: with ``time_scale=10`` the replica runs
ten times faster than the model says, while its metrics still report modeled
seconds. The defaults are rough numbers for a small model on one GPU and are
meant to be calibrated against vLLM-on-CPU later.

Output length: without ``ignore_eos`` a request "emits EOS" after a length
drawn from ``[output_len_min, output_len_max]`` by a RNG seeded from the
request's ``seed`` (or from the prompt), so the same request always gets the
same answer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = "sim-model"
    tokenizer: str | None = None
    model_root: str | None = None
    """What ``/v1/models`` reports as ``root`` (vLLM: the model's path or hub
    name); default the tokenizer folder. A path that does not exist on the
    gateway's host stands for a replica on another machine."""
    """A Hugging Face tokenizer folder; ``None`` selects the byte-level fallback."""

    block_size: int = 16
    num_blocks: int = 2048
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    step_overhead_s: float = 0.005
    prefill_per_token_s: float = 0.0001
    decode_per_seq_s: float = 0.0002
    time_scale: float = 1.0

    seed: int = 0
    output_len_min: int = 16
    output_len_max: int = 256

    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    kv_events_topic: str = "kv"
    kv_events_host: str = "127.0.0.1"
    kv_events_buffer_steps: int = 10_000

    render_in_thread_chars: int = 2048
    """Prompts with more characters than this are rendered/tokenized in a
    worker thread so a long prompt cannot stall the event loop."""

    log_level: str = "info"
    version: str = "0.32.0"

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "output_len_min": self.output_len_min,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.output_len_max < self.output_len_min:
            raise ValueError("output_len_max must be >= output_len_min")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        for name, seconds in (
            ("step_overhead_s", self.step_overhead_s),
            ("prefill_per_token_s", self.prefill_per_token_s),
            ("decode_per_seq_s", self.decode_per_seq_s),
        ):
            if seconds < 0:
                raise ValueError(f"{name} must not be negative")
        if self.kv_events_replay_port is not None and self.kv_events_port is None:
            raise ValueError("--kv-events-replay-port needs --kv-events-port")
        # vLLM refuses to start when one max-length request cannot fit in the
        # KV cache; the scheduler relies on the same guarantee to make progress.
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"num_blocks * block_size ({self.num_blocks * self.block_size} tokens) "
                f"must hold max_model_len ({self.max_model_len})"
            )

    @property
    def model_path(self) -> str:
        """What vLLM would report as the model's path (``root`` in /v1/models)."""
        return self.model_root or self.tokenizer or self.served_model_name
