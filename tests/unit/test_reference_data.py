"""Reference data: where tests find it (tests/reference_data.py), what a test sees without it,
the run's summary line, and the fetch script (infra/local/fetch-reference-data.sh).

The script's tests run it with bash against a fake checkout (a copy of the script beside a lock
file of their own) and a fake upstream served from a temporary directory, over a loopback HTTP
server or file:// URLs. Nothing here needs the internet or the real reference data, except
``test_the_data_at_hand_is_what_the_lock_pins``, which skips without it like any other reader.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import reference_data
from tests.reference_data import (
    DCGM_COUNTERS,
    KUBERAY_CRDS,
    LOCK,
    MISSING,
    DataSet,
    Found,
    Missing,
    cache_dir,
    locate,
    members,
    pinned,
    summary_line,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "local" / "fetch-reference-data.sh"
UPSTREAM = "https://raw.githubusercontent.com"
REAL_LOCK = LOCK.read_text()


# --- the lock ----------------------------------------------------------------------------------


def test_the_lock_pins_every_file_by_sha256_at_a_full_commit() -> None:
    rows = [line.split() for line in REAL_LOCK.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 4, rows
    for sha256, path, url in rows:
        assert re.fullmatch(r"[0-9a-f]{64}", sha256), (path, sha256)
        assert re.fullmatch(rf"{UPSTREAM}/[\w.-]+/[\w.-]+/[0-9a-f]{{40}}/\S+", url), url
        assert url.endswith("/" + path.rsplit("/", 1)[-1]), (path, url)
    assert members(KUBERAY_CRDS, REAL_LOCK) == (
        "ray.io_rayclusters.yaml",
        "ray.io_rayservices.yaml",
        "ray.io_rayjobs.yaml",
    )
    assert members(DCGM_COUNTERS, REAL_LOCK) == ("",)


@pytest.mark.parametrize("data_set", [KUBERAY_CRDS, DCGM_COUNTERS], ids=lambda d: d.env_var)
def test_the_data_at_hand_is_what_the_lock_pins(data_set: DataSet) -> None:
    place = reference_data.require(data_set)
    for relative in members(data_set, REAL_LOCK):
        file = place / relative if relative else place
        sha256 = pinned(REAL_LOCK)[f"{data_set.path}/{relative}".rstrip("/")]
        assert hashlib.sha256(file.read_bytes()).hexdigest() == sha256, file


# --- where a data set is found ------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Which places hold which data: ``{"env": [...], "shared": [...], "cache": [...]}``, each
    a list of paths as the lock names them (``kuberay-crds/ray.io_rayjobs.yaml``)."""

    places: dict[str, tuple[str, ...]] = field(default_factory=dict)
    env_set: bool = False


ALL_CRDS = tuple(p for p in pinned(REAL_LOCK) if p.startswith("kuberay-crds/"))
CSV = "dcgm-exporter/default-counters.csv"


def build(tmp_path: Path, layout: Layout, data_set: DataSet) -> tuple[dict[str, str], Path]:
    """Empty files where `layout` says; the environment `locate` sees, and the shared dir."""
    roots = {name: tmp_path / name for name in ("env", "shared", "cache")}
    for place, paths in layout.places.items():
        for path in paths:
            (roots[place] / path).parent.mkdir(parents=True, exist_ok=True)
            (roots[place] / path).write_text("")
    environ = {"RCP_REFERENCE_DATA_DIR": str(roots["cache"]), "HOME": str(tmp_path / "home")}
    if layout.env_set:
        environ[data_set.env_var] = str(roots["env"] / data_set.path)
    return environ, roots["shared"]


