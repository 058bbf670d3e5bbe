"""``prefixgate serve``: the gateway in front of vLLM replicas, or of embedded ones.

``main(argv)`` reads the flags (``build_parser``) over the settings file and
the environment (``gateway.config``), checks what would stop start-up before
anything starts (a tokenizer folder that is not one, a port in use), starts
the embedded replicas when none are configured (``gateway.replicas.embedded``),
builds the app (``create_app``) and runs the HTTP server until SIGTERM; with
more than one worker (``--workers``), supervises the processes that do
(``gateway.server.workers``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from engine.chat_template import chat_template_option
from engine.cli_args import CommandParser
from engine.spawning import exit_on_signal
from gateway.auth.keys import exposure_warning
from gateway.config import (
    ConfigError,
    Settings,
    TimeoutSettings,
    load_settings,
    parse_replica_arg,
    parse_source_arg,
)
from gateway.lint.people import names_notice, unchecked_scripts
from gateway.ops.block_table import report_block_table, report_relay
from gateway.prompt.tokenizer_source import configured_folder_problem
from gateway.replicas.embedded import EmbeddedUnavailable, embedded_replicas
from gateway.server.app import create_app
from gateway.server.http import bind_all, serve_app
from gateway.server.listen import ListenError, bind_listener
from gateway.server.workers import resolve_workers, run_workers


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="prefixgate serve",
                      description="Run the prefix-cache-aware OpenAI gateway.")
    p.add_argument("--config", help="YAML settings file (also PREFIXGATE_CONFIG)")
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8000)")
    p.add_argument("--replica", action="append", default=[], metavar="[ID=]URL",
                   help="a vLLM replica's base URL; repeat for several")
    p.add_argument("--replicas-from", action="append", default=[],
                   metavar="NAME:PORT[,key=value]",
                   help="every address of a DNS name (a headless Service) is a replica, "
                        "re-resolved every health interval; keys kv_port, kv_replay_port, "
                        "kv_topic, id_prefix, scheme, drain_seconds; repeat for several")
    p.add_argument("--replica-api-key", metavar="KEY",
                   help="the key the replicas' vLLM was started with (--api-key), sent to each "
                        "replica without an api_key of its own (better in the environment: "
                        "PREFIXGATE_REPLICA_API_KEY)")
    p.add_argument("--model", help="served model name of the --replica replicas")
    p.add_argument("--tokenizer", help="Hugging Face tokenizer folder for --model (without "
                   "--model: for the one model the replicas serve)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="the --chat-template the replicas run with (a file, or the template), "
                        "for --model, or without --model for the one model they serve "
                        "(default: the tokenizer folder's)")
    p.add_argument("--policy", help="routing policy (round_robin, least_load, ...)")
    p.add_argument("--workers", type=_workers_arg, metavar="N|auto",
                   help="serving processes on the one port, routing as one gateway "
                        "(default auto: half the usable cores, 1 on a 2-core machine)")
    p.add_argument("--max-body-bytes", type=int,
                   help="largest request body accepted; larger ones get 413 (default 8 MiB)")
    p.add_argument("--allowed-origins", type=_json_list, metavar="JSON",
                   help='origins browsers may call from (CORS), as vLLM\'s: \'["*"]\' for '
                        "any (default: none)")
    p.add_argument("--allow-credentials", action="store_true", default=None,
                   help="CORS: let browsers send credentials")
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--api-keys", metavar="FILE",
                   help="YAML file of client keys, tenants and limits (default: no client "
                        "authentication; see README, Security)")
    p.add_argument("--access-log", action="store_true", default=None,
                   help="one JSON line per request on the log")
    p.add_argument("--redis-url", metavar="URL",
                   help="share routing state with the other gateway instances through this "
                        "Redis (redis://[:PASSWORD@]HOST:PORT/DB, rediss:// for TLS; also "
                        "PREFIXGATE_REDIS_URL); default: none")
    p.add_argument("--redis-key-prefix", metavar="PREFIX",
                   help="prefix of this deployment's Redis keys (default prefixgate:)")
    p.add_argument("--embedded", choices=("vllm-cpu", "sim"),
                   help="with no replica configured: start real vLLM-on-CPU replicas "
                        "(default) or simulated ones (no install)")
    p.add_argument("--embedded-replicas", type=int,
                   help="with no replica configured: how many replicas to start (default 2)")
    return p


def _workers_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or auto") from None


def _json_list(text: str) -> list[str]:
    """vLLM's form of a list flag: a JSON list of strings (``'["*"]'``)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of strings, "
                                         'e.g. \'["https://app.example.com"]\'')
    return value


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"host": args.host, "port": args.port, "policy": args.policy,
                           "workers": args.workers,
                           "max_body_bytes": args.max_body_bytes, "log_level": args.log_level,
                           "access_log": args.access_log, "api_keys": args.api_keys,
                           "redis_url": args.redis_url,
                           "redis_key_prefix": args.redis_key_prefix,
                           "allowed_origins": args.allowed_origins,
                           "allow_credentials": args.allow_credentials,
                           "replica_api_key": args.replica_api_key}
    if args.replica:
        out["replicas"] = [parse_replica_arg(r, args.model) for r in args.replica]
    if args.replicas_from:
        out["replicas_from"] = [parse_source_arg(r, args.model) for r in args.replicas_from]
    if args.model:
        out["models"] = [{"name": args.model, "tokenizer": args.tokenizer,
                          "chat_template": args.chat_template}]
    else:
        out["tokenizer"] = args.tokenizer
        out["chat_template"] = args.chat_template
    return out


