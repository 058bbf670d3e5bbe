"""Capacity what-ifs from a deployment's own traffic: replay a recorded trace.

``workload`` reads traces (``gateway.trace``'s lines or a public Mooncake
trace) into arrivals and synthetic prompts that share what the recorded ones
shared; ``fleet`` replays them through the gateway's own policy onto N of the
simulator's engines in simulated time; ``outcome`` is what one replay
measured; ``search`` finds the smallest N that meets a TTFT target;
``capacity`` turns a block count, a launch profile or a plan into KV blocks;
``fit`` fits the latency model from live replicas' metrics; ``report`` prints
and plots; ``cli`` and ``fit_cli`` are ``prefixgate replay`` and
``prefixgate fit``. Like the KV tools, this package never imports the request
path, the HTTP face or the fleet.
"""