@pytest.mark.parametrize(
    ("data_set", "layout", "found_in"),
    [
        pytest.param(KUBERAY_CRDS, Layout({"env": ALL_CRDS}, True), "env", id="crds-variable"),
        pytest.param(DCGM_COUNTERS, Layout({"env": (CSV,)}, True), "env", id="csv-variable"),
        pytest.param(
            KUBERAY_CRDS,
            Layout({"env": ALL_CRDS, "shared": ALL_CRDS, "cache": ALL_CRDS}, True),
            "env",
            id="variable-before-shared-and-cache",
        ),
        pytest.param(
            KUBERAY_CRDS,
            Layout({"shared": ALL_CRDS, "cache": ALL_CRDS}),
            "shared",
            id="shared-before-cache",
        ),
        pytest.param(DCGM_COUNTERS, Layout({"cache": (CSV,)}), "cache", id="csv-in-cache"),
        pytest.param(
            KUBERAY_CRDS,
            Layout({"shared": ALL_CRDS[:2], "cache": ALL_CRDS}),
            "cache",
            id="shared-with-a-crd-missing-is-passed-over",
        ),
        pytest.param(
            DCGM_COUNTERS,
            Layout({"shared": ALL_CRDS, "cache": ALL_CRDS}),
            None,
            id="csv-nowhere-though-crds-are",
        ),
        pytest.param(KUBERAY_CRDS, Layout({"cache": ALL_CRDS[1:]}), None, id="crds-incomplete"),
        pytest.param(KUBERAY_CRDS, Layout(), None, id="crds-nowhere"),
    ],
)
def test_a_data_set_is_found_in_order_variable_shared_cache(
    tmp_path: Path, data_set: DataSet, layout: Layout, found_in: str | None
) -> None:
    environ, shared = build(tmp_path, layout, data_set)
    where = locate(data_set, environ, shared, REAL_LOCK)
    if found_in is None:
        assert isinstance(where, Missing) and not where.misconfigured, where
        assert where.reason.startswith(f"{MISSING} {data_set.name} ")
        for needle in (data_set.env_var, "bash infra/local/fetch-reference-data.sh", str(shared)):
            assert needle in where.reason, where.reason
        assert "\n" not in where.reason
    else:
        assert where == Found(tmp_path / found_in / data_set.path)


@pytest.mark.parametrize(
    ("data_set", "present", "lacking"),
    [
        pytest.param(KUBERAY_CRDS, ALL_CRDS[:2], "ray.io_rayjobs.yaml", id="crds-dir-lacks-one"),
        pytest.param(KUBERAY_CRDS, (), "ray.io_rayclusters.yaml", id="crds-dir-absent"),
        pytest.param(DCGM_COUNTERS, (), "default-counters.csv", id="csv-file-absent"),
    ],
)
def test_a_variable_naming_a_path_without_the_data_fails_even_where_shared_has_it(
    tmp_path: Path, data_set: DataSet, present: tuple[str, ...], lacking: str
) -> None:
    layout = Layout({"env": present, "shared": (*ALL_CRDS, CSV)}, env_set=True)
    environ, shared = build(tmp_path, layout, data_set)
    where = locate(data_set, environ, shared, REAL_LOCK)
    assert isinstance(where, Missing) and where.misconfigured, where
    assert where.reason.startswith(f"{MISSING} {data_set.name}: {data_set.env_var}=")
    assert f"lacks {lacking}" in where.reason, where.reason


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"RCP_REFERENCE_DATA_DIR": "/d", "XDG_CACHE_HOME": "/x", "HOME": "/h"},
            "/d",
            id="own-variable",
        ),
        pytest.param(
            {"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/rcp/reference-data", id="xdg-cache"
        ),
        pytest.param({"HOME": "/h"}, "/h/.cache/rcp/reference-data", id="home"),
        pytest.param(
            {"RCP_REFERENCE_DATA_DIR": "", "XDG_CACHE_HOME": "", "HOME": "/h"},
            "/h/.cache/rcp/reference-data",
            id="empty-variables-are-unset",
        ),
    ],
)
def test_cache_dir(environ: dict[str, str], expected: str) -> None:
    assert cache_dir(environ) == Path(expected)


