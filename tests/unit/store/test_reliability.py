"""The fleet's failure record (`controlplane.store.reliability`) as a table: prior, evidence,
decay and the gang MTBF handed to jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.config import load_config
from controlplane.store import Store
from controlplane.store import reliability as rel

DAY = 86400.0


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "db.sqlite")


def test_a_new_cluster_uses_the_prior(store: Store, tmp_path: Path) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}", "jobs.gpu_mtbf_prior_hours=1000"])
    assert rel.gpu_failure_rate_per_hour(store, cfg, 0.0) == pytest.approx(1 / 1000)
    # 8 GPUs: any one failing stops the gang, so 8x the rate: 125 h.
    assert rel.job_mtbf_s(store, cfg, 8, 0.0) == pytest.approx(125 * 3600)


@pytest.mark.parametrize(
    ("failures", "gpu_hours", "mtbf_h_per_gpu"),
    [
        (0, 9000.0, 10000.0),  # no failure in 9000 GPU-hours: better than the prior
        (9, 9000.0, 1000.0),  # (9 + 1) / (9000 + 1000)
        (99, 9000.0, 100.0),  # a bad cluster: the record outweighs the prior
    ],
)
def test_the_record_replaces_the_prior_as_evidence_accrues(
    store: Store, tmp_path: Path, failures: int, gpu_hours: float, mtbf_h_per_gpu: float
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}", "jobs.gpu_mtbf_prior_hours=1000"])
    rel.accrue_gpu_hours(store, 1000, gpu_hours * 3.6, now=0.0)
    for _ in range(failures):
        rel.record_failure(store, "gang-crash", now=0.0)
    assert rel.job_mtbf_s(store, cfg, 1, 0.0) == pytest.approx(mtbf_h_per_gpu * 3600)


def test_old_evidence_decays_by_half_per_half_life(store: Store) -> None:
    rel.record_failure(store, "node-removed-by-health", now=0.0)
    rel.accrue_gpu_hours(store, 10, 3600.0, now=0.0)
    later = rel.fleet_record(store, rel.HALF_LIFE_S)
    assert later["failures"] == pytest.approx(0.5)
    assert later["gpu_hours"] == pytest.approx(5.0)
    assert later["by_kind"] == {"node-removed-by-health": pytest.approx(0.5)}


def test_mtbf_is_bounded_and_bad_inputs_change_nothing(store: Store, tmp_path: Path) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}", "jobs.gpu_mtbf_prior_hours=1"])
    for _ in range(1000):
        rel.record_failure(store, "gang-hang", now=0.0)
    assert rel.job_mtbf_s(store, cfg, 100_000, 0.0) == rel.MIN_MTBF_S
    before = rel.fleet_record(store, 0.0)
    rel.accrue_gpu_hours(store, 8, float("nan"), now=0.0)
    rel.accrue_gpu_hours(store, -1, 10.0, now=0.0)
    assert rel.fleet_record(store, 0.0) == before
    with pytest.raises(ValueError, match="unknown failure kind"):
        rel.record_failure(store, "cosmic-ray", now=0.0)
