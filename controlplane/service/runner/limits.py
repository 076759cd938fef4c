"""The runner's bounds: how long it waits, how much it keeps, how often it sweeps.

Owns: every number that caps the runner's waits (the tick's, a submission's, a stack fetch's),
what it keeps (log characters, attempt ends, stacks) and how often it sweeps. The other runner
modules read them as ``limits.NAME`` when they run, so one place sets them (tests patch them
here).

Must not: hold anything but constants.
"""

from __future__ import annotations

MAX_ATTEMPT_LOG_BYTES = 32 << 20
"""The most of one attempt's log the runner serves: its first bytes; a marker line
(`logs.LOG_TRUNCATED_MARKER`) says the rest was left in Ray. Applied at the source: nothing
past it is ever asked of Ray (`logs.AttemptLogs`). The head is kept, so offsets stay valid."""
FAILED_LOG_TAIL_BYTES = 64 << 10
"""The end of a failed attempt's log the runner reads for its reason and signature (the
launcher's gang-failed line is the log's last line), however long the log is."""
LOG_SIZE_INDEX_ENTRIES = 100_000
"""Ended attempts whose log size `JobRunner.read_logs` remembers (least recently used out)."""
DRIVER_AGENTS_KEPT = 10_000
"""Attempts whose driver's dashboard agent `ray_jobs.RayJobs` remembers (oldest out)."""
ORPHAN_SWEEP_INTERVAL_S = 300.0
"""How often `JobRunner.sweep_orphans` lists Ray's jobs (and once at start)."""
LIVE_LOG_CACHE_S = 2.0
"""How long a live attempt's log size is used again before Ray is asked anew: reading an
older attempt's window needs the sizes before it, and N clients following one job cost one
size probe per this many seconds; each then reads only its own window's bytes."""
DASHBOARD_CONNECT_TIMEOUT_S = 5.0
DASHBOARD_READ_TIMEOUT_S = 30.0
"""Every HTTP request to the Ray dashboard (submit, status, stop, list) and to a driver
node's dashboard agent (a log range) gives up after this long without a byte
(`ray_jobs.dashboard_client`): a dashboard that accepts a connection and never answers
raises instead of hanging the tick thread, or a submission thread, forever."""

TICK_WAIT_S = 2.0
"""The most one `JobRunner.reconcile` waits for checkpoint reads and stack fetches, all jobs
together (they run on worker threads; one still running is picked up by a later tick)."""
MAX_ATTEMPTS_KEPT = 100
"""Attempt ends kept in a job's info (``attempts``, newest last)."""
ATTEMPT_REASON_CHARS = 400
"""The most of a log tail kept as an attempt's end reason (its last characters)."""
SIGNATURE_TAIL_CHARS = 4000
"""The log tail a failure's signature is taken from (`policies.restarts.failure_signature`)."""
STACK_MAX_CHARS = 64 << 10
"""The most of one worker's stacks kept (the start: the stacks of its threads, main first)."""
STACK_MAX_RANKS = 64
"""Ranks whose stacks a hang fetches (lowest first); more are named, not fetched."""
STACK_FETCH_THREADS = 8
STACKS_DEADLINE_S = 20.0
"""The most all stack fetches of one hang take; a rank not answered by then shows why."""
STACK_REQUEST_TIMEOUT_S = (2.0, 15.0)
"""(connect, read) timeout of one ``/worker/traceback`` request (py-spy runs in between)."""
MEMORY_TIER_SWEEP_JOBS = 100
"""Jobs whose leftover holder actors one sweep checks (`JobRunner.sweep_memory_tiers`)."""
CREDENTIALS_MINT_RETRY_S = 30.0
"""After a failed mint of a job's scoped storage credentials (STS unreachable or refusing),
how long before the runner tries that job again (`credentials.JobCredentials.refresh`)."""
