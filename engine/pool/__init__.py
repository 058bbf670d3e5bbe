"""The replicas as a pool: health and circuit breakers, scraped metrics,
load and work in flight (leases, unconfirmed prefill), slow-replica detection,
DNS discovery.
"""
