"""The control loop: observe -> decide -> act -> record, one thread (`tick.Loop`).

`observe` and `health` make one typed `types.Observation` per tick; `decide` runs every pure
policy in one batch (`types.Decision`); `act/` applies each plan item through the adapter of
the system it changes; `record`, `tick_metrics` and `job_metrics` write events, the policies'
stored state and metrics; `tick` is the `Loop` (its thread and liveness); `guards` are the
operators' pause, pins and cordons. External systems are reached only through
`controlplane.adapters`.
"""

from controlplane.loop.tick import Adapters, Hooks, Loop

__all__ = ["Adapters", "Hooks", "Loop"]
