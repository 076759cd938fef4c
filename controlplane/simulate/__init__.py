"""The fleet simulator (`rcp simulate`, bench/bench_fleet.py): the real policies at fleet
scale, over simulated days, against the schemes teams run today.

The rooms: `scenario` (what is simulated, its defaults and validation), `checks` (reading
scenario and trace files: size, types, finite numbers, by field path), `trace` (everything
random, drawn once from the seed), `engine` (the event queue), `nodes` (a node and a provider's
terms), `training` (a job's work, restore and checkpoint arithmetic), `world` (nodes, jobs, the
external pool's providers and their spot reclaims, GPU bookkeeping), `serving` (Serve's
replicas and the loop's `ServePlane` on them), `ours` (our scheme: the loop's decide phase and
its act stand-in), `recovery` (our scheme's restart in place and spare nodes after failures), `baselines` (static split, evict-first, time-of-day lending), `run` (one run
per scheme), `report` (table, JSON, goals, markdown, PNG). docs/simulator.md says what is
modelled and what is not.

Must not: import Ray, or re-implement a policy: our scheme calls the policies the control
loop calls (`controlplane.loop.decide`).
"""
