"""The monitoring files `controlplane.observability` reads at run time ship in the wheel.

Owns: building the wheel from a copy of the source tree (``pip wheel``, offline, without build
isolation: the venv's setuptools) and checking that it carries the Prometheus rules and the
Grafana dashboards, byte for byte ``infra/``'s, and that the module finds them there, through
`importlib.resources`, once the wheel is unpacked outside the checkout; and, in the checkout,
that ``controlplane/monitoring`` links to ``infra/`` (one copy, never a second that drifts).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from controlplane import observability as obs
from controlplane.local.prometheus import LocalPrometheus

REPO = Path(__file__).resolve().parents[3]
INFRA_FILES = (
    REPO / "infra" / "prometheus" / "rules.yml",
    *sorted((REPO / "infra" / "grafana").glob("*.json")),
)
"""What the control plane reads at run time, by its source path."""
SOURCES = ("pyproject.toml", "README.md", "controlplane", "jobs", "serve", "policies")
"""What the build reads, with the ``infra/`` folders the package's links point into."""


def _in_wheel(path: Path) -> str:
    """``infra/grafana/x.json`` -> ``controlplane/monitoring/grafana/x.json``."""
    return "controlplane/monitoring/" + path.relative_to(REPO / "infra").as_posix()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the tree (the build writes build/ and *.egg-info where
    it runs, and the checkout is shared)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(origin, src / name)
    for name in ("prometheus", "grafana"):
        shutil.copytree(REPO / "infra" / name, src / "infra" / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"pip wheel failed:\n{build.stdout}\n{build.stderr}"
    (found,) = out.glob("*.whl")
    return found


def test_the_wheel_carries_the_monitoring_files_byte_for_byte(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        missing = [_in_wheel(p) for p in INFRA_FILES if _in_wheel(p) not in names]
        assert not missing, f"{wheel.name} lacks {missing}"
        for path in INFRA_FILES:
            assert whl.read(_in_wheel(path)) == path.read_bytes(), f"{_in_wheel(path)} differs"


def test_an_unpacked_wheel_reads_its_own_files(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(tmp_path)
    # The unpacked wheel comes first on the path, ahead of the checkout's editable install.
    probe = (
        "from controlplane import observability as o; "
        "print(o.PROMETHEUS_DIR); print(o.GRAFANA_DIR); print(sorted(o.load_dashboards()))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    prometheus, grafana, dashboards = run.stdout.splitlines()
    assert Path(prometheus) == tmp_path / "controlplane" / "monitoring" / "prometheus"
    assert Path(grafana) == tmp_path / "controlplane" / "monitoring" / "grafana"
    assert (Path(prometheus) / "rules.yml").is_file()
    assert dashboards == repr(sorted(p.name for p in INFRA_FILES if p.suffix == ".json"))


def test_the_checkout_links_the_package_to_infra() -> None:
    package = resources.files("controlplane") / "monitoring"
    assert package / "prometheus" == obs.PROMETHEUS_DIR
    assert package / "grafana" == obs.GRAFANA_DIR
    for name in ("prometheus", "grafana"):
        link = REPO / "controlplane" / "monitoring" / name
        assert link.is_symlink(), f"{link} must be a link to infra/{name}, not a copy"
        assert link.resolve() == (REPO / "infra" / name).resolve()
    assert LocalPrometheus(Path("w"), Path("sd")).rule_files == (obs.PROMETHEUS_DIR / "rules.yml",)
    assert set(obs.load_dashboards()) == {p.name for p in INFRA_FILES if p.suffix == ".json"}
