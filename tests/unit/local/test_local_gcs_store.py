"""GCS fault tolerance in local mode: the Redis server's config, the head's settings, the
config switch. No Redis runs here (tests/integration/test_head_loss.py runs a real one)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from controlplane.config import ConfigError, load_config
from controlplane.local.cluster import LocalCluster
from controlplane.local.head_process import head_command
from controlplane.local.ports import isolated_overrides
from controlplane.local.redis import LocalRedis, gcs_redis_env, redis_conf


def _conf_lines(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if line)


def test_redis_binds_loopback_only_with_protected_mode_a_password_and_an_append_only_file(
    tmp_path: Path,
) -> None:
    lines = _conf_lines(redis_conf("127.0.0.1", 6380, "s3cret", tmp_path))
    assert lines["bind"] == "127.0.0.1"
    assert lines["port"] == "6380"
    assert lines["protected-mode"] == "yes"
    assert lines["requirepass"] == "s3cret"
    assert lines["appendonly"] == "yes"
    assert lines["dir"] == str(tmp_path)
    assert lines["daemonize"] == "no"


def test_the_password_is_random_per_state_dir_owner_only_and_stable(tmp_path: Path) -> None:
    a = LocalRedis(load_config(None, [f"state_dir={tmp_path / 'a'}"]))
    b = LocalRedis(load_config(None, [f"state_dir={tmp_path / 'b'}"]))
    (tmp_path / "a").mkdir(mode=0o700)
    (tmp_path / "b").mkdir(mode=0o700)
    first = a.password()
    assert len(first) >= 32
    assert a.password() == first  # a restarted head finds the same one
    assert b.password() != first
    assert stat.S_IMODE(a.password_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        pytest.param(
            ["ray.redis_port=7001"],
            {
                "RAY_REDIS_ADDRESS": "127.0.0.1:7001",
                "RAY_external_storage_namespace": "rcp-c1",
            },
            id="on-by-default",
        ),
        pytest.param(["ray.gcs_fault_tolerance=false"], {}, id="switched-off"),
    ],
)
def test_the_heads_gcs_uses_redis_unless_switched_off(
    overrides: list[str], want: dict[str, str]
) -> None:
    env = gcs_redis_env(load_config(None, overrides), "c1")
    assert env == want
    assert not any("PASSWORD" in k for k in env)  # never the password in the environment


@pytest.mark.parametrize(
    ("overrides", "with_password"),
    [
        pytest.param([], True, id="fault-tolerant"),
        pytest.param(["ray.gcs_fault_tolerance=false"], False, id="in-memory-gcs"),
    ],
)
def test_head_command_passes_the_redis_password_only_with_fault_tolerance(
    tmp_path: Path, overrides: list[str], with_password: bool
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}", *overrides])
    cmd = head_command(cfg, tmp_path / "autoscaler.yaml")
    flags = [a for a in cmd if a.startswith("--redis-password=")]
    if with_password:
        assert flags == [f"--redis-password={LocalRedis(cfg).password()}"]
    else:
        assert flags == []
    assert f"--autoscaling-config={tmp_path / 'autoscaler.yaml'}" in cmd


def test_a_restarted_heads_command_names_no_autoscaler_config(tmp_path: Path) -> None:
    cmd = head_command(load_config(None, [f"state_dir={tmp_path}"]), None)
    assert not any(a.startswith("--autoscaling-config") for a in cmd)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            ["ray.redis_port=0"], "ray.redis_port: must be a TCP port in 1..65535", id="port"
        ),
        pytest.param(
            ["ray.redis_port=6390", "ray.gcs_port=6390"],
            "ray.redis_port: port 6390 is already used by ray.gcs_port",
            id="clash",
        ),
        pytest.param(
            ["ray.gcs_reconnect_timeout_s=1"],
            "ray.gcs_reconnect_timeout_s: must be >= 5",
            id="reconnect-window",
        ),
    ],
)
def test_bad_gcs_store_settings_are_refused_naming_the_key(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_a_clash_with_the_redis_port_is_fine_when_fault_tolerance_is_off() -> None:
    cfg = load_config(None, ["ray.gcs_fault_tolerance=false", "ray.redis_port=6390"])
    assert cfg.ray.redis_port == cfg.ray.gcs_port


def test_an_isolated_cluster_gets_its_own_redis_port(tmp_path: Path) -> None:
    cfg = load_config(None, isolated_overrides(tmp_path))
    taken = {
        cfg.ray.gcs_port,
        cfg.ray.dashboard_port,
        cfg.ray.client_port,
        cfg.ray.metrics_export_port,
        cfg.serve.http_port,
        cfg.storage.embedded_port,
        cfg.api.port,
    }
    assert cfg.ray.redis_port not in taken


def test_the_install_script_installs_redis_server_when_it_is_missing() -> None:
    """CI runs infra/local/install.sh on a fresh machine: redis-server must come from it."""
    script = (Path(__file__).parents[3] / "infra/local/install.sh").read_text()
    assert "command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)" in script
    assert 'apt-get install -y -qq --no-install-recommends "${missing[@]}"' in script


@pytest.mark.parametrize("location", ["EveryNode", "HeadOnly"])
def test_both_proxy_locations_are_accepted(location: str) -> None:
    assert load_config(None, [f"serve.proxy_location={location}"]).serve.proxy_location == location


@pytest.mark.parametrize("location", ["Disabled", "everynode", "Head"])
def test_other_proxy_locations_are_refused_naming_the_key(location: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"serve.proxy_location={location}"])
    assert "serve.proxy_location: must be one of EveryNode, HeadOnly" in str(err.value)


def test_rcp_down_finds_redis_by_its_directory_though_its_environment_is_overwritten(
    tmp_path: Path,
) -> None:
    """redis-server rewrites its process title over its environment block, so the cluster id
    there is gone; it runs in <state_dir>/redis/data, which `down`'s roots name."""
    import subprocess
    import sys

    from controlplane.local.processes import find_cluster_processes

    cluster = LocalCluster(load_config(None, [f"state_dir={tmp_path}"]))
    data = LocalRedis(cluster.cfg).work_dir / "data"
    data.mkdir(parents=True)
    stand_in = subprocess.Popen(  # a process like redis: no cluster id in its environment
        [sys.executable, "-c", "import time; time.sleep(60)"], cwd=data, env={}
    )
    try:
        state = {"temp_dir": str(tmp_path / "ray-tmp")}
        found = {p.pid for p in find_cluster_processes("c1", cluster.process_roots(state))}
        assert stand_in.pid in found
        assert stand_in.pid not in {
            p.pid for p in find_cluster_processes("c1", [state["temp_dir"]])
        }
    finally:
        stand_in.kill()
        stand_in.wait()
