"""The controller's reader of committed checkpoint steps, against a real S3-protocol server
(moto) on 127.0.0.1 and a file:// directory: newest committed step, one step's commit, and the
manifests it refuses (written by jobs: untrusted). No Ray.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from controlplane.adapters import checkpoints as checkpoints_module
from controlplane.adapters.checkpoints import MAX_MANIFEST_BYTES, CheckpointReader, CommittedStep
from controlplane.config import load_config
from jobs.checkpoint.layout import Manifest, RankRecord, index_key, manifest_key, step_dir


def manifest(step: int, created_s: float = 1234.5, world_size: int = 2) -> bytes:
    ranks = tuple(RankRecord(r, index_key(step, r), "00000000", 8) for r in range(world_size))
    return Manifest(step, world_size, ranks, created_s).to_json_bytes()


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    client(url).create_bucket(Bucket="ckpt")
    yield url
    server.stop()


def client(url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


class Place:
    """One job prefix in one backend: put objects, read them back through the reader."""

    def __init__(self, prefix: str, put: Callable[[str, bytes], None], reader: CheckpointReader):
        self.prefix, self.put, self.reader = prefix, put, reader

    def commit(self, step: int, data: bytes | None = None) -> None:
        self.put(f"{step_dir(step)}/rank-00000.index.json", b"{}")
        self.put(manifest_key(step), manifest(step) if data is None else data)

    def upload_without_manifest(self, step: int) -> None:
        self.put(f"{step_dir(step)}/rank-00000/shard-00000.bin", b"x" * 8)


@pytest.fixture(params=["s3", "file"])
def place(request: Any, tmp_path: Path) -> Place:
    shared = "storage.job_credentials=shared"  # the controller's own reads: no job credentials
    cfg = load_config(None, [f"state_dir={tmp_path}", "storage.embedded=false", shared])
    if request.param == "s3":
        url = request.getfixturevalue("s3_url")
        s3 = client(url)
        name = f"jobs/{request.node.name}"[:200].replace("[", "-").replace("]", "")

        def put_s3(key: str, data: bytes) -> None:
            s3.put_object(Bucket="ckpt", Key=f"{name}/{key}", Body=data)

        return Place(f"s3://ckpt/{name}", put_s3, CheckpointReader(cfg, lambda: client(url)))
    root = tmp_path / "store" / "jobs" / "job-1"

    def put_file(key: str, data: bytes) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return Place(f"file://{root}", put_file, CheckpointReader(cfg))


def test_the_newest_committed_step_skips_an_upload_without_its_manifest(place: Place) -> None:
    assert place.reader.newest(place.prefix) is None  # nothing there yet
    for step in (3, 10, 7):
        place.commit(step)
    place.upload_without_manifest(12)  # still uploading: not committed
    found = place.reader.newest(place.prefix)
    assert found == CommittedStep(10, f"{place.prefix}/{step_dir(10)}", 1234.5)
    assert found.to_info(99.0) == {
        "step": 10,
        "uri": f"{place.prefix}/{step_dir(10)}",
        "committed_unix_s": 1234.5,
        "read_s": 99.0,
    }


def test_only_steps_newer_than_the_known_one_are_read(place: Place) -> None:
    for step in (3, 10):
        place.commit(step)
    assert place.reader.newest(place.prefix, after_step=10) is None
    assert place.reader.newest(place.prefix, after_step=9) is not None
    place.commit(11)
    assert place.reader.newest(place.prefix, after_step=10).step == 11  # type: ignore[union-attr]


def test_committed_reads_one_step(place: Place) -> None:
    place.commit(5)
    place.upload_without_manifest(6)
    assert place.reader.committed(place.prefix, 5) is not None
    assert place.reader.committed(place.prefix, 6) is None
    assert place.reader.committed(place.prefix, 7) is None
    assert place.reader.committed(place.prefix, -1) is None
    assert place.reader.committed(place.prefix, 10**13) is None


REFUSED = {
    "step-not-its-key": manifest(99),
    "too-large": manifest(5)[:-1] + b" " * MAX_MANIFEST_BYTES + b"}",
    "not-json": b"{not json",
    "wrong-version": b'{"format_version": 2, "step": 5}',
    "ranks-missing": b'{"format_version": 1, "step": 5, "world_size": 2, "created_unix_s": 1, '
    b'"ranks": [{"rank": 0, "index_key": "k", "index_checksum": "c", "payload_bytes": 1}]}',
    "nan-time": manifest(5).replace(b'"created_unix_s": 1234.5', b'"created_unix_s": NaN'),
    "a-list": b"[1, 2, 3]",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_manifest_the_reader_refuses_counts_as_not_committed(place: Place, case: str) -> None:
    place.commit(4)
    place.commit(5, REFUSED[case])
    assert place.reader.committed(place.prefix, 5) is None
    assert place.reader.newest(place.prefix).step == 4  # type: ignore[union-attr]


def test_a_manifest_exactly_at_the_bound_is_read(place: Place) -> None:
    data = manifest(5)
    place.commit(5, data[:-1] + b" " * (MAX_MANIFEST_BYTES - len(data)) + b"}")
    assert place.reader.committed(place.prefix, 5) is not None


def test_listing_pages_through_many_steps_and_stops_at_its_bound(
    s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = client(s3_url)
    for step in range(1, 10):
        s3.put_object(Bucket="ckpt", Key=f"paged/{manifest_key(step)}", Body=manifest(step))
    calls: list[dict[str, Any]] = []
    real = s3.list_objects_v2

    def counting(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(**kwargs)

    s3.list_objects_v2 = counting
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    reader = CheckpointReader(cfg, lambda: s3)
    monkeypatch.setattr(checkpoints_module, "LIST_PAGE_KEYS", 2)
    assert reader.newest("s3://ckpt/paged").step == 9  # type: ignore[union-attr]
    assert len(calls) == 5 and calls[1]["ContinuationToken"]
    calls.clear()
    monkeypatch.setattr(checkpoints_module, "MAX_LIST_PAGES", 2)
    assert reader.newest("s3://ckpt/paged").step == 4  # type: ignore[union-attr]
    assert len(calls) == 2
    # The next read starts after what the last one found, so a long history is crossed.
    assert reader.newest("s3://ckpt/paged", after_step=4).step == 8  # type: ignore[union-attr]
    assert calls[-1]["StartAfter"] == f"paged/{step_dir(4)}~"


def test_storage_errors_raise_for_the_caller_to_log(tmp_path: Path, s3_url: str) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    reader = CheckpointReader(cfg, lambda: client(s3_url))
    with pytest.raises(Exception, match="NoSuchBucket|does not exist"):
        reader.newest("s3://no-such-bucket/jobs/j")
    with pytest.raises(ValueError, match="expected s3:// or file://"):
        reader.newest("gs://b/x")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_file_manifest_that_is_not_a_regular_file_is_refused_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    root = tmp_path / "job"
    path = root / manifest_key(5)
    path.parent.mkdir(parents=True)
    if kind == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_bytes(manifest(5))
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    out: list[Any] = []
    reading = threading.Thread(
        target=lambda: out.append(CheckpointReader(cfg).committed(f"file://{root}", 5)),
        daemon=True,
    )
    reading.start()
    reading.join(5)
    assert not reading.is_alive(), "reading a planted manifest blocked"
    assert out == [None]
