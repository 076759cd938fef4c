"""Telemetry: per-node agents that sample GPUs, NVLink and InfiniBand and export them.

Owns: the sources behind one interface (`sources`: NVML, a dcgm-exporter scrape, a simulated
source with fault injection; `infiniband` reads sysfs for the NVML and DCGM sources), counter
arithmetic (`counters`: deltas with wrap and reset), the sampler that turns readings into
summaries with rates (`sampling`), the Prometheus exporter (`exporter`), the Ray actor that
runs one per node (`agent`), the functions the policy actor and CLI call (`manager`:
`ensure_agents`, `collect_summaries`, `collect_samples`, `inject_fault`) and the bridge to the
pure health policy (`verdicts`).

Must not: decide anything about nodes (that is `policies.health`) or act on verdicts (that is
the policy actor and the actuators). NVML is imported lazily, only when the `nvml` source is
configured, so nothing here needs a GPU or the NVML library to import.
"""
