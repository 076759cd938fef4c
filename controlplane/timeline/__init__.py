"""`rcp timeline`: replicas, GPUs, traffic and decisions over time, as a PNG.

Owns: ``series`` (pure: events + metric samples -> the series and markers to plot),
``metrics`` (Prometheus's query_range API), ``collect`` (events through the API, metrics
from Prometheus, what to note when they cannot be read) and ``draw`` (the PNG, matplotlib).
Must not: reach Ray or the store; the CLI and the demo hand it the SDK's event reader.
"""
