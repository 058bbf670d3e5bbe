"""``prefixgate serve --workers N``: N serving processes on one port, routing as one.

One Python event loop is a ceiling: past one core's worth of parsing,
rendering and relaying, requests queue for it (``docs/benchmarks/overhead.md``).
With ``workers`` above 1 the ``serve`` process becomes a supervisor:

* **One port.** It binds the listening socket (and the probe port) once and
  every worker inherits it. A worker accepts a waiting connection only while
  it holds no more connections than the least-loaded sibling (a table of
  counts in shared memory, ``gateway.server.balance``), so a client pool or a
  load balancer opening many connections at once spreads over the workers
  instead of landing on whichever loop woke first. (``SO_REUSEPORT`` would
  give each worker its own queue, hashed by address: a worker that dies
  takes the connections waiting in its queue with it, and a busy one gets
  its share all the same.)
* **One gateway.** The workers share routing state through the supervisor's
  hub (``gateway.fleet.local``), as instances do through Redis: what a
  worker's policy learns from a first byte reaches the others within about a
  millisecond, and each adds the others' in-flight requests to the load it
  sees. With ``redis_url`` set, they share it through Redis instead, each a
  fleet instance (per-key limits too: ``gateway.auth.shared``), and the hub
  only merges their metrics. In precise mode each worker reads the replicas'
  KV events itself, so every worker's block index is the replicas' own.
* **One /metrics.** Whichever worker a scrape lands on asks the hub for every
  worker's series (``gateway.ops.worker_metrics``: a ``worker`` label each).
* **Lifecycle.** A worker that dies is started again (after 1 s, doubling to
  30 s while it keeps dying young) and learns what the others know first;
  SIGTERM or SIGINT reaches every worker once, and each drains
  (``drain_seconds``). Workers run in their own process group (a terminal's
  Ctrl-C reaches the supervisor only) and get SIGTERM if the supervisor dies
  (``PR_SET_PDEATHSIG``).

``workers: auto`` (the default) is half the cores this process may use (its
CPU affinity and its cgroup's CPU quota), at least 1: a worker's tokenizing
and linting threads need room beside its loop. It is 1 beside the embedded
replicas (they take the machine's cores), and 1 when the settings hold state
a second process would not share; asking for more than one then is an error
that says why (:func:`single_process_reasons`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence

from gateway.config import Settings
from gateway.fleet.local import Hub
from gateway.server.balance import ABSENT, ConnectionTable

log = logging.getLogger("prefixgate.workers")

MAX_RESTART_SECONDS = 30.0
STOP_GRACE_SECONDS = 30.0
"""Past ``drain_seconds``, how long a stopping worker has before it is killed."""


def available_cores(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container limited to 2 CPUs on a 64-core node has 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(cgroup_root, "cpu.max"), encoding="ascii") as handle:
            quota, period = handle.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    return max(1, cores)


def single_process_reasons(settings: Settings) -> list[str]:
    """What in the settings a second worker process could not share."""
    reasons = []
    if any(r.kind == "inprocess" for r in settings.replicas):
        reasons.append("an inprocess replica lives in the gateway's own process")
    if settings.trace.path is not None:
        reasons.append("the trace file (trace.path) has one writer")
    if settings.api_keys is not None and settings.redis_url is None:
        reasons.append("client keys' limits are shared between processes through Redis: "
                       "set redis_url")
    return reasons


def resolve_workers(settings: Settings, cores: int | None = None,
                    embedded: bool = False) -> int:
    """How many workers the settings ask for (``auto`` resolved: 1 beside ``embedded``
    replicas, which take this machine's cores); ValueError when more than one is asked
    for and cannot be."""
    reasons = single_process_reasons(settings)
    if settings.workers == "auto":
        if reasons or embedded:
            return 1
        return max(1, (cores or available_cores()) // 2)
    if settings.workers > 1 and reasons:
        raise ValueError(f"workers: {settings.workers} needs one process here: "
                         + "; ".join(reasons))
    return settings.workers


def run_workers(settings: Settings, count: int, sockets: Sequence[socket.socket]) -> int:
    """Supervise ``count`` workers serving ``sockets`` until SIGTERM/SIGINT; 0 after a
    drain."""
    for sock in sockets:
        sock.set_inheritable(True)
    with tempfile.TemporaryDirectory(prefix="prefixgate-workers-") as folder:
        return asyncio.run(_Supervisor(settings, count, sockets,
                                       os.path.join(folder, "hub.sock"),
                                       os.path.join(folder, "connections")).run())


class _Supervisor:
    def __init__(self, settings: Settings, count: int, sockets: Sequence[socket.socket],
                 hub_path: str, table_path: str) -> None:
        self.settings = settings
        self.count = count
        self.table_path = table_path
        self.table = ConnectionTable.create(table_path, count)
        self.fds = [sock.fileno() for sock in sockets]
        self.hub_path = hub_path
        self.stopping = asyncio.Event()
        self.procs: dict[int, asyncio.subprocess.Process] = {}

    async def run(self) -> int:
        hub = Hub(self.hub_path)
        await hub.start()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        log.info("%d workers on one port (supervisor pid %d)", self.count, os.getpid())
        keepers = [asyncio.create_task(self._keep(index)) for index in range(self.count)]
        await self.stopping.wait()
        log.info("stopping: every worker drains")
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        grace = self.settings.drain_seconds + STOP_GRACE_SECONDS
        _, late = await asyncio.wait(keepers, timeout=grace)
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.kill()
        await asyncio.gather(*late, return_exceptions=True)
        await hub.aclose()
        return 0

    async def _keep(self, index: int) -> None:
        """Worker ``index``, started again when it dies (not when the gateway stops)."""
        loop = asyncio.get_running_loop()
        delay = 1.0
        while not self.stopping.is_set():
            started = loop.time()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.server.worker", str(index), self.hub_path,
                ",".join(map(str, self.fds)), f"{self.table_path}:{self.count}",
                stdin=asyncio.subprocess.PIPE,
                pass_fds=self.fds, start_new_session=True)
            self.procs[index] = proc
            assert proc.stdin is not None
            proc.stdin.write(pickle.dumps(self.settings))  # the settings, secrets never on disk
            with contextlib.suppress(ConnectionError):
                await proc.stdin.drain()
            proc.stdin.close()
            code = await proc.wait()
            self.table[index] = ABSENT  # its siblings take every connection meanwhile
            if self.stopping.is_set():
                return
            delay = 1.0 if loop.time() - started > 60 else delay
            log.error("worker %d (pid %d) exited with status %s: starting it again in %.0f s",
                      index, proc.pid, code, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            delay = min(delay * 2, MAX_RESTART_SECONDS)
