"""Does a replay of recorded traffic predict real replicas? (issue 28's validation).

``python -m loadtest replay-check`` records a workload through the gateway
in front of two real vLLM-on-CPU replicas (``real``), fits the latency model
from those replicas' metrics, replays the recording on two simulated
replicas as recorded, at twice the rate and with half the KV blocks
(``scenarios``), runs the same what-ifs on the real replicas, and compares
(``verdict``), writing a results folder (``report``). ``cli`` is the command.
"""
