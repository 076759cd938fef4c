"""What the job API does, independent of HTTP and Ray: `JobService` over the `Store`.

Owns: turning requests into store calls with every check a user should hear about before a job
is queued: the spec's own validation (`JobSpec.from_dict`), the control plane's view
(`JobSpec.check_against`: configured priority classes and queues, and whether the `cluster`
pool as configured could ever hold the gang), who may (the API's caller, a `Principal`),
idempotent submission (keys are per user), cancellation, listing, events and logs. Every
refusal is an `ApiError` carrying the HTTP status, a message and the offending field.

Must not: talk to Ray (logs come through the `log_window` callable the controller passes in) or
start jobs (the controller's tick admits them).

"Could ever hold" is computed from the configured `cluster` pool (``num_nodes`` x
``gpus_per_node``), which is fixed in size; the admission policy separately copes with a pool
that shrank because nodes turned unhealthy (the job then waits).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from controlplane.api.access import Principal
from controlplane.api.job_views import job_to_json
from controlplane.config import Config
from controlplane.loop.tick import ADMISSION_STATE_KEY
from controlplane.loop.what_if import WhatIf
from controlplane.storage import bucket_of, check_bucket, s3_client
from controlplane.store import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    CheckpointClaimConflict,
    Event,
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    JobRecord,
    JobScan,
    JobState,
    StaleState,
    Store,
    Transition,
    UnknownJob,
)
from jobs.spec import FieldError, JobSpec, SpecError, check_checkpoint_uri
from policies.admission import AdmissionState
from policies.snapshot import QueuedJob
from serve.inputs import JsonBodyError, loads_json

__all__ = ["ApiError", "JobService", "body_json", "int_param"]

MAX_LIST_LIMIT = 10_000
DEFAULT_LIST_LIMIT = 1000
"""A listing's page when the caller names no ``limit``: never every job ever retained."""
MAX_LOG_CHUNK_BYTES = 1 << 20
"""The most log bytes one ``GET /v1/jobs/{id}/logs`` returns; clients read on from
``next_offset`` (the SDK does, following or not)."""


