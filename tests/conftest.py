"""Shared test setup.

Ray resolves a node's IP by asking the OS for the route to a public address; on a machine
with a network card it then binds to that card's address. Every test cluster here must bind
to loopback only, so this is set before anything imports Ray: with it Ray uses 127.0.0.1.
(Neither pytest nor tests.reference_data imports Ray.)

A run's summary ends with how many tests were skipped for missing reference data, when any
were (tests/reference_data.py).
"""

from __future__ import annotations

import os

import pytest

from tests import reference_data

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A run that skipped tests for missing reference data ends by saying how many, and how to
    fetch it (tests/reference_data.py)."""
    reasons = [
        report.longrepr[2]
        for report in terminalreporter.stats.get("skipped", [])
        if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3
    ]
    line = reference_data.summary_line(reasons)
    if line is not None:
        terminalreporter.write_line(line)
