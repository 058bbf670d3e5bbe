"""Client API keys: tenants, per-key limits, per-tenant cache salts, and
the limits shared through Redis.
"""
