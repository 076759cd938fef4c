"""The control loop: observe -> decide -> act -> record, one thread (`tick.Loop`).

`observe` and `health` make one `types.Observation` per tick; `decide` runs every pure policy
in one batch (`types.Decision`); `act/` applies each plan item; `record`, `tick_metrics` and
`job_metrics` write events, stored state and metrics; `guards` are the operators' pause, pins
and cordons. External systems are reached only through `controlplane.adapters`.
"""

from controlplane.loop.tick import Adapters, Hooks, Loop

__all__ = ["Adapters", "Hooks", "Loop"]
