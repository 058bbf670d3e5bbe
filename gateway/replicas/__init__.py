"""Which replicas there are at run time: configured, discovered
through DNS, embedded or in-process, and the KV events they publish.
"""
