"""Bounded loads: no replica takes more than ``load_factor`` times its share.

From consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam,
SODA 2018): with ``total`` requests outstanding on ``n`` replicas, a replica
may take a request when its load after taking it is at most::

    ceil(load_factor * (total + 1) / n)

The least loaded replica always qualifies (its load is at most the mean), so
a request always has somewhere to go; rounding up lets small fleets at low
load keep their affinity. ``chwbl`` walks its hash ring for the first
replica within the bound; the cache-aware policy scores only the replicas
within it (``policies.cache_aware``).
"""

from __future__ import annotations

import math


def load_bound(total_load: int, replica_count: int, load_factor: float) -> int:
    """The most load a replica may carry after taking a request."""
    # Rounded first so 1.25 * 4 / 4 does not become 2.0000000000000004 -> 3.
    return math.ceil(round(load_factor * (total_load + 1) / replica_count, 9))
