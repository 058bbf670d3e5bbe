"""Which block table the prefix indexes run on, told where an operator looks.

``policies.block_table`` builds the compiled table (``policies._blocktable``,
compiled from C when prefixgate is installed) or, where it was not built (no
C compiler at install time), falls back to the pure-Python table: the same
decisions, some 20x slower for a long prompt and about 4x the memory per
indexed block. The policies only name the backend (``default_backend``);
the gateway reports it:

* at start-up: one log line, a WARNING for the fallback (``report_block_table``);
* in ``GET /ready``'s body: ``"block_table": "compiled"`` or ``"python"``;
* as ``prefixgate_block_table_info{backend}`` = 1 (``gateway.ops.metrics``).

The same install builds a poured stream's per-chunk work (``gateway._relay``,
``gateway.request.streaming.EventTap``); where it was not built its Python twin
serves, and the start-up log says so too (``report_relay``).
"""

from __future__ import annotations

import importlib.util
import logging

from policies.block_table import default_backend

log = logging.getLogger("prefixgate")

FALLBACK_WARNING = (
    "block table: python, the pure-Python fallback (policies._blocktable was not built when "
    "prefixgate was installed): prefix-aware routing decisions about 20x slower, about 4x "
    "the memory per indexed block. Reinstall where a C compiler is at hand "
    "(pip install prefixgate, or pip install -e . in a checkout).")


def block_table_backend() -> str:
    """``compiled`` or ``python``."""
    return default_backend()


def report_block_table() -> str:
    """Log which table serves (a warning for the fallback); returns its name."""
    backend = block_table_backend()
    if backend == "python":
        log.warning(FALLBACK_WARNING)
    else:
        log.info("block table: compiled (policies._blocktable)")
    return backend


RELAY_FALLBACK_WARNING = (
    "stream relay: python, the pure-Python fallback (gateway._relay was not built when "
    "prefixgate was installed): every relayed chunk of a stream costs more CPU. Reinstall "
    "where a C compiler is at hand (pip install prefixgate, or pip install -e . in a checkout).")


def report_relay() -> bool:
    """Log a warning when a poured stream's chunks go through the Python tap; True when the
    compiled one serves."""
    built = importlib.util.find_spec("gateway._relay") is not None
    if not built:
        log.warning(RELAY_FALLBACK_WARNING)
    return built
