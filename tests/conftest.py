"""Shared test setup.

Ray resolves a node's IP by asking the OS for the route to a public address; on a machine
with a network card it then binds to that card's address. Every test cluster here must bind
to loopback only, so this is set before anything imports Ray: with it Ray uses 127.0.0.1.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