class ApiError(Exception):
    """A request the service refuses; `status` is the HTTP status (4xx)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        details: list[dict[str, str]] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.details = details or []
        self.retry_after_s = retry_after_s
        """Sent as ``Retry-After`` (a 429: try again in this many seconds)."""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.message, "field": self.field}
        if self.details:
            body["details"] = self.details
        return body


def _spec_error(exc: SpecError, status: int = 400) -> ApiError:
    details = [{"field": e.field, "error": e.message} for e in exc.errors]
    first = exc.errors[0] if exc.errors else None
    message = "; ".join(f"{e.field}: {e.message}" for e in exc.errors) or str(exc)
    return ApiError(status, f"invalid job spec: {message}", first.field if first else None, details)


class JobService:
    """The job API's logic over a `Store`. Thread-safe as the store is."""

    def __init__(
        self,
        store: Store,
        cfg: Config,
        *,
        log_window: Callable[[JobRecord, int, int], tuple[str, int]] | None = None,
        what_if: Callable[[QueuedJob], WhatIf | None] | None = None,
    ) -> None:
        """`log_window(job, offset, limit) -> (text, size)` reads one window of a job's log
        (`JobRunner.read_logs`); without it a job has no logs. `what_if(job)` is the control
        loop's dry run (`Loop.what_if`); without it there is none."""
        self.store = store
        self.cfg = cfg
        self._log_window = log_window
        self._what_if = what_if
        self._s3: Any = None  # the S3 client of submit-time bucket checks, made on first use

    # -- submit -----------------------------------------------------------------------------

    def cluster_node_gpus(self) -> list[int]:
        c = self.cfg.pools.cluster
        return [c.gpus_per_node] * c.num_nodes

    def submittable(self, payload: Any, principal: Principal | None) -> JobSpec:
        """The spec, valid, to a queue `principal` may submit to (else a 403 naming the queue
        and theirs)."""
        spec = self.parse_spec(payload)
        if principal is not None and not principal.may_submit_to(spec.queue):
            mine = ", ".join(sorted(principal.queues)) or "none"
            raise ApiError(
                403,
                f"{principal.name} may not submit to queue {spec.queue!r}; their queues: "
                f"{mine} (an admin binds users to queues: rcp users add --queue)",
                "queue",
            )
        return spec

    def estimated_starts(self) -> dict[str, float | None]:
        """The head of the queue's estimated start (its reservation's time, the last tick's
        admission state; None: unknown), by job id; {} when nothing is reserved."""
        state = AdmissionState.from_dict(self.store.get_value(ADMISSION_STATE_KEY, {}) or {})
        r = state.reservation
        return {} if r is None else {r.job_id: r.start_by_s}

    def dry_run(self, payload: Any, principal: Principal | None) -> dict[str, Any]:
        """What the control loop would do with the job were it submitted now
        (`controlplane.loop.what_if`): admitted or not, why, the estimated start, what would
        make room for it. Nothing is stored. 503 when no loop can answer yet."""
        spec = self.submittable(payload, principal)
        answer = None
        if self._what_if is not None:
            job = QueuedJob(
                job_id="dry-run",
                queue=spec.queue,
                priority_class=spec.priority_class,
                num_workers=spec.num_workers,
                gpus_per_worker=spec.gpus_per_worker,
                submitted_s=0.0,
                max_runtime_s=spec.max_runtime_s,
            )
            answer = self._what_if(job)
        if answer is None:
            raise ApiError(
                503, "the control loop has not observed the cluster yet; try again shortly"
            )
        return {"queue": spec.queue, "priority_class": spec.priority_class, **answer.to_json()}

    def parse_spec(self, payload: Any) -> JobSpec:
        """Validate a submitted spec against itself and the configured cluster."""
        if not isinstance(payload, Mapping):
            raise ApiError(
                400, "<spec>: the request body must be a JSON object (a job spec)", "<spec>"
            )
        data = dict(payload)
        if data.get("priority_class") is None:
            data.pop("priority_class", None)
            data["priority_class"] = self.cfg.jobs.default_priority_class
        try:
            spec = JobSpec.from_dict(data)
            spec.check_against(
                priority_classes=list(self.cfg.jobs.priority_classes),
                queues=list(self.cfg.jobs.queues),
                cluster_node_gpus=self.cluster_node_gpus(),
                step_report_interval_s=self.cfg.jobs.step_report_interval_s,
            )
            outside = check_checkpoint_uri(spec, self.cfg.storage.uri)
            if outside:
                raise SpecError(outside)
            if spec.checkpoint.uri is not None:
                self._check_checkpoint_bucket(spec.checkpoint.uri)
        except SpecError as exc:
            raise _spec_error(exc) from exc
        return spec

    def _check_checkpoint_bucket(self, uri: str) -> None:
        """A checkpoint.uri whose bucket does not exist (or the cluster cannot reach) is a
        SpecError naming the field; storage that does not answer is a 503, not the spec's."""
        bucket, _ = bucket_of(uri)
        try:
            if self._s3 is None:
                self._s3 = s3_client(self.cfg)
            why = check_bucket(self._s3, bucket)
        except Exception as exc:
            raise ApiError(
                503,
                f"checkpoint.uri: object storage did not answer whether bucket {bucket!r} "
                f"exists ({type(exc).__name__}); try again",
                "checkpoint.uri",
                retry_after_s=10,
            ) from exc
        if why is not None:
            raise SpecError([FieldError("checkpoint.uri", f"{uri!r}: {why}")])

    def submit(
        self,
        payload: Any,
        idempotency_key: str | None = None,
        principal: Principal | None = None,
    ) -> tuple[JobRecord, bool]:
        """Queue the job (or return the one this idempotency key created). (job, created).

        With a `principal` (the API's caller) the job is theirs (``owner``), and a queue they
        are not bound to is a 403 naming the queue and theirs; nothing is stored then."""
        if idempotency_key is not None and (
            not idempotency_key.strip()
            or len(idempotency_key) > 256
            or not _is_text(idempotency_key)
        ):
            raise ApiError(
                400,
                "Idempotency-Key must be 1-256 non-blank printable UTF-8 characters",
                "Idempotency-Key",
            )
        spec = self.submittable(payload, principal)
        owner = None if principal is None else principal.name
        owner_id = None if principal is None else principal.user_id
        try:
            result = self.store.submit(
                spec, idempotency_key=idempotency_key, owner=owner, owner_id=owner_id
            )
        except IdempotencyConflict as exc:
            raise ApiError(409, str(exc), "Idempotency-Key") from exc
        except CheckpointClaimConflict as exc:
            raise ApiError(409, str(exc), "checkpoint.uri") from exc
        return result.job, result.created

    # -- read -------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord:
        try:
            return self.store.get(job_id)
        except UnknownJob as exc:
            raise ApiError(404, str(exc), "id") from exc
        except InvalidJob as exc:
            raise ApiError(422, str(exc), "id") from exc

    def history(self, job_id: str) -> list[Transition]:
        try:
            return self.store.history(job_id)
        except UnknownJob as exc:
            raise ApiError(404, str(exc), "id") from exc

    def scan_jobs(
        self,
        *,
        state: str | None = None,
        queue: str | None = None,
        limit: str | None = None,
        after: str | None = None,
    ) -> JobScan:
        """One page of the listing (at most `limit`, default `DEFAULT_LIST_LIMIT`), with the
        rows skipped because they no longer validate and the cursor of the next page."""
        states = None
        if state:
            states = []
            for part in state.split(","):
                try:
                    states.append(JobState(part.strip().upper()))
                except ValueError as exc:
                    known = ", ".join(s.value for s in JobState)
                    raise ApiError(400, f"unknown state {part!r}; known: {known}", "state") from exc
        n = DEFAULT_LIST_LIMIT if limit is None else int_param("limit", limit, 1, MAX_LIST_LIMIT)
        try:
            return self.store.scan_jobs(
                states=states, queue=queue or None, limit=n, after=after or None
            )
        except ValueError as exc:
            raise ApiError(400, str(exc), "after") from exc

    def events(
        self,
        *,
        after: str | None = None,
        job_id: str | None = None,
        limit: str | None = None,
        principal: Principal | None = None,
    ) -> list[Event]:
        """Events after seq `after`. A `principal` who may not see every audit event (a
        researcher: `Principal.sees_every_audit_event`) gets only the audit events of their
        own requests; every other event is shown to all."""
        after_seq = 0 if after is None else int_param("after", after, 0, 2**62)
        n = 1000 if limit is None else int_param("limit", limit, 1, MAX_LIST_LIMIT)
        if job_id:
            self.get(job_id)
        only_audit_of = None
        if principal is not None and not principal.sees_every_audit_event:
            only_audit_of = principal.user_id or ""
        return self.store.events(
            after_seq=after_seq, job_id=job_id or None, limit=n, only_audit_of=only_audit_of
        )

    def logs(
        self, job_id: str, offset: str | None = None, limit: str | None = None
    ) -> dict[str, Any]:
        """At most `limit` (`MAX_LOG_CHUNK_BYTES`) bytes of the job's driver log from
        `offset` on (byte offsets; a character a window's edge would cut comes whole in the
        earlier window). ``next_offset`` is where the next read starts, ``size`` how long the log
        is now, and ``done`` says the job has ended and this read reached the end: a follower
        stops then (the log of every attempt only grows, so offsets stay valid)."""
        job = self.get(job_id)
        start = 0 if offset is None else int_param("offset", offset, 0, 2**62)
        n = MAX_LOG_CHUNK_BYTES
        if limit is not None:
            n = int_param("limit", limit, 1, MAX_LOG_CHUNK_BYTES)
        chunk, size = "", 0
        if job.info.get("submission_id") and self._log_window is not None:
            chunk, size = self._log_window(job, start, n)
        next_offset = max(start, min(size, start + n))
        return {
            "id": job_id,
            "state": job.state.value,
            "offset": start,
            "next_offset": next_offset,
            "size": size,
            "logs": chunk,
            "done": job.state in TERMINAL_STATES and next_offset >= size,
        }

    def queue_usage(self, principal: Principal) -> list[dict[str, Any]]:
        """Each queue `principal` may submit to, with its share of the configured cluster pool
        (``share``, ``borrowing_limit``, ``nominal_gpus``: the share x the pool's GPUs;
        admission counts live ones), the GPUs its gangs hold and its running and queued jobs,
        all and the caller's own (``mine``)."""
        configured = self.cfg.jobs.queues
        names = sorted(q for q in configured if principal.may_submit_to(q))
        pool_gpus = sum(self.cluster_node_gpus())
        counts = {(q, who): dict.fromkeys(("used_gpus", "running", "queued"), 0)
                  for q in names for who in ("all", "mine")}  # fmt: skip
        for job in self.store.list_jobs(states=ACTIVE_STATES):
            if job.spec.queue not in configured or not principal.may_submit_to(job.spec.queue):
                continue
            holds = job.state in (JobState.ADMITTED, JobState.RUNNING)
            gpus = sum((job.info.get("placement") or {}).values()) if holds else 0
            mine = job.owner_id is not None and job.owner_id == principal.user_id
            for who in ("all", "mine") if mine else ("all",):
                c = counts[(job.spec.queue, who)]
                c["used_gpus"] += int(gpus)
                c["running" if holds else "queued"] += 1
        return [
            {
                "queue": q,
                "share": configured[q].share,
                "borrowing_limit": configured[q].borrowing_limit,
                "nominal_gpus": configured[q].share * pool_gpus,
                **counts[(q, "all")],
                "mine": counts[(q, "mine")],
            }
            for q in names
        ]

    # -- cancel -----------------------------------------------------------------------------

    def cancel(self, job_id: str, principal: Principal | None = None) -> dict[str, Any]:
        """Cancel a job in any non-final state (one whose stored row no longer validates: by
        id, `Store.cancel_invalid`). Returns the API's view of the job. A `principal` who may
        not cancel this job gets a 403 naming the owner, and nothing changes."""
        if principal is not None:
            try:
                owner, owner_id = self.store.owner_of(job_id)
            except UnknownJob as exc:
                raise ApiError(404, str(exc), "id") from exc
            if not principal.may_cancel(owner_id):
                if not owner:
                    whose = "a job from before users, with no owner"
                elif owner_id is None or owner == principal.name:
                    whose = f"{owner}'s, a user since removed (a name added again is a new user)"
                else:
                    whose = f"{owner}'s"
                raise ApiError(
                    403,
                    f"{principal.name} ({principal.role}) may cancel only their own jobs; job "
                    f"{job_id} is {whose} (an operator may cancel any job)",
                    "id",
                )
        for _ in range(5):
            try:
                job = self.store.get(job_id)
            except UnknownJob as exc:
                raise ApiError(404, str(exc), "id") from exc
            except InvalidJob as exc:
                return self._cancel_invalid(job_id, exc.error)
            if job.state in TERMINAL_STATES:
                raise ApiError(
                    409, f"job {job_id} is already {job.state.value}; nothing to cancel", "id"
                )
            try:
                return job_to_json(
                    self.store.transition(
                        job_id, JobState.CANCELLED, "cancelled by the user", expected=job.state
                    )
                )
            except (StaleState, IllegalTransition):
                continue  # it moved meanwhile; look again
        raise ApiError(409, f"job {job_id} keeps changing state; try again", "id")

    def _cancel_invalid(self, job_id: str, error: str) -> dict[str, Any]:
        try:
            row = self.store.cancel_invalid(
                job_id, "cancelled by the user (its stored row no longer validates)"
            )
        except IllegalTransition as exc:
            raise ApiError(409, str(exc), "id") from exc
        info = row["info"]
        attempt = info.get("attempt")
        return {
            "id": job_id,
            "name": row["name"],
            "state": row["state"],
            "queue": row["queue"],
            "owner": row["owner"],
            "priority_class": row["priority_class"],
            "num_workers": 0,
            "gpus_per_worker": 0,
            "submitted_s": row["submitted_s"],
            "queued_s": row["queued_s"],
            "updated_s": row["updated_s"],
            "num_preemptions": row["num_preemptions"],
            "attempt": attempt if isinstance(attempt, int) else 0,
            "ray_job_id": info.get("submission_id"),
            "message": None,
            "invalid": True,
            "error": error,
        }


def _is_text(value: str) -> bool:
    """Printable and valid UTF-8 (a header's invalid bytes arrive as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return value.isprintable()


_INT_RE = re.compile(r"-?[0-9]{1,30}")


def int_param(name: str, raw: str, lo: int, hi: int) -> int:
    """An integer query parameter in lo..hi: plain ASCII digits with an optional minus sign
    (not ``1_000``, `` 5``, ``1.5``, other scripts' digits or a 5000-digit number), else 400."""
    if not isinstance(raw, str) or not _INT_RE.fullmatch(raw):
        shown = raw[:40] + "..." if isinstance(raw, str) and len(raw) > 40 else raw
        raise ApiError(400, f"{name} must be an integer in {lo}..{hi}, got {shown!r}", name)
    value = int(raw)
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must be in {lo}..{hi}, got {value}", name)
    return value


def body_json(raw: bytes) -> Any:
    """A request body's JSON, read strictly (`serve.inputs.loads_json`), else 400 naming it."""
    try:
        return loads_json(raw)
    except JsonBodyError as exc:
        what = "is not valid JSON" if exc.malformed else "is refused"
        raise ApiError(400, f"the request body {what}: {exc.message}", "<body>") from None
