"""``python -m jobs.launcher``: the Ray Job's driver (see `jobs.launcher` for what it runs).

Owns: the driver's process setup before Ray is first imported, then `jobs.launcher.main`.

Must not: define what Ray pickles for the workers (those live in the package's modules, found
by name there, not copied out of ``__main__``).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # The Ray Job's driver. Every rank's output is forwarded to it; Ray would fold lines that
    # differ only in numbers ("rank 3 ...") into one, so each rank's line is kept, as under
    # torchrun (read when Ray is imported: nothing in jobs.launcher imports it at load).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from jobs.launcher import main

    sys.exit(main())