def _with_embedded(settings: Settings, args: argparse.Namespace,
                   stack: contextlib.ExitStack) -> Settings:
    """Start the embedded replicas and point the settings at them."""
    update: dict[str, Any] = {}
    if args.embedded:
        update["kind"] = args.embedded
    if args.embedded_replicas:
        update["replicas"] = args.embedded_replicas
    cfg = settings.embedded.model_copy(update=update)
    tokenizer = next((m.tokenizer for m in settings.models if m.name == cfg.served_name()),
                     None) or settings.tokenizer
    replicas, models = stack.enter_context(embedded_replicas(cfg, tokenizer))
    names = {m["name"] for m in models}
    return Settings.model_validate({
        **settings.model_dump(exclude={"replicas", "models", "timeouts"}),
        "replicas": replicas,
        "models": [m.model_dump() for m in settings.models if m.name not in names] + models,
        "timeouts": embedded_timeouts(settings.timeouts, cfg.kind).model_dump(),
    })


EMBEDDED_CPU_FIRST_BYTE = 120.0
"""The embedded vLLM-on-CPU replicas' first-byte timeout, unless one is set: a cold CPU
engine's first long prompt, on a small machine busy with both engines, has taken more
than the 30 s default (a 504 for the demo's first request)."""


def embedded_timeouts(timeouts: TimeoutSettings, kind: str) -> TimeoutSettings:
    """The timeouts in front of embedded replicas of ``kind``: the configured ones, and
    for vLLM on CPU a longer first byte unless ``timeouts.first_byte`` was set."""
    if kind != "vllm-cpu" or "first_byte" in timeouts.model_fields_set:
        return timeouts
    return TimeoutSettings.model_validate({**timeouts.model_dump(exclude_unset=True),
                                           "first_byte": EMBEDDED_CPU_FIRST_BYTE})


def _configuration_problem(settings: Settings) -> str | None:
    """What stops start-up before anything starts: a configured tokenizer folder
    that is not one, a port that cannot be listened on (checked before the
    embedded replicas spend a minute starting)."""
    for folder in filter(None, [settings.tokenizer, *(m.tokenizer for m in settings.models)]):
        problem = configured_folder_problem(folder)
        if problem:
            return f"{problem} (--tokenizer / models[].tokenizer)"
    for value in filter(None, [settings.chat_template, *(m.chat_template for m in settings.models)]):
        try:
            chat_template_option(value)
        except (OSError, ValueError) as exc:
            return f"{exc} (--chat-template / models[].chat_template)"
    for port in (settings.port, settings.health_port):
        if port is None:
            continue
        try:
            bind_listener(settings.host, port).close()
        except ListenError as exc:
            return str(exc)
    return None


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config, overrides(args))
    except ConfigError as exc:
        print(f"prefixgate: {exc}", file=sys.stderr)
        return 2
    problem = _configuration_problem(settings)
    if problem:
        print(f"prefixgate: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe otherwise
    exposed = exposure_warning(settings.host, settings.api_keys)
    if exposed:
        logging.getLogger("prefixgate").warning(exposed)
    if not settings.api_keys and (settings.replica_api_key
                                  or any(r.api_key for r in settings.replicas)
                                  or any(s.api_key for s in settings.replicas_from)):
        logging.getLogger("prefixgate").warning(
            "The replicas' API key is sent for every client, and the gateway asks clients "
            "for none: whoever reaches the gateway uses key-protected replicas. Give clients "
            "keys of their own (--api-keys FILE; README, Security)")
    if not settings.access_log:
        logging.getLogger("prefixgate.access").setLevel(logging.WARNING)
    report_block_table()  # a warning when the pure-Python fallback serves
    report_relay()  # the same for a stream's per-chunk relay
    unchecked = names_notice(unchecked_scripts()) if settings.lint.enabled else None
    if unchecked:  # the names extra is missing: said once, here and in the linter's output
        logging.getLogger("prefixgate").warning("prompt linter: %s", unchecked)
    # A SIGTERM before the server runs exits through the ExitStack, which stops the
    # embedded replicas: while they start (a minute for vLLM on CPU) too, where its
    # default action ended this process alone and left them running. Once the server
    # runs, it drains on SIGTERM and returns (gateway.server.http).
    signal.signal(signal.SIGTERM, exit_on_signal)
    with contextlib.ExitStack() as stack:
        embedded = not settings.replicas and not settings.replicas_from
        if embedded:
            try:
                settings = _with_embedded(settings, args, stack)
            except EmbeddedUnavailable as exc:
                print(f"prefixgate: {exc}", file=sys.stderr)
                return 2
        try:
            workers = resolve_workers(settings, embedded=embedded)
            app = create_app(settings)  # a wrong policy fails here, before any worker starts
        except ValueError as exc:
            print(f"prefixgate: {exc}", file=sys.stderr)
            return 2
        if workers > 1:  # this process supervises; the workers serve (gateway.server.workers)
            return run_workers(settings, workers, bind_all(settings))
        serve_app(app, settings)
    return 0
