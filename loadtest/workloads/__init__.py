"""Seeded, deterministic workloads: conversations with arrival times (see ``base``)."""
