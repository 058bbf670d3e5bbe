"""Helpers shared by tests: free ports, simulated replicas as subprocesses."""
