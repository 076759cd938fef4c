"""Benchmark: training-visible stall per checkpoint, ours against the usual alternatives.

All measured in one run on the same state (default ~1 GiB of fp32 tensors shaped like a
model plus its Adam moments) against the same loopback S3 server (moto, in a child process):

  (a) ours       CheckpointEngine.save: snapshot to a reusable host buffer, upload in background
  (b) sync       torch.save to a local file, then boto3 upload_file (transfer manager)
  (c) ray-async  torch.save to a local dir + ray.train.report(checkpoint_upload_mode=ASYNC)
  (d) dcp-async  torch.distributed.checkpoint.async_save to a local directory
  floor          one memcpy of the same number of bytes into a preallocated buffer
  floor-threads  the same bytes copied as N equal ranges by N threads (N = our copy_threads)

and the background upload throughput of ours against boto3's transfer manager uploading
the same bytes to the same endpoint. Then restore: the saved state read back by a fresh
engine (from the S3 server, and from a local directory), timed whole, and the part of it
the restore's bounds checks took (`RestoredCheckpoint.check_s`: payload, shard and tensor
bounds and the skeleton's scan, what issue 26 added), as a share of the restore in the same
run; for this state and for the same bytes in 4,096 tensors (a skeleton 30 times larger). Stalls are medians over --repeats after two warm-up
saves (the first one's stall, including the one-time buffer allocation, is reported
separately).

    .venv/bin/python bench/bench_checkpoint.py                  # ~1 GiB, prints a table
    .venv/bin/python bench/bench_checkpoint.py --size-mb 256 --json
    .venv/bin/python bench/bench_checkpoint.py --copy-threads 1 --skip-ray   # one-thread copy

This is a benchmark, not a test: it asserts nothing; it prints the figures, the ratios and
whether each goal was met: issue 4's (at most 0.05x sync, no worse than Ray Train ASYNC,
within 2x of the one-thread memcpy floor, upload at least boto3's transfer manager) and
issue 13's (stall no worse than DCP async_save, whose staging copies with torch's intra-op
threads) and issue 26's (restore checks at most 5 % of the restore). Ours copies with several threads too, so its stall is also set against the
threaded floor (within 2x of it), the tighter of the two floors when copies scale.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

REGION = "us-east-1"
WARMUP_SAVES = 2
"""Untimed saves per method first: buffers allocated, pages faulted, server warmed up."""
MIB = 1024 * 1024

_MOTO_CHILD = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # lives until the parent closes our stdin
"""


