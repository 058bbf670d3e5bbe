"""What operators read: the metrics (one registry), the ops view and the
dashboard, the event-loop and GC probes.
"""
