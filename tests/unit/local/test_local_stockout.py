"""The local stand-in for a provider's stock-out: `rcp fault stockout` writes the file the
local cluster's fake node provider reads before it launches a node (no Ray cluster here: the
provider's launch is replaced by a recorder at the boundary to Ray's fake provider)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

from controlplane.cli import cli
from controlplane.config import load_config
from controlplane.local.autoscaler import autoscaler_config, stockout_file
from controlplane.local.provider import (
    ProxyPortNodeProvider,
    StockedOut,
    read_stockouts,
    write_stockouts,
)


def test_the_file_round_trips_and_a_broken_one_is_no_stockout(tmp_path: Path) -> None:
    path = tmp_path / "stockouts.json"
    assert read_stockouts(path) == frozenset()
    write_stockouts(path, frozenset({"b", "a"}))
    assert read_stockouts(path) == {"a", "b"}
    assert path.stat().st_mode & 0o777 == 0o600
    for broken in (b"{not json", b'{"a": 1}', b"[1, 2]"):
        path.write_bytes(broken)
        assert read_stockouts(path) == frozenset()
    assert read_stockouts(None) == frozenset()


def test_a_stocked_out_providers_node_is_not_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    conf = autoscaler_config(cfg)
    assert conf["provider"]["stockout_file"] == str(stockout_file(cfg))
    launched: list[str] = []

    def launch(
        self: Any, node_config: Any, tags: Any, count: Any, resources: Any, labels: Any
    ) -> None:
        launched.append(labels.get("provider", "-"))

    monkeypatch.setattr(FakeMultiNodeProvider, "__init__", lambda self, *a: None)
    monkeypatch.setattr(FakeMultiNodeProvider, "_create_node_with_resources_and_labels", launch)
    provider = ProxyPortNodeProvider(conf["provider"], "rcp-local")
    provider.lock = __import__("threading").RLock()
    provider._nodes = {}
    types = conf["available_node_types"]

    def create(node_type: str) -> None:
        t = types[node_type]
        provider._create_node_with_resources_and_labels(
            {}, {}, 1, dict(t["resources"]), t["labels"]
        )

    write_stockouts(stockout_file(cfg), frozenset({"rent-a"}))
    with pytest.raises(StockedOut, match="provider rent-a is out of stock"):
        create("external-rent-a")
    create("external-rent-b")
    create("cluster")
    assert launched == ["rent-b", "-"]
    # `cluster`: the owned pool's replacement for a node that died is refused too.
    write_stockouts(stockout_file(cfg), frozenset({"cluster"}))
    with pytest.raises(StockedOut, match="provider cluster is out of stock"):
        create("cluster")
    create("external-rent-a")
    write_stockouts(stockout_file(cfg), frozenset())
    create("cluster")
    assert launched == ["rent-b", "-", "rent-a", "-"]


def test_rcp_fault_stockout_names_the_provider_and_ends_it(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["fault", "stockout", f"state_dir={tmp_path}"]
    got = runner.invoke(cli, [*base[:2], "rent-a", base[2]])
    assert got.exit_code == 0, got.output
    assert "provider rent-a: stock-out started; stocked out: rent-a" in got.output
    assert read_stockouts(tmp_path / "stockouts.json") == {"rent-a"}
    got = runner.invoke(cli, [*base[:2], "rent-a", "--end", base[2]])
    assert got.exit_code == 0 and "stock-out ended; stocked out: none" in got.output
    got = runner.invoke(cli, [*base[:2], "cluster", base[2]])
    assert got.exit_code == 0 and "stocked out: cluster" in got.output, got.output
    got = runner.invoke(cli, [*base[:2], "rent-z", base[2]])
    assert got.exit_code != 0 and "no external provider 'rent-z'" in got.output
    assert "rent-a, rent-b" in got.output


def test_a_reclaim_drains_with_the_notice_then_kills_only_that_external_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rcp fault reclaim` at the boundary to Ray: the drain's deadline is the notice, the
    kill comes after it, and only a live external node qualifies (Ray's calls recorded)."""
    import ray

    from controlplane.local import faults

    nodes = [
        {"NodeID": "aa01", "Alive": True, "Labels": {"pool": "external", "provider": "rent-a"}},
        {"NodeID": "bb02", "Alive": True, "Labels": {"pool": "cluster"}},
        {"NodeID": "cc03", "Alive": False, "Labels": {"pool": "external"}},
    ]
    calls: list[tuple[str, ...]] = []

    class Proc:
        def kill(self) -> None:
            calls.append(("kill",))

    monkeypatch.setattr(faults, "connect", lambda _cfg: None)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(
        faults.RayNodeControl,
        "drain",
        lambda _self, node, why, deadline_s: (
            calls.append(("drain", node, why, str(deadline_s))) or True
        ),
    )
    monkeypatch.setattr(faults, "node_processes", lambda *_a: [Proc(), Proc()])
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    state = {"cluster_id": "c", "temp_dir": str(tmp_path)}
    out: list[str] = []
    slept: list[float] = []
    assert faults.reclaim_node(cfg, state, "01", 45.0, out.append, slept.append) == "aa01"
    assert calls == [
        ("drain", "aa01", "provider rent-a reclaims the node in 45 s", "45.0"),
        ("kill",),
        ("kill",),
    ]
    assert slept == [45.0]
    assert "notice given" in out[0] and "taken back (2 processes killed)" in out[1]
    for node, notice, error in (
        ("bb02", 10.0, "not an external"),
        ("cc03", 10.0, "0 live nodes match"),
        ("aa01", 0.0, "notice"),
        ("aa01", float("nan"), "notice"),
    ):
        with pytest.raises(faults.ReclaimError, match=error):
            faults.reclaim_node(cfg, state, node, notice, out.append, slept.append)