def build_state(size_mb: int, seed: int = 0) -> dict[str, Any]:
    """A model-shaped state: 16 weight matrices and biases, Adam's two moments for each."""
    gen = torch.Generator().manual_seed(seed)
    per_tensor_elems = max(1, size_mb * MIB // 4 // 3 // 16)
    cols = 1024
    rows = max(1, per_tensor_elems // cols)
    model: dict[str, torch.Tensor] = {}
    for i in range(16):
        model[f"layers.{i}.weight"] = torch.empty(rows, cols).uniform_(generator=gen)
        model[f"layers.{i}.bias"] = torch.empty(cols).uniform_(generator=gen)
    optim = {
        "state": {
            i: {"step": torch.tensor(100.0), "exp_avg": t.clone(), "exp_avg_sq": t.clone()}
            for i, t in enumerate(model.values())
        },
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": list(range(len(model)))}],
    }
    return {"model": model, "optim": optim, "step": 100, "rng": torch.get_rng_state()}


def state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


class MotoChild:
    """moto's S3 server in a child process on a free loopback port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MOTO_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self.endpoint_url = f"http://127.0.0.1:{port}"
        import boto3
        from botocore.config import Config

        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            config=Config(retries={"max_attempts": 8, "mode": "standard"}),
        )

    def bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def empty(self, bucket: str) -> None:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": keys})

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def threaded_copy_s(dst: torch.Tensor, src: torch.Tensor, threads: int) -> float:
    """Seconds to copy `src` into `dst` as `threads` equal ranges, one per thread (this
    thread included), with torch's intra-op pool off: the floor of a threaded snapshot."""
    step = -(-src.numel() // threads)
    ranges = [(i * step, min(src.numel(), (i + 1) * step)) for i in range(threads)]
    start = threading.Barrier(threads)
    workers = [
        threading.Thread(target=lambda a=a, b=b: (start.wait(), dst[a:b].copy_(src[a:b])))
        for a, b in ranges[1:]
    ]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for worker in workers:
            worker.start()
        start.wait()
        started = time.perf_counter()
        a, b = ranges[0]
        dst[a:b].copy_(src[a:b])
        for worker in workers:
            worker.join()
        return time.perf_counter() - started
    finally:
        torch.set_num_threads(saved)


def bench_ours(
    state: Any, s3: MotoChild, repeats: int, settle_s: float, copy_threads: int | None
) -> dict[str, float]:
    """Our stall and upload rate, each paired with its baseline under the same conditions:
    the memcpy floors (one thread, then our number of threads) right before each save, and
    boto3's transfer manager uploading the same number of bytes right after each of our
    uploads finished."""
    from jobs.checkpoint import CheckpointEngine

    bucket = s3.bucket("bench-ours")
    engine = CheckpointEngine(
        f"s3://{bucket}/run",
        endpoint_url=s3.endpoint_url,
        region=REGION,
        keep_last=1,
        copy_threads=copy_threads,
    )
    threads = engine.copy_threads
    stalls, floors, floors_threads, rates, uploads, tm_rates = [], [], [], [], [], []
    tm_bucket = s3.bucket("bench-tm")
    tm_data = b""
    first_stall_s = 0.0
    floor_src = floor_dst = torch.empty(0, dtype=torch.uint8)
    for step in range(WARMUP_SAVES + repeats):
        time.sleep(settle_s)
        if step >= WARMUP_SAVES:
            floors.append(timed(lambda src=floor_src, dst=floor_dst: dst.copy_(src)))
            floors_threads.append(threaded_copy_s(floor_dst, floor_src, threads))
        handle = engine.save(state, step)
        assert handle is not None
        outcome = handle.result()
        if step == 0:
            first_stall_s = handle.stall_s
            floor_src = torch.empty(outcome.payload_bytes, dtype=torch.uint8).fill_(1)
            floor_dst = torch.empty(outcome.payload_bytes, dtype=torch.uint8).zero_()
            floor_dst.copy_(floor_src)
            tm_data = bytes(outcome.payload_bytes)
        if step < WARMUP_SAVES:
            continue
        stalls.append(handle.stall_s)
        rates.append(outcome.upload_bytes_per_s)
        uploads.append(outcome.upload_s)
        time.sleep(settle_s)
        tm_rates.append(len(tm_data) / transfer_manager_upload_s(s3, tm_bucket, tm_data))
    payload_bytes = outcome.payload_bytes
    engine.close()
    s3.empty(bucket)
    return {
        "stall_s": statistics.median(stalls),
        "floor_s": statistics.median(floors),
        "floor_threads_s": statistics.median(floors_threads),
        "copy_threads": float(threads),
        "first_stall_s": first_stall_s,
        "upload_s": statistics.median(uploads),
        "upload_bytes_per_s": statistics.median(rates),
        "transfer_manager_bytes_per_s": statistics.median(tm_rates),
        "payload_bytes": float(payload_bytes),
    }


def many_tensor_state(size_mb: int, tensors: int = 4096) -> dict[str, Any]:
    """`size_mb` MiB in `tensors` tensors: a model's parameters and, per parameter, Adam's
    step and two moments. The skeleton a restore checks grows with the tensor count."""
    params = tensors // 4
    elems = max(1, size_mb * MIB // 4 // (3 * params))
    model = {f"layers.{i}.weight": torch.full((elems,), float(i)) for i in range(params)}
    optim = {
        "state": {
            i: {"step": torch.tensor(100.0), "exp_avg": t.clone(), "exp_avg_sq": t.clone()}
            for i, t in enumerate(model.values())
        },
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "params": list(range(params))}],
    }
    return {"model": model, "optim": optim, "step": 100}


def bench_restore(
    states: dict[str, Any], s3: MotoChild, repeats: int, tmp: Path
) -> dict[str, dict[str, float]]:
    """Per state and store (the S3 server, a local directory): median seconds of a restore
    by a fresh engine (no memory tier), of its bounds checks, and their share, after one
    untimed restore."""
    from jobs.checkpoint import CheckpointEngine

    bucket = s3.bucket("bench-restore")
    stores = {
        "s3": lambda: CheckpointEngine(
            f"s3://{bucket}/run", endpoint_url=s3.endpoint_url, region=REGION
        ),
        "file": lambda: CheckpointEngine((tmp / "restore").as_uri()),
    }
    figures: dict[str, dict[str, float]] = {}
    for state_name, state in states.items():
        for store, engine_of in stores.items():
            with engine_of() as engine:
                engine.save(state, 1)
            restore_s, check_s, shares = [], [], []
            for i in range(1 + repeats):
                with engine_of() as engine:
                    started = time.perf_counter()
                    restored = engine.restore()
                    seconds = time.perf_counter() - started
                assert restored is not None and restored.step == 1 and not restored.skipped
                checks_took_s = restored.check_s
                del restored  # the restored tensors go before the next restore
                if i:
                    restore_s.append(seconds)
                    check_s.append(checks_took_s)
                    shares.append(checks_took_s / seconds)
            figures[f"{state_name}/{store}"] = {
                "restore_s": statistics.median(restore_s),
                "check_s": statistics.median(check_s),
                "check_share": statistics.median(shares),
            }
            s3.empty(bucket)
            shutil.rmtree(tmp / "restore", ignore_errors=True)
    return figures


def bench_sync(
    state: Any, s3: MotoChild, repeats: int, tmp: Path, settle_s: float
) -> dict[str, float]:
    bucket = s3.bucket("bench-sync")
    path = tmp / "sync.pt"
    stalls, saves = [], []
    for i in range(repeats):
        time.sleep(settle_s)
        save_s = timed(lambda: torch.save(state, path))
        upload_s = timed(lambda i=i: s3.client.upload_file(str(path), bucket, f"ckpt-{i}.pt"))
        stalls.append(save_s + upload_s)
        saves.append(save_s)
        s3.empty(bucket)
    path.unlink()
    s3.empty(bucket)
    return {"stall_s": statistics.median(stalls), "torch_save_s": statistics.median(saves)}


def transfer_manager_upload_s(s3: MotoChild, bucket: str, data: bytes) -> float:
    """Seconds for boto3's transfer manager (default TransferConfig) to upload `data`."""
    seconds = timed(lambda: s3.client.upload_fileobj(io.BytesIO(data), bucket, "tm.bin"))
    s3.empty(bucket)
    return seconds


def bench_dcp(state: Any, repeats: int, tmp: Path, settle_s: float) -> float:
    import torch.distributed.checkpoint as dcp

    stalls = []
    for i in range(WARMUP_SAVES + repeats):
        target = tmp / f"dcp-{i}"
        time.sleep(settle_s)
        started = time.perf_counter()
        pending = dcp.async_save(state, checkpoint_id=str(target), no_dist=True)
        stall_s = time.perf_counter() - started
        result = getattr(pending, "upload_completion", pending)
        result.result()
        if i >= WARMUP_SAVES:
            stalls.append(stall_s)
        shutil.rmtree(target, ignore_errors=True)
    return statistics.median(stalls)


def _ray_train_loop(config: dict[str, Any]) -> None:
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    state = build_state(config["size_mb"])
    stalls = []
    for i in range(config["warmup"] + config["repeats"]):
        local = tempfile.mkdtemp(prefix="bench-ray-")
        time.sleep(config["settle_s"])
        started = time.perf_counter()
        torch.save(state, os.path.join(local, "state.pt"))
        ray.train.report(
            {"i": i},
            checkpoint=Checkpoint.from_directory(local),
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        )
        stall_s = time.perf_counter() - started
        deadline_s = time.monotonic() + 600
        while os.path.exists(local) and time.monotonic() < deadline_s:
            time.sleep(0.05)  # the local copy is deleted once the async upload finished
        if i >= config["warmup"]:
            stalls.append(stall_s)
    Path(config["out"]).write_text(json.dumps(stalls))


def bench_ray_async(size_mb: int, s3: MotoChild, repeats: int, tmp: Path, settle_s: float) -> float:
    import pyarrow.fs
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    bucket = s3.bucket("bench-ray")
    out = tmp / "ray-stalls.json"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        filesystem = pyarrow.fs.S3FileSystem(
            endpoint_override=s3.endpoint_url.removeprefix("http://"),
            scheme="http",
            access_key="testing",
            secret_key="testing",
            region=REGION,
        )
        trainer = TorchTrainer(
            _ray_train_loop,
            train_loop_config={
                "size_mb": size_mb,
                "repeats": repeats,
                "warmup": WARMUP_SAVES,
                "out": str(out),
                "settle_s": settle_s,
            },
            scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
            run_config=RunConfig(
                name="bench", storage_path=f"{bucket}/ray", storage_filesystem=filesystem
            ),
        )
        result = trainer.fit()
        if result.error is not None:
            raise RuntimeError(f"Ray Train run failed: {result.error}")
    finally:
        ray.shutdown()
    s3.empty(bucket)
    return statistics.median(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="state size in MiB")
    parser.add_argument("--repeats", type=int, default=5, help="timed saves per method")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=1.0,
        help="idle time before every timed save, so the last upload's server work is done",
    )
    parser.add_argument(
        "--copy-threads",
        type=int,
        default=None,
        help="threads our snapshot copies with (default: the engine's, min(4, CPUs))",
    )
    parser.add_argument("--skip-ray", action="store_true", help="skip (c), Ray Train ASYNC")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args(argv)
    if args.size_mb < 1:
        parser.error(f"--size-mb must be >= 1, got {args.size_mb}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.copy_threads is not None and args.copy_threads < 1:
        parser.error(f"--copy-threads must be >= 1, got {args.copy_threads}")

    errors: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> Any:
        """Run one baseline; a failing baseline is reported, not fatal."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - reported in the output
            errors[name] = f"{type(exc).__name__}: {exc}"
            progress(f"{name} failed: {errors[name]}")
            return None

    state = build_state(args.size_mb)
    nbytes = state_bytes(state)
    s3 = MotoChild()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    stalls: dict[str, float | None] = {}
    try:
        ours = bench_ours(state, s3, args.repeats, args.settle_s, args.copy_threads)
        stalls["ours"] = ours["stall_s"]
        stalls["floor_memcpy"] = ours["floor_s"]
        stalls["floor_memcpy_threads"] = ours["floor_threads_s"]
        progress(
            f"ours {ours['stall_s']:.4f} s, floor {ours['floor_s']:.4f} s, "
            f"{ours['copy_threads']:.0f}-thread floor {ours['floor_threads_s']:.4f} s"
        )
        restore = bench_restore(
            {"model": state, "4096-tensors": many_tensor_state(args.size_mb)},
            s3,
            args.repeats,
            tmp,
        )
        progress(f"restore {restore}")
        sync = attempt("sync", lambda: bench_sync(state, s3, args.repeats, tmp, args.settle_s))
        stalls["sync_torch_save_upload"] = None if sync is None else sync["stall_s"]
        progress(f"sync {stalls['sync_torch_save_upload']}")
        stalls["dcp_async_save_local"] = attempt(
            "dcp", lambda: bench_dcp(state, args.repeats, tmp, args.settle_s)
        )
        progress(f"dcp {stalls['dcp_async_save_local']}")
        stalls["ray_train_async"] = (
            None
            if args.skip_ray
            else attempt(
                "ray",
                lambda: bench_ray_async(args.size_mb, s3, args.repeats, tmp, args.settle_s),
            )
        )
        progress(f"ray {stalls['ray_train_async']}")
        tm_bytes_per_s = ours["transfer_manager_bytes_per_s"]
    finally:
        s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    ours_s = stalls["ours"]
    assert ours_s is not None

    def ratio(other: str) -> float | None:
        value = stalls[other]
        return None if value is None or value == 0 else ours_s / value

    ratios = {
        "ours_over_sync": ratio("sync_torch_save_upload"),
        "ours_over_ray_async": ratio("ray_train_async"),
        "ours_over_dcp_async": ratio("dcp_async_save_local"),
        "ours_over_floor": ratio("floor_memcpy"),
        "ours_over_floor_threads": ratio("floor_memcpy_threads"),
        "upload_ours_over_transfer_manager": (
            None if not tm_bytes_per_s else ours["upload_bytes_per_s"] / tm_bytes_per_s
        ),
        **{
            f"restore_checks_over_restore_{where.replace('/', '_')}": figures["check_share"]
            for where, figures in restore.items()
        },
    }

    def goal(value: float | None, limit: float, at_most: bool = True) -> dict[str, Any]:
        met = None if value is None else (value <= limit if at_most else value >= limit)
        return {"value": value, "limit": limit, "at_most": at_most, "met": met}

    goals = {
        "stall_at_most_0.05x_sync": goal(ratios["ours_over_sync"], 0.05),
        "stall_no_worse_than_ray_async": goal(ratios["ours_over_ray_async"], 1.0),
        "stall_no_worse_than_dcp_async": goal(ratios["ours_over_dcp_async"], 1.0),
        "stall_within_2x_memcpy_floor": goal(ratios["ours_over_floor"], 2.0),
        "stall_within_2x_threaded_memcpy_floor": goal(ratios["ours_over_floor_threads"], 2.0),
        "upload_at_least_transfer_manager": goal(
            ratios["upload_ours_over_transfer_manager"], 1.0, at_most=False
        ),
        **{
            f"restore_checks_at_most_5pct_{where.replace('/', '_')}": goal(
                figures["check_share"], 0.05
            )
            for where, figures in restore.items()
        },
    }
    report = {
        "size_mb": args.size_mb,
        "state_bytes": nbytes,
        "repeats": args.repeats,
        "copy_threads": int(ours["copy_threads"]),
        "stall_s": stalls,
        "ours_first_save_stall_s": ours["first_stall_s"],
        "ours_upload_s": ours["upload_s"],
        "upload_bytes_per_s": {
            "ours": ours["upload_bytes_per_s"],
            "boto3_transfer_manager": tm_bytes_per_s,
        },
        "sync_torch_save_s": None if sync is None else sync["torch_save_s"],
        "restore": restore,
        "errors": errors,
        "ratios": ratios,
        "goals": goals,
    }

    print(f"checkpoint stall per save, {nbytes / MIB:.0f} MiB state, median of {args.repeats}")
    print(f"{'method':<28}{'stall_s':>12}{'ours / it':>12}")
    for name, value in stalls.items():
        shown = "skipped" if value is None else f"{value:.4f}"
        rel = None if value in (None, 0) or name == "ours" else ours_s / value  # type: ignore[operator]
        print(f"{name:<28}{shown:>12}{'' if rel is None else f'{rel:.3f}x':>12}")
    print(f"ours, first save (allocates buffer): {ours['first_stall_s']:.4f} s")
    print(f"ours and floor_memcpy_threads copy with {ours['copy_threads']:.0f} thread(s)")
    tm_shown = "n/a" if tm_bytes_per_s is None else f"{tm_bytes_per_s / 1e6:.1f}"
    print(
        f"upload MB/s: ours {ours['upload_bytes_per_s'] / 1e6:.1f}, "
        f"boto3 transfer manager {tm_shown}"
    )
    for where, figures in restore.items():
        print(
            f"restore {where:<20} {figures['restore_s']:.4f} s, of which bounds checks "
            f"{figures['check_s'] * 1e3:.3f} ms ({figures['check_share'] * 100:.3f} %)"
        )
    for name, error in errors.items():
        print(f"baseline {name} failed: {error}")
    for name, result in goals.items():
        met = {True: "met", False: "NOT met", None: "n/a"}[result["met"]]
        value = "n/a" if result["value"] is None else f"{result['value']:.3f}"
        print(f"goal {name:<40} {value:>8}  {met}")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
