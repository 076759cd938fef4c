"""Upstream reference data for tests: the one place tests find it.

Owns: where each data set the tests validate against is found (KubeRay's CRDs, dcgm-exporter's
default counter list), in this order: its environment variable, else ``../shared/data/``
beside the checkout, else the cache that ``infra/local/fetch-reference-data.sh`` fills
(``$RCP_REFERENCE_DATA_DIR``, by default ``${XDG_CACHE_HOME:-~/.cache}/rcp/reference-data``);
and what a test that needs a data set no source has sees: a skip whose reason starts with
``reference data missing:`` and names the data set, its variable and the fetch script, or,
with ``RCP_REQUIRE_REFERENCE_DATA=1`` (CI), a failure saying the same. A variable that is set
but names a path lacking the data fails the test: an explicit setting is not silently passed
over. The files each data set holds, with their upstream URLs at full commits and sha256
hashes, are listed in ``reference_data.lock``, which the fetch script reads too.

Must not: download anything, copy the data into the repository, or be called while a test
module is imported (a skip raised during collection is a collection error): call
``kuberay_crds()`` or ``dcgm_counters()`` from inside a test or a helper a test calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = Path(__file__).with_name("reference_data.lock")
SHARED_DATA = ROOT.parent / "shared" / "data"
FETCH_COMMAND = "bash infra/local/fetch-reference-data.sh"
MISSING = "reference data missing:"
"""How every skip (and failure) for absent reference data begins; the summary counts these."""
REQUIRE_VAR = "RCP_REQUIRE_REFERENCE_DATA"
CACHE_VAR = "RCP_REFERENCE_DATA_DIR"


@dataclass(frozen=True)
class DataSet:
    """One upstream data set: a directory or a single file under a data directory."""

    name: str
    env_var: str
    path: str
    """Where it lies under ``../shared/data`` and the cache: ``kuberay-crds`` (a directory) or
    ``dcgm-exporter/default-counters.csv`` (a file)."""


KUBERAY_CRDS = DataSet("KubeRay CRDs", "RCP_KUBERAY_CRDS", "kuberay-crds")
DCGM_COUNTERS = DataSet(
    "dcgm-exporter default counters", "RCP_DCGM_COUNTERS", "dcgm-exporter/default-counters.csv"
)


def kuberay_crds() -> Path:
    """The directory holding ray.io_rayclusters.yaml, ray.io_rayservices.yaml and
    ray.io_rayjobs.yaml (``$RCP_KUBERAY_CRDS`` names such a directory)."""
    return require(KUBERAY_CRDS)


def dcgm_counters() -> Path:
    """dcgm-exporter's default-counters.csv (``$RCP_DCGM_COUNTERS`` names the file)."""
    return require(DCGM_COUNTERS)


# --- finding a data set ------------------------------------------------------------------------


def pinned(lock_text: str) -> dict[str, str]:
    """path -> sha256, from a lock file: ``<sha256>  <path>  <url>`` a line, ``#`` comments."""
    rows = (line.split() for line in lock_text.splitlines())
    return {row[1]: row[0] for row in rows if row and not row[0].startswith("#")}


def members(data_set: DataSet, lock_text: str) -> tuple[str, ...]:
    """The files a data set must hold, relative to where its variable points: a directory's
    files by name; ``""`` for a data set that is one file (the variable names the file)."""
    out = []
    for path in pinned(lock_text):
        if path == data_set.path:
            out.append("")
        elif path.startswith(data_set.path + "/"):
            out.append(path[len(data_set.path) + 1 :])
    assert out, f"{LOCK.name} lists no file of {data_set.path}"
    return tuple(out)


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where the fetch script writes (it computes the same path)."""
    if environ.get(CACHE_VAR):
        return Path(environ[CACHE_VAR])
    xdg = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(xdg).expanduser() / "rcp" / "reference-data"


def lacking(place: Path, files: tuple[str, ...]) -> list[str]:
    """The files of `files` that `place` does not have (``""`` means `place` itself)."""
    return [name or place.name for name in files if not (place / name).is_file()]


@dataclass(frozen=True)
class Found:
    path: Path


@dataclass(frozen=True)
class Missing:
    reason: str
    """Starts with MISSING; one line."""
    misconfigured: bool
    """The data set's variable names a path without it: a failure, never a skip."""


def locate(
    data_set: DataSet, environ: Mapping[str, str], shared: Path, lock_text: str
) -> Found | Missing:
    """Where `data_set` is: its variable, else `shared`, else the cache (see the module doc)."""
    files = members(data_set, lock_text)
    explicit = environ.get(data_set.env_var)
    if explicit:
        gone = lacking(Path(explicit), files)
        if not gone:
            return Found(Path(explicit))
        return Missing(
            f"{MISSING} {data_set.name}: {data_set.env_var}={explicit} lacks "
            f"{', '.join(gone)} (point it at the data, or unset it to use {shared} or the "
            f"cache that `{FETCH_COMMAND}` fills)",
            misconfigured=True,
        )
    cache = cache_dir(environ)
    for root in (shared, cache):
        if not lacking(root / data_set.path, files):
            return Found(root / data_set.path)
    return Missing(
        f"{MISSING} {data_set.name} ({data_set.path}) is in none of ${data_set.env_var} (unset), "
        f"{shared}, {cache}; fetch it with `{FETCH_COMMAND}` or set {data_set.env_var}",
        misconfigured=False,
    )


def require(data_set: DataSet) -> Path:
    """The data set's path; else skips the calling test, or fails it where the data must be
    there (``RCP_REQUIRE_REFERENCE_DATA=1``) or its variable is set wrong."""
    where = locate(data_set, os.environ, SHARED_DATA, LOCK.read_text())
    if isinstance(where, Found):
        return where.path
    if where.misconfigured or os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(where.reason + (f" [{REQUIRE_VAR}=1]" if not where.misconfigured else ""))
    pytest.skip(where.reason)


# --- the run's summary -------------------------------------------------------------------------


def summary_line(skip_reasons: Iterable[str]) -> str | None:
    """The line a run ends with when tests were skipped for missing reference data, else None.
    `skip_reasons` as pytest reports them (``Skipped: <reason>``) or bare."""
    count = sum(1 for r in skip_reasons if r.removeprefix("Skipped: ").startswith(MISSING))
    if count == 0:
        return None
    tests = "test" if count == 1 else "tests"
    return (
        f"reference data: {count} {tests} skipped for missing reference data "
        f"(fetch: {FETCH_COMMAND})"
    )
