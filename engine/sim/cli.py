"""``prefixgate sim`` / ``python -m engine.sim``: run one simulated vLLM replica.

Flags mirror vLLM's where vLLM has one (``--served-model-name``,
``--block-size``, ``--max-model-len``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--seed``); ``--num-blocks`` plays the part of
``--num-gpu-blocks-override``. The latency model and ``--time-scale`` are
described in ``engine.sim.scheduler``. ``--latency-model FILE`` (``prefixgate
fit``'s output, ``engine.sim.latency``) sets the three latency parameters, the
block size, the capacity and the scheduler limits at once; a flag given beside
it still wins.
"""

from __future__ import annotations

import argparse
import logging

import uvicorn

from engine.cli_args import CommandParser
from engine.sim.config import SimConfig
from engine.sim.faults import add_fault_arguments, fault_plan, with_faults
from engine.sim.latency import LatencyModel, LatencyModelError
from engine.sim.server import create_sim_app

_DEFAULTS = SimConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="prefixgate sim",
        description="A vLLM-compatible OpenAI server with a simulated engine and a real prefix cache.",
    )
    add = parser.add_argument
    add("--host", default=_DEFAULTS.host, help="listen address (default %(default)s)")
    add("--port", type=int, default=_DEFAULTS.port, help="listen port (default %(default)s)")
    add("--served-model-name", default=_DEFAULTS.served_model_name,
        help="the model name it answers to (default %(default)s)")
    add(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer folder (default: byte-level tokens)",
    )
    add("--model-root", default=None,
        help="the model path /v1/models reports as root (default: the tokenizer folder)")
    add("--block-size", type=int, default=_DEFAULTS.block_size,
        help="KV block size in tokens (default %(default)s)")
    add("--num-blocks", type=int, default=_DEFAULTS.num_blocks, help="KV-cache capacity in blocks")
    add("--max-model-len", type=int, default=_DEFAULTS.max_model_len,
        help="longest prompt plus output, in tokens (default %(default)s)")
    add("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs,
        help="requests running at once; more wait (default %(default)s)")
    add("--max-num-batched-tokens", type=int, default=_DEFAULTS.max_num_batched_tokens,
        help="tokens computed per engine step, chunked prefill (default %(default)s)")
    add(
        "--step-overhead",
        type=float,
        default=_DEFAULTS.step_overhead_s,
        help="seconds per engine step",
    )
    add(
        "--prefill-per-token",
        type=float,
        default=_DEFAULTS.prefill_per_token_s,
        help="seconds per prefill token",
    )
    add(
        "--decode-per-seq",
        type=float,
        default=_DEFAULTS.decode_per_seq_s,
        help="seconds per sequence sampled in a step (each decoding one, each prompt the "
             "step finishes)",
    )
    add("--latency-model", metavar="FILE",
        help="a fitted latency model (prefixgate fit): its step parameters, block size, "
             "blocks and limits, unless given by their own flags")
    add(
        "--time-scale",
        type=float,
        default=_DEFAULTS.time_scale,
        help="run this many times faster than modeled",
    )
    add("--output-len-min", type=int, default=_DEFAULTS.output_len_min,
        help="shortest natural answer, in tokens, before EOS (default %(default)s)")
    add("--output-len-max", type=int, default=_DEFAULTS.output_len_max,
        help="longest natural answer, in tokens (default %(default)s)")
    add("--seed", type=int, default=_DEFAULTS.seed,
        help="the answers' seed when a request gives none (default %(default)s)")
    add(
        "--kv-events-port",
        type=int,
        default=None,
        help="publish KV-cache events on this ZMQ PUB port",
    )
    add(
        "--kv-events-replay-port",
        type=int,
        default=None,
        help="serve missed KV events on this ROUTER port",
    )
    add("--kv-events-topic", default=_DEFAULTS.kv_events_topic,
        help="topic frame of the KV events (default %(default)s)")
    add("--kv-events-host", default=_DEFAULTS.kv_events_host,
        help="address the KV-event sockets bind (default %(default)s)")
    add(
        "--log-level",
        default=_DEFAULTS.log_level,
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default %(default)s)",
    )
    add_fault_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        tokenizer=args.tokenizer,
        model_root=args.model_root,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        step_overhead_s=args.step_overhead,
        prefill_per_token_s=args.prefill_per_token,
        decode_per_seq_s=args.decode_per_seq,
        time_scale=args.time_scale,
        seed=args.seed,
        output_len_min=args.output_len_min,
        output_len_max=args.output_len_max,
        kv_events_port=args.kv_events_port,
        kv_events_replay_port=args.kv_events_replay_port,
        kv_events_topic=args.kv_events_topic,
        kv_events_host=args.kv_events_host,
        log_level=args.log_level,
    )


def model_defaults(model: LatencyModel) -> dict[str, object]:
    """The flags' defaults a latency-model file stands for."""
    params = model.params
    return {"step_overhead": params.step_overhead_s,
            "prefill_per_token": params.prefill_per_token_s,
            "decode_per_seq": params.decode_per_seq_s, "block_size": model.block_size,
            "num_blocks": model.num_blocks, "max_num_seqs": model.max_num_seqs,
            "max_num_batched_tokens": model.max_num_batched_tokens}


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The flags, with ``--latency-model`` setting the defaults of the ones it covers."""
    args = parser.parse_args(argv)
    if args.latency_model:
        try:
            model = LatencyModel.read(args.latency_model)
        except LatencyModelError as exc:
            parser.error(str(exc))
        parser.set_defaults(**model_defaults(model))
        args = parser.parse_args(argv)
        # A model of long prompts needs room for them (vLLM derives it the same way).
        args.max_model_len = min(args.max_model_len, args.num_blocks * args.block_size)
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        with_faults(create_sim_app(config), fault_plan(args)),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=config.log_level == "debug",
        timeout_graceful_shutdown=5,
    )
    return 0
