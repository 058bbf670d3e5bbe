"""CPU time by section of a prefixgate gateway's work (``python -m loadtest overhead
--cpu-sections``; :mod:`loadtest.sections` reads what this writes).

This folder goes first on a gateway's ``PYTHONPATH``, so Python imports this module at
start-up. With ``PREFIXGATE_CPU_SECTIONS`` set to a folder, each module named in
``SECTIONS`` is wrapped as it is imported (an import hook on exactly those modules):
each named function adds the CPU time of the thread that runs it (``thread_time``) to its
section, less the time of the sections it calls (each nanosecond counted once). On
SIGUSR2 the process writes its totals, with its own CPU time, to ``FOLDER/PID.json``;
the file is first written when the hook is installed, which is how the reader knows the
process may be signalled. Without the variable nothing happens. A function that is not
there (another checkout, renamed) is skipped and listed in the file as missing.

What it costs: two ``thread_time`` calls a wrapped call (a system call each, 0.9 us
here), some 20 wrapped calls a request: about 40 us a request, in the figures. Nothing here imports
the gateway: a module is wrapped only when the gateway imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

SECTIONS: tuple[tuple[str, str, str], ...] = (
    # (section, module, function or Class.method); synchronous functions only
    ("parse", "gateway.request.exchange", "Exchange.parse"),
    ("render", "gateway.prompt.render", "PromptHasher.plan"),
    ("tokenize", "gateway.prompt.render", "PromptHasher.tokenize_missing"),
    ("tokenize", "gateway.prompt.render", "PromptHasher._tokenize_pieces"),
    ("block chain", "gateway.prompt.render", "PromptHasher.finish"),
    ("prompt memo learning", "gateway.prompt.render", "PromptHasher._learn"),
    ("decide", "gateway.request.decider", "Decider.decide"),
    ("policy bookkeeping", "gateway.request.decider", "Decider.on_sent"),
    ("policy bookkeeping", "gateway.request.decider", "Decider.on_first_byte"),
    ("policy bookkeeping", "gateway.request.decider", "Decider.on_failed"),
    ("first byte", "gateway.request.proxy", "Proxy._answer"),
    ("record", "gateway.request.recorder", "Recorder.on_complete"),
    ("lint, on the loop", "gateway.server.live_lint", "LiveLint.on_decided"),
    ("lint, on the loop", "gateway.server.live_lint", "LiveLint.take"),
    ("lint, on the loop", "gateway.server.lint_process", "LintProcess.on_decided"),
    ("lint, on the loop", "gateway.server.lint_process", "LintProcess.take"),
    ("lint, on the loop", "gateway.server.lint_process", "LintProcess._readable"),
    # off the loop: the serving process's thread (lint.worker: thread), or the linter's
    # own process (its file is read with the others of the tree)
    ("lint, off the loop", "gateway.lint.service", "LintService.check_now"),
    ("lint, off the loop", "gateway.lint.service", "LintService.examine"),
    ("KV events: decode", "engine.kv_events", "decode_payload"),
    ("KV events: apply", "gateway.replicas.kv_feed", "KVFeed._on_batch"),
    ("siblings' batches: decode", "gateway.fleet.codec", "decode_batch"),
    ("siblings' batches: apply", "gateway.fleet.shared", "SharedRouting._apply_batch"),
)


def _install(folder: str) -> None:
    import functools
    import importlib.abc
    import inspect
    import json
    import signal
    import sys
    import threading
    import time

    thread_time = time.thread_time_ns
    local = threading.local()
    accounts: list[dict[str, list[int]]] = []  # one per thread, appended once each
    missing: list[str] = []
    by_module: dict[str, list[tuple[str, str]]] = {}
    for section, module, name in SECTIONS:
        by_module.setdefault(module, []).append((section, name))
    written = [0]

    def account() -> dict[str, list[int]]:
        acc: dict[str, list[int]] = {}
        local.acc, local.stack = acc, []
        accounts.append(acc)
        return acc

    def timed(fn: Callable[..., Any], section: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            acc = getattr(local, "acc", None) or account()
            stack = local.stack
            stack.append(0)
            start = thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = thread_time() - start
                own = elapsed - stack.pop()
                if stack:
                    stack[-1] += elapsed
                entry = acc.get(section)
                if entry is None:
                    entry = acc[section] = [0, 0]
                entry[0] += own
                entry[1] += 1
        return functools.update_wrapper(wrapper, fn)

    def wrap_module(module: ModuleType) -> None:
        for section, name in by_module.get(module.__name__, ()):
            owner_name, _, attr = name.rpartition(".")
            owner = getattr(module, owner_name, None) if owner_name else module
            fn = vars(owner).get(attr) if owner is not None else None
            if fn is None or inspect.iscoroutinefunction(fn) or not callable(fn):
                missing.append(f"{module.__name__}.{name}")
                continue
            setattr(owner, attr, timed(fn, section))

    def dump(*_: object) -> None:
        totals: dict[str, list[int]] = {}
        for acc in accounts:
            for section, (ns, calls) in list(acc.items()):
                entry = totals.setdefault(section, [0, 0])
                entry[0] += ns
                entry[1] += calls
        path = os.path.join(folder, f"{os.getpid()}.json")
        written[0] += 1
        try:
            with open(path + ".tmp", "w") as out:
                json.dump({"pid": os.getpid(), "seq": written[0],
                           "process_ns": time.process_time_ns(), "missing": missing,
                           "sections": totals}, out)
            os.replace(path + ".tmp", path)
        except OSError as exc:  # the gateway goes on; the reader finds no file
            print(f"cpu sections: cannot write {path}: {exc}", file=sys.stderr)

    class Wrapping(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Sequence[str] | None,
                      target: ModuleType | None = None) -> ModuleSpec | None:
            if name not in by_module:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            execute = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                execute(module)
                wrap_module(module)
                if written[0] == 0:  # the reader signals only a process that wrote
                    dump()

            loader.exec_module = exec_module  # type: ignore[method-assign]  # its own loader
            return spec

    signal.signal(signal.SIGUSR2, dump)  # at start-up, on the main thread
    sys.meta_path.insert(0, Wrapping())


if os.environ.get("PREFIXGATE_CPU_SECTIONS"):
    _install(os.environ["PREFIXGATE_CPU_SECTIONS"])