# --- what a test that needs missing data sees ----------------------------------------------------


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        pytest.param({}, pytest.skip.Exception, id="missing-skips"),
        pytest.param(
            {"RCP_REQUIRE_REFERENCE_DATA": "1"}, pytest.fail.Exception, id="required-fails"
        ),
        pytest.param(
            {"RCP_REQUIRE_REFERENCE_DATA": "0"}, pytest.skip.Exception, id="required-0-skips"
        ),
        pytest.param(
            {"RCP_DCGM_COUNTERS": "/nowhere.csv"}, pytest.fail.Exception, id="wrong-variable-fails"
        ),
    ],
)
def test_a_reader_without_the_data_is_skipped_or_failed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    outcome: type[BaseException],
) -> None:
    monkeypatch.setattr(reference_data, "SHARED_DATA", tmp_path / "shared")
    for name in ("RCP_REQUIRE_REFERENCE_DATA", "RCP_DCGM_COUNTERS", "RCP_KUBERAY_CRDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RCP_REFERENCE_DATA_DIR", str(tmp_path / "cache"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(outcome, match=f"^{MISSING} dcgm-exporter default counters"):
        reference_data.dcgm_counters()


def test_a_reader_with_the_data_gets_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reference_data, "SHARED_DATA", tmp_path / "shared")
    monkeypatch.delenv("RCP_KUBERAY_CRDS", raising=False)
    for path in ALL_CRDS:
        (tmp_path / "shared" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "shared" / path).write_text("")
    assert reference_data.kuberay_crds() == tmp_path / "shared" / "kuberay-crds"


def _readers() -> list[Path]:
    """The unit test modules that read reference data."""
    here = Path(__file__).parent
    return sorted(
        p
        for p in here.rglob("test_*.py")
        if p != Path(__file__) and "from tests.reference_data import" in p.read_text()
    )


def test_the_known_readers_are_found() -> None:
    names = {p.name for p in _readers()}
    assert {"test_telemetry_dcgm.py", "test_k8s_manifests.py"} <= names, names


@pytest.mark.parametrize("module", _readers(), ids=lambda p: p.stem)
def test_a_reader_module_reads_no_reference_data_while_it_is_imported(
    module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A skip raised while pytest collects a module is a collection error, not a skip."""

    def called_at_import(data_set: DataSet) -> Path:
        raise AssertionError(f"{module.name} reads {data_set.name} while it is imported")

    monkeypatch.setattr(reference_data, "require", called_at_import)
    name = f"_import_check_{module.stem}"
    spec = importlib.util.spec_from_file_location(name, module)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, fresh)  # its dataclasses look their module up
    spec.loader.exec_module(fresh)


# --- the run's summary line ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        pytest.param([], None, id="no-skips"),
        pytest.param(["Skipped: needs a GPU", "Skipped: slow"], None, id="other-skips"),
        pytest.param(
            [f"Skipped: {MISSING} KubeRay CRDs (kuberay-crds) ...", "Skipped: needs a GPU"],
            "reference data: 1 test skipped for missing reference data "
            "(fetch: bash infra/local/fetch-reference-data.sh)",
            id="one",
        ),
        pytest.param(
            [f"Skipped: {MISSING} a", f"{MISSING} b", f"Skipped: {MISSING} c"],
            "reference data: 3 tests skipped for missing reference data "
            "(fetch: bash infra/local/fetch-reference-data.sh)",
            id="three-with-and-without-prefix",
        ),
        pytest.param([f"Skipped: because {MISSING} x"], None, id="the-text-must-begin-the-reason"),
    ],
)
def test_summary_line(reasons: list[str], expected: str | None) -> None:
    assert summary_line(reasons) == expected


# --- the fetch script ----------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {"one/a.yaml": b"kind: A\n", "two/b.csv": b"DCGM_FI_X, gauge, x\n"}
"""The fake checkout's lock pins these (cache path -> upstream bytes)."""


def _url_path(path: str) -> str:
    return f"/owner/repo/{COMMIT}/upstream/{path}"


@dataclass
class Fetch:
    """A fake checkout with the script, a fake upstream, and a cache, all under tmp_path."""

    tmp_path: Path

    @property
    def checkout(self) -> Path:
        return self.tmp_path / "checkout"

    @property
    def upstream(self) -> Path:
        return self.tmp_path / "upstream"

    @property
    def cache(self) -> Path:
        return self.tmp_path / "cache"

    def serve(self, files: dict[str, bytes]) -> None:
        """The upstream answers `files` (a path left out is a 404)."""
        for path, body in files.items():
            target = self.upstream / _url_path(path).lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)

    def run(self, base_url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.checkout / "infra" / "local" / "fetch-reference-data.sh")],
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self.tmp_path / "home"),
                "RCP_REFERENCE_DATA_DIR": str(self.cache),
                "RCP_REFERENCE_DATA_BASE_URL": base_url,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def cache_contents(self) -> dict[str, bytes]:
        if not self.cache.exists():
            return {}
        return {
            str(p.relative_to(self.cache)): p.read_bytes()
            for p in self.cache.rglob("*")
            if p.is_file()
        }


