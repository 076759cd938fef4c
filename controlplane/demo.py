"""`rcp demo`: the product's main job on the embedded default, end to end.

Owns: the sequence of steps and what it prints. Every step calls the same functions the
individual commands call; nothing here is demo-only logic.

The story: the cluster comes up serving the sample model on the owned `cluster` pool; steady
HTTP traffic starts; a training job that needs every cluster GPU is submitted; the policy
actor moves the serving replicas to the rented `external` pool make-before-break and admits
the gang; the job trains and finishes; the replicas come back a step at a time and the
external pool scales to zero. The demo lists the checkpoint objects the job wrote, prints how
many requests were served and failed (the bar is zero), and draws the run's timeline
(`controlplane.timeline`) to a PNG. `DemoResult.failures()` names what missed the bar, and
`rcp demo` exits non-zero when it names anything.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.config import Config
from controlplane.local.cluster import LocalCluster
from controlplane.local.prometheus import prometheus_url
from controlplane.ray_connection import ClusterError, connect
from controlplane.sdk import ApiError, Client
from controlplane.storage import bucket_of, s3_client
from controlplane.timeline.collect import collect
from controlplane.timeline.draw import draw_png
from controlplane.views import format_table, node_rows
from jobs.checkpoint.layout import MANIFEST_NAME, step_of_key
from serve.control.status import serve_status

Echo = Callable[[str], None]


def _section(echo: Echo, title: str) -> None:
    echo("")
    echo(f"== {title}")


class Traffic:
    """A few client threads posting to the Serve endpoint; counts answers by status and pool."""

    def __init__(self, url: str, model: str, threads: int = 2, max_duration_s: float = 900) -> None:
        self.url = f"{url}/v1/models/{model}/predict"
        self.body = json.dumps({"inputs": [[0.1 * i for i in range(16)]]}).encode()
        self.statuses: Counter[str] = Counter()
        self.pools: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_duration_s
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            req = urllib.request.Request(
                self.url, data=self.body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status, pool = str(resp.status), resp.headers.get("X-Rcp-Pool", "?")
            except urllib.error.HTTPError as exc:
                status, pool = str(exc.code), "-"
            except OSError as exc:
                status, pool = type(exc).__name__, "-"
            with self._lock:
                self.statuses[status] += 1
                self.pools[pool] += 1
            time.sleep(0.05)

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35)

    def counts(self) -> tuple[int, int]:
        """(requests served, requests failed): anything but a 200 is a failure."""
        with self._lock:
            ok = self.statuses.get("200", 0)
            return ok, sum(self.statuses.values()) - ok

    def summary(self) -> str:
        ok, failed = self.counts()
        with self._lock:
            pools = ", ".join(f"{p}={n}" for p, n in sorted(self.pools.items()))
            how = ", ".join(f"{s}={n}" for s, n in sorted(self.statuses.items()) if s != "200")
        failures = f" ({how})" if how else ""
        return f"{ok} requests served, {failed} failed{failures} (served by pool: {pools})"


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured. A field is None when the demo did not get that far (serving
    turned off: no traffic and no job)."""

    requests_served: int = 0
    requests_failed: int = 0
    job_state: str | None = None
    checkpoints_committed: int | None = None
    """Steps of the job with a manifest in object storage after the run."""

    def failures(self) -> list[str]:
        """Each way the run missed the bar, as a sentence; empty when it met it."""
        out = []
        if self.requests_failed:
            total = self.requests_served + self.requests_failed
            out.append(f"{self.requests_failed} of {total} requests failed")
        if self.job_state is not None and self.job_state != "SUCCEEDED":
            out.append(f"the training job ended {self.job_state}, not SUCCEEDED")
        if self.checkpoints_committed == 0:
            out.append("the training job committed no checkpoint to object storage")
        return out


MAX_LISTED_OBJECTS = 1000
"""The most checkpoint objects the demo lists (a larger job says how many it left out)."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    """The key under the job's checkpoint prefix (``step-000000000004/manifest.json``)."""
    size_bytes: int


