"""The runner's bounds: how long it waits, how much it keeps, how often it sweeps.

Owns: every such number. The other runner modules read them as ``limits.NAME`` when they
run, so one place sets them (tests patch them here).

Must not: hold anything but constants.
"""

from __future__ import annotations

FAILED_LOG_TAIL_BYTES = 64 << 10
"""The end of a failed attempt's log the runner reads for its reason and signature (the
launcher's gang-failed line is the log's last line), however long the log is."""
ORPHAN_SWEEP_INTERVAL_S = 300.0
"""How often `JobRunner.sweep_orphans` lists Ray's jobs (and once at start)."""

TICK_WAIT_S = 2.0
"""The most one `JobRunner.observe` (and its `apply`) waits for checkpoint reads and stack fetches, all jobs
together (they run on worker threads; one still running is picked up by a later tick)."""
SIGNATURE_TAIL_CHARS = 4000
"""The log tail a failure's signature is taken from (`policies.restarts.failure_signature`)."""
STACK_MAX_RANKS = 64
"""Ranks whose stacks a hang fetches (lowest first); more are named, not fetched."""
STACK_FETCH_THREADS = 8
STACKS_DEADLINE_S = 20.0
"""The most all stack fetches of one hang take; a rank not answered by then shows why."""
MEMORY_TIER_SWEEP_JOBS = 100
"""Jobs whose leftover holder actors one sweep checks (`JobRunner.sweep_memory_tiers`)."""
CREDENTIALS_MINT_RETRY_S = 30.0
"""After a failed mint of a job's scoped storage credentials (STS unreachable or refusing),
how long before the runner tries that job again (`credentials.JobCredentials.refresh`)."""