@pytest.fixture
def fetch(tmp_path: Path) -> Fetch:
    f = Fetch(tmp_path)
    (f.checkout / "infra" / "local").mkdir(parents=True)
    (f.checkout / "tests").mkdir()
    shutil.copy(SCRIPT, f.checkout / "infra" / "local" / SCRIPT.name)
    lock = ["# a test's own lock"] + [
        f"{hashlib.sha256(body).hexdigest()}  {path}  {UPSTREAM}{_url_path(path)}"
        for path, body in FILES.items()
    ]
    (f.checkout / "tests" / "reference_data.lock").write_text("\n".join(lock) + "\n")
    return f


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def loopback() -> Iterator[Callable[[Path], str]]:
    """Serves a directory over HTTP on 127.0.0.1; gives its base URL."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(directory: Path) -> str:
        handler = functools.partial(_Quiet, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def unreachable() -> Iterator[str]:
    """A loopback port that refuses connections: bound, never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


TAMPERED = {**FILES, "two/b.csv": b"DCGM_FI_X, counter, x\n"}
STALE = {"two/b.csv": b"an older copy\n"}


WROTE = r"^reference data: wrote 2 files to \S+/cache \(sha256 checked\)$"


@pytest.mark.parametrize(
    ("served", "over", "cached", "rc", "line"),
    [
        pytest.param(FILES, "http", {}, 0, WROTE, id="http"),
        pytest.param(FILES, "file", {}, 0, WROTE, id="file"),
        pytest.param(FILES, "http", STALE, 0, WROTE, id="stale-replaced"),
        pytest.param(
            {},
            "unreachable",
            FILES,
            0,
            r"^reference data: all 2 files already in \S+/cache \(sha256 checked\)$",
            id="already-cached-needs-no-network",
        ),
        pytest.param(
            TAMPERED,
            "http",
            {},
            1,
            r"^fetch-reference-data: refused: two/b\.csv from http://\S+ has sha256 [0-9a-f]{64},"
            r" not the pinned [0-9a-f]{64}; nothing written$",
            id="tampered-refused",
        ),
        pytest.param(
            TAMPERED,
            "file",
            STALE,
            1,
            r"^fetch-reference-data: refused: two/b\.csv from file://",
            id="tampered-leaves-cache-as-it-was",
        ),
        pytest.param(
            {"one/a.yaml": FILES["one/a.yaml"]},
            "http",
            {},
            1,
            r"^fetch-reference-data: download failed: http://\S+/two/b\.csv \(curl: .*404.*\);"
            r" nothing written$",
            id="absent-upstream",
        ),
        pytest.param(
            FILES,
            "unreachable",
            {},
            1,
            r"^fetch-reference-data: network not reachable: cannot download from 127\.0\.0\.1:\d+"
            r" \(curl: .*\); nothing written$",
            id="network-unreachable",
        ),
    ],
)
def test_fetch_script(
    fetch: Fetch,
    loopback: Callable[[Path], str],
    unreachable: str,
    served: dict[str, bytes],
    over: str,
    cached: dict[str, bytes],
    rc: int,
    line: str,
) -> None:
    """Exit 0 and the cache holds the pinned files; or exit 1, one line on stderr, and the
    cache exactly as it was."""
    fetch.serve(served)
    for path, body in cached.items():
        (fetch.cache / path).parent.mkdir(parents=True, exist_ok=True)
        (fetch.cache / path).write_bytes(body)
    base = {
        "http": lambda: loopback(fetch.upstream),
        "file": lambda: f"file://{fetch.upstream}",
        "unreachable": lambda: unreachable,
    }[over]()

    done = fetch.run(base)

    assert done.returncode == rc, (done.stdout, done.stderr)
    said, silent = (done.stdout, done.stderr) if rc == 0 else (done.stderr, done.stdout)
    assert silent == "", silent
    assert len(said.splitlines()) == 1, said
    assert re.search(line, said.strip()), said
    assert fetch.cache_contents() == (FILES if rc == 0 else cached)