def list_checkpoint_objects(
    s3: Any, uri: str, max_objects: int = MAX_LISTED_OBJECTS
) -> tuple[list[StoredObject], bool]:
    """The objects under the checkpoint prefix `uri` (``s3://bucket/prefix/``), keys relative
    to it, in key order; and whether there were more than `max_objects`."""
    bucket, prefix = bucket_of(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    found: list[StoredObject] = []
    token: str | None = None
    while True:
        args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": 1000}
        if token:
            args["ContinuationToken"] = token
        page = s3.list_objects_v2(**args)
        for item in page.get("Contents") or ():
            if len(found) >= max_objects:
                return found, True
            found.append(StoredObject(item["Key"][len(prefix) :], int(item.get("Size", 0))))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return found, False


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_checkpoint_objects(
    uri: str, objects: list[StoredObject], truncated: bool = False
) -> list[str]:
    """Lines that show `objects` grouped by step, each step committed or not (its manifest
    marked), then anything outside the checkpoint layout."""
    if not objects:
        return [f"no checkpoint objects under {uri}"]
    total = sum(o.size_bytes for o in objects)
    more = f", more not listed (over {len(objects)})" if truncated else ""
    lines = [f"{uri}: {len(objects)} objects, {_size(total)}{more}"]
    by_step: dict[int, list[StoredObject]] = {}
    other: list[StoredObject] = []
    for o in objects:
        step = step_of_key(o.key)
        if step is None:
            other.append(o)
        else:
            by_step.setdefault(step, []).append(o)
    width = max(len(o.key) for o in objects)
    for step in sorted(by_step):
        group = by_step[step]
        committed = any(o.key.endswith("/" + MANIFEST_NAME) for o in group)
        state = "committed" if committed else "not committed (no manifest)"
        size = _size(sum(o.size_bytes for o in group))
        count = f"{len(group)} object{'s' if len(group) != 1 else ''}"
        lines.append(f"  step {step}: {state}, {count}, {size}")
        for o in group:
            mark = "  <- manifest (the commit)" if o.key.endswith("/" + MANIFEST_NAME) else ""
            lines.append(f"    {o.key.ljust(width)}  {_size(o.size_bytes):>10}{mark}")
    if other:
        lines.append("  outside any step:")
        lines += [f"    {o.key.ljust(width)}  {_size(o.size_bytes):>10}" for o in other]
    return lines


def committed_steps(objects: list[StoredObject]) -> list[int]:
    """Steps whose manifest is among `objects`."""
    return sorted(
        {
            step
            for o in objects
            if o.key.endswith("/" + MANIFEST_NAME) and (step := step_of_key(o.key)) is not None
        }
    )


def _serve_line(model: str) -> str:
    pools = serve_status()["models"][model]["pools"]
    return ", ".join(
        f"{pool}: {p['running']} running (target {p['target']}, weight {p['weight']:.2f})"
        for pool, p in pools.items()
    )


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise ClusterError(f"demo: timed out after {timeout_s:.0f}s waiting for {what}")


DEFAULT_TIMELINE = Path("rcp-demo-timeline.png")
"""Where the demo draws its timeline unless told otherwise (relative: the current directory)."""
METRICS_EXPORT_S = 10.0
"""About how often Ray's metrics agent exports the control plane's gauges (Ray's default)."""


def draw_timeline(
    client: Client, prometheus_url: str | None, start_s: float, path: Path, echo: Echo
) -> None:
    """The run's timeline as a PNG at `path`; says where, and what it lacks."""
    try:
        inputs = collect(
            lambda after, limit: client.events(after=after, limit=limit),
            prometheus_url,
            start_s,
            time.time(),
        )
        draw_png(inputs.timeline(), path)
    except (ApiError, OSError) as exc:
        echo(f"timeline not drawn: {exc}")
        return
    echo(f"timeline (replicas, GPUs, traffic, decisions): {path.resolve()}")
    for note in inputs.notes:
        echo(f"  note: {note}")


def run_demo(
    cfg: Config,
    keep: bool = False,
    echo: Echo = print,
    timeline_path: Path = DEFAULT_TIMELINE,
) -> DemoResult:
    """Run the story (the module docstring) and return what it measured; the timeline goes to
    `timeline_path`. Raises ClusterError when a step cannot finish (the cluster is still taken
    down unless `keep`)."""
    started_s = time.time()
    cluster = LocalCluster(cfg)
    _section(echo, "up")
    cluster.up(echo=echo)
    traffic: Traffic | None = None
    try:
        running = cluster.running_config() or cfg
        connect(running)
        _section(echo, "nodes")
        echo(format_table(node_rows()))

        if not running.serve.deploy_app or not running.serving.models:
            echo("serving is off (serve.deploy_app=false or no models): nothing more to show")
            return DemoResult()
        model = running.serving.models[0].name
        _section(echo, f"serving {model} on the cluster pool, with steady traffic")
        traffic = Traffic(f"http://{running.ray.node_ip}:{running.serve.http_port}", model).start()
        time.sleep(3)
        echo(_serve_line(model))

        c = running.pools.cluster
        gpus_per_worker = c.gpus_per_node
        client = Client(state_dir=running.state_path)
        job = client.submit(
            {
                "name": "demo-claims-the-cluster",
                "entrypoint": "jobs.examples.train_mnistlike:train_loop",
                "num_workers": c.num_nodes,
                "gpus_per_worker": gpus_per_worker,
                "priority_class": "high",
                "runtime_env": {
                    "env_vars": {
                        "RCP_TRAIN_CONFIG": json.dumps(
                            {"num_steps": 10, "checkpoint_every": 5, "step_sleep_s": 1.0}
                        )
                    }
                },
            }
        )
        _section(
            echo,
            f"training job {job.id} asks for every cluster GPU "
            f"({c.num_nodes} workers x {gpus_per_worker} GPUs)",
        )
        _wait(lambda: client.status(job.id).state in {"RUNNING", "SUCCEEDED"}, 600, "the gang")
        echo(f"job {job.id}: {client.status(job.id).state}")
        echo(_serve_line(model))
        echo(format_table(node_rows()))

        final = client.wait(job.id, timeout_s=600, poll_s=2.0)
        echo(f"job {job.id}: {final.state}")
        uri = final.checkpoint_uri or f"{running.storage.uri.rstrip('/')}/jobs/{job.id}/"
        _section(echo, "checkpoints the job wrote to object storage")
        objects, truncated = list_checkpoint_objects(s3_client(running), uri)
        for line in format_checkpoint_objects(uri, objects, truncated):
            echo(line)
        _section(echo, "the cluster is idle again: replicas come back a step at a time")

        def back() -> bool:
            pools = serve_status()["models"][model]["pools"]
            return bool(pools["external"]["target"] == 0 and pools["cluster"]["running"] > 0)

        _wait(back, running.placement.migrate_back_idle_s + 300, "replicas to come back")
        echo(_serve_line(model))
        traffic.stop()
        _section(echo, "what the policy actor did")
        for e in client.events(limit=1000):
            if e["kind"].startswith(("serve.move", "serve.scale", "serve.external", "policy.")):
                echo(f"{e['kind']}: {e['message']}")
        _section(echo, "traffic during all of it")
        echo(traffic.summary())
        _section(echo, "the timeline")
        prometheus = prometheus_url(cfg) if running.observability.prometheus else None
        if prometheus is not None:
            # The replicas' return reaches Prometheus one export and a scrape after it happened:
            # draw once it is there, or the picture ends before the story does.
            time.sleep(METRICS_EXPORT_S + 2 * running.observability.scrape_interval_s)
        draw_timeline(client, prometheus, started_s, timeline_path, echo)
        served, failed = traffic.counts()
        return DemoResult(served, failed, final.state, len(committed_steps(objects)))
    finally:
        if traffic is not None:
            traffic.stop()
        if not keep:
            _section(echo, "down")
            cluster.down(echo=echo)
