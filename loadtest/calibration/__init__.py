"""Calibrating the simulator against a real engine (``python -m loadtest.calibrate``).

``probes`` times one request (through ``loadtest.client``) and runs the probe
set, ``cpu`` reads how much of the engine's core others took meanwhile,
``points`` reduces the samples to medians, ``model`` fits the simulator's
latency model, ``compare`` scores a simulator against the real measurements,
``targets`` starts the servers, ``result`` and ``report`` hold and render the
outcome (its tables through ``loadtest.markdown``). ``loadtest.calibrate``
wires them together.
"""
