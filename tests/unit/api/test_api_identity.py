"""Users, roles, ownership, audit and rate limits of the API, against a real loopback server
(`ApiServer` on port 0, the real `JobService`, a real SQLite store, and the operator routes
over the control loop on fake adapters, `tests.unit.loop_fakes`). No Ray.

The role matrix walks every route the app registers (`ROUTE_ACTIONS`), so a route added later
is covered as soon as it exists, and fails the test until `EXPECTED_ACTIONS` names it.
"""

from __future__ import annotations

import http.client
import json
import re
import sqlite3
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.access import ROLE_ACTIONS, ROUTE_ACTIONS, Action, Role
from controlplane.api.jobs import JobService
from controlplane.api.operations import Operations
from controlplane.api.routes import ApiServer
from controlplane.config import Config, load_config
from controlplane.sdk import AuthError, Client, Forbidden
from controlplane.store import ADMIN_ROLE, SCHEMA_VERSION, JobState, Store
from controlplane.tokens import token_hash
from jobs.spec import JobSpec
from tests.unit.api.test_api_operations import EXPECTED_ACTIONS as OPERATOR_ACTIONS
from tests.unit.loop.test_loop_claim import world

ADMIN_TOKEN = "admin-token-" + "x" * 32
QUEUES = ("default", "team-a", "team-b")

EXPECTED_ACTIONS: dict[str, Action] = {
    "jobs.submit": Action.SUBMIT,
    "jobs.dry-run": Action.SUBMIT,
    "jobs.list": Action.READ,
    "jobs.get": Action.READ,
    "jobs.cancel": Action.CANCEL,
    "jobs.logs": Action.READ,
    "events.list": Action.READ,
    "whoami": Action.READ,
    "users.list": Action.MANAGE_USERS,
    "users.add": Action.MANAGE_USERS,
    "users.remove": Action.MANAGE_USERS,
    "users.rotate-token": Action.MANAGE_USERS,
    "healthz": Action.PUBLIC,
    **OPERATOR_ACTIONS,
}
"""Every route and the action it needs: what the role matrix holds each route to (the
operator routes' table is test_api_operations')."""


class FakeClock:
    """The rate limits' monotonic clock; time moves only when a test says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class Api:
    """A real loopback API over a temp store; raw HTTP so statuses are what clients see."""

    def __init__(self, tmp: Path, *overrides: str) -> None:
        queues = [f"jobs.queues.{q}.share=0.3" for q in QUEUES]
        self.world = world(tmp, *queues, *overrides)
        self.cfg: Config = self.world.cfg
        self.store: Store = self.world.store
        self.service = JobService(self.store, self.cfg, what_if=self.world.loop.what_if)
        operations = Operations(
            self.cfg,
            self.world.loop,
            serve_status=lambda: {"deployed": True, "models": {}},
            inject_fault=lambda node_id, kind: {"node_id": node_id, "faults": [kind]},
        )
        self.clock = FakeClock()
        self.server = ApiServer(
            self.service, ADMIN_TOKEN, "127.0.0.1", 0, clock=self.clock, operations=operations
        ).start()
        self.url = self.server.url
        self.app = self.server.app

    def call(
        self,
        method: str,
        path: str,
        token: str | None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        data = (
            raw_body
            if raw_body is not None
            else (None if body is None else json.dumps(body).encode())
        )
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null"), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)

    def add_user(self, name: str, role: str, queues: list[str]) -> str:
        status, body, _ = self.call(
            "POST", "/v1/users", ADMIN_TOKEN, {"name": name, "role": role, "queues": queues}
        )
        assert status == 201, body
        return str(body["token"])

    def close(self) -> None:
        self.server.stop()
        self.store.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    a = Api(tmp_path_factory.mktemp("identity"), "api.rate_burst=100000")
    yield a
    a.close()


def job(queue: str = "default", name: str = "t") -> dict[str, Any]:
    return {"name": name, "entrypoint": "python train.py", "num_workers": 1, "queue": queue}


def check_store(store: Store) -> None:
    """The store's invariants: every job row parses, every user is well formed, an admin is
    left, and no token is stored in the clear."""
    assert store.scan_jobs().invalid == []
    users, _ = store.list_users(limit=10_000)
    assert any(u.role == ADMIN_ROLE for u in users)
    for u in users:
        assert u.role in {r.value for r in Role}
        assert re.fullmatch(r"[0-9a-f]{64}", u.token_hash)
        assert all(isinstance(q, str) for q in u.queues)
    with sqlite3.connect(store.path) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(users)")}
    assert "token" not in columns


# -- the role matrix ---------------------------------------------------------------------------


def test_every_route_is_in_the_expected_table(api: Api) -> None:
    assert dict(api.app[ROUTE_ACTIONS]) == EXPECTED_ACTIONS


def test_the_role_table_is_the_issues() -> None:
    """researcher: read, submit, cancel (own); operator: plus operate; admin: plus users."""
    base = {Action.PUBLIC, Action.READ, Action.SUBMIT, Action.CANCEL}
    assert {
        Role.RESEARCHER: base,
        Role.OPERATOR: base | {Action.OPERATE},
        Role.ADMIN: base | {Action.OPERATE, Action.MANAGE_USERS},
    } == ROLE_ACTIONS


def _route(api: Api, name: str) -> tuple[str, str]:
    resource = api.app.router[name]
    (route,) = [r for r in resource if r.method != "HEAD"]
    return route.method, resource.canonical


@pytest.mark.parametrize("role", list(Role), ids=[r.value for r in Role])
def test_role_matrix_over_every_route(api: Api, role: Role) -> None:
    """Each role on each registered route: 403 exactly where ROLE_ACTIONS says the role lacks
    the route's action, else an answer of the route itself (2xx or a domain error), never a
    401 or 500. Path parameters name the caller's own job and a throwaway user."""
    caller = f"matrix-{role.value}"
    token = api.add_user(caller, role.value, ["default"])
    own = api.store.submit(
        JobSpec.from_dict(job()), owner=caller, owner_id=api.store.get_user(caller).user_id
    ).job.job_id
    for name, action in api.app[ROUTE_ACTIONS].items():
        method, canonical = _route(api, name)
        victim = f"victim-{role.value}-{name.replace('.', '-')}"
        api.add_user(victim, "researcher", [])
        path = canonical.replace("{id}", own).replace("{name}", victim)
        path = re.sub(r"\{[a-z_]+\}", "x", path)  # parameters of routes added later
        body = {"users.add": {"name": victim + "-new", "role": "researcher", "queues": []}}.get(
            name, job() if name in ("jobs.submit", "jobs.dry-run") else None
        )
        status, answer, _ = api.call(method, path, token, body)
        allowed = action in ROLE_ACTIONS[role]
        where = f"{role.value} {method} {path} ({name}, {action}): {status} {answer}"
        assert status not in (401, 500), where
        if allowed:
            assert status != 403, where
        else:
            assert status == 403, where
            assert str(action) in answer["error"] and caller in answer["error"], where


# -- ownership ---------------------------------------------------------------------------------


def test_a_researcher_cannot_cancel_another_researchers_job(api: Api) -> None:
    alice = Client(api.url, api.add_user("alice", "researcher", ["team-a"]))
    bob = Client(api.url, api.add_user("bob", "researcher", ["team-b"]))
    mine = alice.submit(job("team-a"))
    assert mine.owner == "alice"
    with pytest.raises(Forbidden, match="alice's") as refused:
        bob.cancel(mine.id)
    assert refused.value.status == 403
    assert alice.status(mine.id).state == JobState.QUEUED.value  # nothing changed
    assert alice.cancel(mine.id).state == JobState.CANCELLED.value


def test_an_operator_cancels_anyones_job(api: Api) -> None:
    carol = Client(api.url, api.add_user("carol", "researcher", ["team-a"]))
    oscar = Client(api.url, api.add_user("oscar", "operator", []))
    theirs = carol.submit(job("team-a"))
    assert oscar.cancel(theirs.id).state == JobState.CANCELLED.value


def test_a_job_from_before_users_is_cancelled_by_operators_only(api: Api) -> None:
    old = api.store.submit(JobSpec.from_dict(job())).job.job_id  # no owner
    dave = Client(api.url, api.add_user("dave", "researcher", ["default"]))
    with pytest.raises(Forbidden, match="before users"):
        dave.cancel(old)
    assert Client(api.url, ADMIN_TOKEN).cancel(old).state == JobState.CANCELLED.value


def test_a_name_removed_and_added_again_does_not_inherit_the_old_users_jobs(api: Api) -> None:
    """Jobs belong to the user's id, not the name: the second "quinn" may not cancel the
    first one's job (403 saying why), and her own idempotency key is not the first's."""
    admin = Client(api.url, ADMIN_TOKEN)
    first = Client(api.url, api.add_user("quinn", "researcher", ["default"]))
    old_job = first.submit(job(name="old"), idempotency_key="nightly")
    admin.users_remove("quinn")
    second = Client(api.url, api.add_user("quinn", "researcher", ["default"]))
    with pytest.raises(Forbidden, match="since removed") as refused:
        second.cancel(old_job.id)
    assert refused.value.status == 403
    assert second.status(old_job.id).state == JobState.QUEUED.value
    mine = second.submit(job(name="old"), idempotency_key="nightly")
    assert mine.id != old_job.id and mine.owner == "quinn"
    assert second.cancel(mine.id).state == JobState.CANCELLED.value
    assert admin.cancel(old_job.id).state == JobState.CANCELLED.value


def test_idempotency_keys_are_each_users_own(api: Api) -> None:
    """The same key from two users is two jobs; a retry by one user is their one job."""
    rita = Client(api.url, api.add_user("rita", "researcher", ["default"]))
    sam = Client(api.url, api.add_user("sam", "researcher", ["default"]))
    ritas = rita.submit(job(name="k"), idempotency_key="shared-key")
    sams = sam.submit(job(name="k"), idempotency_key="shared-key")
    assert ritas.id != sams.id and (ritas.owner, sams.owner) == ("rita", "sam")
    assert rita.submit(job(name="k"), idempotency_key="shared-key").id == ritas.id
    status, body, _ = api.call(
        "POST", "/v1/jobs", api.add_user("tess", "researcher", ["default"]), job(name="other"),
        headers={"Idempotency-Key": "shared-key"},
    )  # fmt: skip
    assert status == 201 and body["id"] not in (ritas.id, sams.id)


def test_submit_to_an_unbound_queue_is_403_naming_both_and_stores_nothing(api: Api) -> None:
    token = api.add_user("erin", "researcher", ["team-a"])
    before = len(api.store.list_jobs())
    status, body, _ = api.call("POST", "/v1/jobs", token, job("team-b"))
    assert status == 403 and body["field"] == "queue"
    assert "'team-b'" in body["error"] and "team-a" in body["error"]
    assert len(api.store.list_jobs()) == before


def test_owner_shows_in_listings_and_the_cli_tables(api: Api) -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    token = api.add_user("frank", "researcher", ["default"])
    submitted = Client(api.url, token).submit(job(name="frankjob"))
    env = {"RCP_API_URL": api.url, "RCP_API_TOKEN": token}
    for command in (["queue"], ["status"]):
        out = CliRunner().invoke(cli, command, env=env)
        assert out.exit_code == 0, out.output
        row = next(line for line in out.output.splitlines() if submitted.id in line)
        assert "frank" in row.split()
    listed = Client(api.url, token).list()
    assert {j.owner for j in listed if j.id == submitted.id} == {"frank"}


# -- users, tokens -----------------------------------------------------------------------------


def test_whoami_and_the_bootstrap_admin(api: Api) -> None:
    me = Client(api.url, ADMIN_TOKEN).whoami()
    assert (me["name"], me["role"], me["queues"]) == ("admin", "admin", ["*"])
    assert [s["queue"] for s in me["shares"]] == sorted(QUEUES)  # "*": every queue


def test_whoami_shows_each_of_the_callers_queues_with_its_share_and_use(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    a = Api(tmp_path, "api.rate_burst=100000")
    try:
        token = a.add_user("ivy", "researcher", ["team-a"])
        admin = Client(a.url, ADMIN_TOKEN)
        mine = Client(a.url, token).submit(job("team-a"))
        other = admin.submit(job("team-a"))
        admin.submit(job("default"))  # not ivy's queue: not shown to her
        a.store.transition(other.id, JobState.ADMITTED, "test", info={"placement": {"n1": 1}})
        me = Client(a.url, token).whoami()
        [row] = me["shares"]
        pool_gpus = a.cfg.pools.cluster.num_nodes * a.cfg.pools.cluster.gpus_per_node
        assert (row["queue"], row["share"], row["borrowing_limit"]) == ("team-a", 0.3, None)
        assert row["nominal_gpus"] == pytest.approx(0.3 * pool_gpus)
        assert (row["used_gpus"], row["running"], row["queued"]) == (1, 1, 1)
        assert row["mine"] == {"used_gpus": 0, "running": 0, "queued": 1}
        assert mine.state == "QUEUED"
        env = {"RCP_API_URL": a.url, "RCP_API_TOKEN": token}
        out = CliRunner().invoke(cli, ["whoami"], env=env)
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        assert lines[0] == "ivy (researcher), queues: team-a"
        assert lines[1].split()[:3] == ["QUEUE", "SHARE", "NOMINAL"]
        assert lines[2].split()[:6] == ["team-a", "30%", f"{0.3 * pool_gpus:g}", "1", "1", "1"]
        assert lines[2].endswith("0 GPUs, 0 running, 1 queued")
    finally:
        a.close()


def test_rotation_stops_the_old_token_on_the_next_request(api: Api) -> None:
    admin = Client(api.url, ADMIN_TOKEN)
    old = api.add_user("gina", "researcher", ["default"])
    assert Client(api.url, old).whoami()["name"] == "gina"
    rotated = admin.users_rotate_token("gina")
    assert rotated.token and rotated.token != old
    with pytest.raises(AuthError, match="rotated") as refused:
        Client(api.url, old).whoami()
    assert refused.value.status == 401 and "gina" not in refused.value.message
    assert Client(api.url, rotated.token).whoami()["name"] == "gina"


def test_a_removed_users_token_is_401_at_once(api: Api) -> None:
    token = api.add_user("hank", "researcher", ["default"])
    Client(api.url, ADMIN_TOKEN).users_remove("hank")
    status, body, _ = api.call("GET", "/v1/jobs", token)
    assert status == 401 and "removed" in body["error"] and "hank" not in body["error"]


def test_an_expired_token_is_401(api: Api) -> None:
    token = api.add_user("ivy", "researcher", ["default"])
    assert api.call("GET", "/v1/whoami", token)[0] == 200
    api.store.rotate_token("ivy", token_hash(token), expires_s=1.0)  # long past
    status, body, _ = api.call("GET", "/v1/whoami", token)
    assert status == 401 and "expired" in body["error"]


def test_a_token_with_a_future_expiry_works(api: Api) -> None:
    user = Client(api.url, ADMIN_TOKEN).users_add(
        "jack", "researcher", ["default"], expires_in_s=3600
    )
    assert user.expires_s is not None and user.expires_s > user.created_s
    assert user.token is not None and Client(api.url, user.token).whoami()["name"] == "jack"


def test_the_last_admin_cannot_be_removed(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        status, body, _ = api.call("DELETE", "/v1/users/admin", ADMIN_TOKEN)
        assert status == 409 and "last admin" in body["error"]
        second = api.add_user("kate", "admin", [])
        assert api.call("DELETE", "/v1/users/admin", second)[0] == 200
        status, body, _ = api.call("DELETE", "/v1/users/kate", second)
        assert status == 409 and "last admin" in body["error"]
        assert [u.name for u in Client(api.url, second).users_list()] == ["kate"]
        check_store(api.store)
    finally:
        api.close()


def test_the_only_working_admin_is_kept_while_another_admins_token_has_expired(
    tmp_path: Path,
) -> None:
    """The review's finding: with a second admin whose token expired, removing the one admin
    who can sign in was 200, and then nobody could manage users. Now 409, and giving that
    admin an expiring token is 409 too (it would leave none once it expires)."""
    api = Api(tmp_path)
    try:
        api.add_user("kept", "admin", [])
        api.store.rotate_token("kept", token_hash("x" * 43), expires_s=1.0)  # long past
        status, body, _ = api.call("DELETE", "/v1/users/admin", ADMIN_TOKEN)
        assert status == 409 and "last admin who can sign in" in body["error"], body
        status, body, _ = api.call(
            "POST", "/v1/users/admin/rotate-token", ADMIN_TOKEN, {"expires_in_s": 3600}
        )
        assert status == 409 and body["field"] == "expires_in_s", body
        assert "never expires" in body["error"]
        assert api.call("GET", "/v1/whoami", ADMIN_TOKEN)[0] == 200  # nothing changed
        assert api.call("DELETE", "/v1/users/kept", ADMIN_TOKEN)[0] == 200
    finally:
        api.close()


def test_recover_admin_beside_a_running_api_works_on_the_next_request(tmp_path: Path) -> None:
    """Every admin lost (an older version let it happen: here the only admin's token is
    made to expire in the store); `rcp users recover-admin` with the controller's state dir
    gives a token the running API accepts at once, no restart."""
    from click.testing import CliRunner

    from controlplane.cli.users import users_group

    api = Api(tmp_path)
    try:
        with sqlite3.connect(api.store.path) as db:
            db.execute("UPDATE users SET expires_s = 1.0 WHERE name = 'admin'")
        assert api.call("GET", "/v1/users", ADMIN_TOKEN)[0] == 401
        out = CliRunner().invoke(
            users_group, ["recover-admin", "--state-dir", str(api.cfg.state_path)], env={}
        )
        assert out.exit_code == 0, out.stderr
        token = out.stdout.strip()
        status, body, _ = api.call("GET", "/v1/users", token)
        assert status == 200 and "admin" in [u["name"] for u in body["users"]]
        kinds = [e["kind"] for e in Client(api.url, token).events()]
        assert "audit.users.recover-admin" in kinds
    finally:
        api.close()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "Bad Name", "role": "researcher", "queues": []}, "name"),
        ({"name": "x" * 64, "role": "researcher", "queues": []}, "name"),
        ({"name": "ok", "role": "root", "queues": []}, "role"),
        ({"name": "ok", "role": "researcher", "queues": ["nope"]}, "queues"),
        ({"name": "ok", "role": "researcher", "queues": "default"}, "queues"),
        ({"name": "ok", "role": "researcher", "queues": [], "expires_in_s": -1}, "expires_in_s"),
        ({"name": "ok", "role": "researcher", "queues": [], "expires_in_s": True}, "expires_in_s"),
        ({"name": "ok", "role": "researcher", "queues": [], "admin": True}, "admin"),
        (["not", "an", "object"], "<body>"),
    ],
    ids=[
        "name-spaces", "name-long", "role", "queue-unknown", "queues-str", "expiry-negative",
        "expiry-bool", "unknown-key", "not-object",
    ],
)  # fmt: skip
def test_bad_user_bodies_are_400_naming_the_field_and_change_nothing(
    api: Api, body: Any, field: str
) -> None:
    before = api.store.count_users()
    status, answer, _ = api.call("POST", "/v1/users", ADMIN_TOKEN, body)
    assert status == 400 and answer["field"] == field, answer
    assert api.store.count_users() == before


def test_adding_a_user_twice_is_409(api: Api) -> None:
    api.add_user("lena", "researcher", [])
    status, body, _ = api.call(
        "POST", "/v1/users", ADMIN_TOKEN, {"name": "lena", "role": "admin", "queues": []}
    )
    assert status == 409 and body["field"] == "name"
    assert api.store.get_user("lena").role == "researcher"


def test_users_list_pages_and_never_shows_tokens(api: Api) -> None:
    for i in range(5):
        api.add_user(f"page-{i}", "researcher", [])
    status, first, _ = api.call("GET", "/v1/users?limit=2", ADMIN_TOKEN)
    assert status == 200 and len(first["users"]) == 2 and first["next"]
    seen = [u["name"] for u in first["users"]]
    after = first["next"]
    while after:
        _, page, _ = api.call("GET", f"/v1/users?limit=2&after={after}", ADMIN_TOKEN)
        seen += [u["name"] for u in page["users"]]
        after = page["next"]
    assert seen == sorted(seen) and len(seen) == api.store.count_users()
    assert all("token" not in u and "token_hash" not in u for u in first["users"])


# -- audit -------------------------------------------------------------------------------------


def test_state_changing_calls_are_audited_with_the_user_including_refusals(api: Api) -> None:
    token = api.add_user("mona", "researcher", ["default"])
    after = api.store.events()[-1].seq
    submitted = Client(api.url, token).submit(job())
    api.call("POST", "/v1/users", token, {"name": "sneaky", "role": "admin", "queues": []})
    api.call("GET", "/v1/jobs", token)  # a read: not audited
    api.call("POST", f"/v1/jobs/{submitted.id}/cancel", token, headers={"X-Request-Id": "r-1"})
    audit = [e for e in api.store.events(after_seq=after) if e.kind.startswith("audit.")]
    assert [(e.kind, e.data["status"]) for e in audit] == [
        ("audit.jobs.submit", 201),
        ("audit.users.add", 403),
        ("audit.jobs.cancel", 200),
    ]
    assert all(e.data["user"] == "mona" and e.data["role"] == "researcher" for e in audit)
    assert audit[2].data["params"] == {"id": submitted.id}
    assert audit[2].data["request_id"] == "r-1"
    assert audit[0].data["subject"] == {"job_id": submitted.id, "queue": "default"}
    assert audit[1].data["subject"] == {}  # refused before its body was read
    assert [e.job_id for e in audit] == [submitted.id, None, submitted.id]
    mine = Client(api.url, token).events(job_id=submitted.id)
    assert {e["kind"] for e in mine} >= {"audit.jobs.submit", "audit.jobs.cancel"}
    status, added, _ = api.call(
        "POST", "/v1/users", ADMIN_TOKEN, {"name": "nora", "role": "operator", "queues": []}
    )
    assert status == 201
    (event,) = [e for e in api.store.events(kind_prefix="audit.users.add")][-1:]
    assert event.data["subject"] == {"name": "nora", "role": "operator"}
    assert "nora" in event.message and added["token"] not in json.dumps(dict(event.data))
    shown = Client(api.url, token).events(after=after)
    assert {e["kind"] for e in shown} >= {"audit.jobs.submit", "audit.users.add"}


def test_a_researcher_reads_only_their_own_audit_events(api: Api) -> None:
    """Audit events name users and roles, which only manage-users may list: a researcher's
    GET /v1/events keeps every other event but only the audit events of their own requests;
    an operator and an admin see all of them."""
    after = api.store.events()[-1].seq
    uma = api.add_user("uma", "researcher", ["default"])
    vic = api.add_user("vic", "researcher", ["default"])
    uma_job = Client(api.url, uma).submit(job(name="uma"))
    Client(api.url, vic).submit(job(name="vic"))
    api.call("POST", "/v1/users", vic, {"name": "x", "role": "admin", "queues": []})  # 403
    everyone = api.store.events(after_seq=after)
    audit_users = {str(e.data["user"]) for e in everyone if e.kind.startswith("audit.")}
    assert audit_users == {"admin", "uma", "vic"}  # what there is to hide
    seen = Client(api.url, uma).events(after=after)
    audited = [e for e in seen if e["kind"].startswith("audit.")]
    assert [(e["kind"], e["data"]["user"]) for e in audited] == [("audit.jobs.submit", "uma")]
    assert "vic" not in json.dumps(audited) and "admin" not in json.dumps(audited)
    assert {e["seq"] for e in seen} == {
        e.seq for e in everyone if not e.kind.startswith("audit.")
    } | {audited[0]["seq"]}
    assert [e["kind"] for e in Client(api.url, uma).events(job_id=uma_job.id)] == [
        "job.state",
        "audit.jobs.submit",
    ]
    oscar = api.add_user("oscar-events", "operator", [])
    assert len(Client(api.url, oscar).events(after=after)) >= len(everyone)
    assert len(Client(api.url, ADMIN_TOKEN).events(after=after)) >= len(everyone)


def test_unauthenticated_requests_are_not_audited(api: Api) -> None:
    after = api.store.events()[-1].seq
    assert api.call("POST", "/v1/jobs", "wrong", job())[0] == 401
    assert [e for e in api.store.events(after_seq=after) if e.kind.startswith("audit.")] == []


# -- rate limits -------------------------------------------------------------------------------


def test_a_flooding_client_gets_429_while_another_user_submits(tmp_path: Path) -> None:
    api = Api(tmp_path, "api.rate_limit_per_s=1", "api.rate_burst=5")
    try:
        flooder = api.add_user("flood", "researcher", ["default"])
        other = api.add_user("calm", "researcher", ["default"])
        answers = [api.call("GET", "/v1/jobs", flooder) for _ in range(20)]
        statuses = [s for s, _, _ in answers]
        assert statuses[:5] == [200] * 5 and set(statuses[5:]) == {429}
        _, body, headers = answers[-1]
        assert headers["Retry-After"] == "1" and "flood" in body["error"]
        status, submitted, _ = api.call("POST", "/v1/jobs", other, job())
        assert status == 201 and submitted["owner"] == "calm"
        api.clock.now_s += 1.0  # one second refills one request
        assert api.call("GET", "/v1/jobs", flooder)[0] == 200
        assert api.call("GET", "/v1/jobs", flooder)[0] == 429
    finally:
        api.close()


def test_a_flood_from_many_threads_leaves_another_users_submits_alone(tmp_path: Path) -> None:
    """Four threads hammer the API with one user's token while another user submits: the
    flood gets its burst and then 429s (the clock stands still: no refill), every submit of
    the other user is 201, and nothing answers 500."""
    api = Api(tmp_path, "api.rate_limit_per_s=1", "api.rate_burst=10")
    try:
        flooder = api.add_user("flood2", "researcher", ["default"])
        other = api.add_user("calm2", "researcher", ["default"])
        flood: list[int] = []
        lock = threading.Lock()

        def hammer() -> None:
            for _ in range(40):
                status = api.call("POST", "/v1/jobs", flooder, job(name="flood"))[0]
                with lock:
                    flood.append(status)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        mine = [api.call("POST", "/v1/jobs", other, job(name="calm"))[0] for _ in range(8)]
        for t in threads:
            t.join()
        assert mine == [201] * 8
        assert flood.count(201) == 10 and flood.count(429) == 150 and len(flood) == 160
        owners = [j.owner for j in api.store.list_jobs()]
        assert owners.count("flood2") == 10 and owners.count("calm2") == 8
    finally:
        api.close()


def test_wrong_tokens_are_slowed_per_address_without_blocking_real_users(tmp_path: Path) -> None:
    api = Api(tmp_path, "api.rate_limit_per_s=1", "api.rate_burst=3")
    try:
        token = api.add_user("real", "researcher", ["default"])
        statuses = [api.call("GET", "/v1/jobs", f"guess-{i}")[0] for i in range(6)]
        assert statuses == [401] * 3 + [429] * 3
        assert api.call("GET", "/v1/jobs", token)[0] == 200
    finally:
        api.close()


def test_rate_limit_config_is_validated() -> None:
    from controlplane.config import ConfigError

    with pytest.raises(ConfigError, match="api.rate_limit_per_s"):
        load_config(None, ["api.rate_limit_per_s=0"])
    with pytest.raises(ConfigError, match="api.rate_burst"):
        load_config(None, ["api.rate_burst=0"])


# -- fuzzing -----------------------------------------------------------------------------------

_TEXT = st.text(max_size=40)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_USERISH = st.fixed_dictionaries(
    {"name": st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True) | _TEXT},
    optional={
        "role": st.sampled_from([r.value for r in Role]) | _TEXT,
        "queues": st.lists(st.sampled_from([*QUEUES, "*", "nope"]), max_size=3) | _JSON,
        "expires_in_s": st.integers(-5, 10**9) | _JSON,
    },
)
_SEGMENT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30
)


@pytest.fixture(scope="module")
def fuzz_tokens(api: Api) -> dict[str, str]:
    tokens = {"admin": ADMIN_TOKEN}
    for role in (Role.RESEARCHER, Role.OPERATOR):
        tokens[role.value] = api.add_user(f"fuzz-{role.value}", role.value, ["default"])
    return tokens


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    role=st.sampled_from(["admin", "operator", "researcher", "none", "garbage"]),
)
def test_fuzzed_requests_on_every_route_never_500_and_keep_the_store_consistent(
    api: Api, fuzz_tokens: dict[str, str], data: st.DataObject, role: str
) -> None:
    name = data.draw(st.sampled_from(sorted(api.app[ROUTE_ACTIONS])), label="route")
    method, canonical = _route(api, name)
    path = re.sub(
        r"\{[a-z_]+\}",
        lambda _m: urllib.parse.quote(data.draw(_SEGMENT, label="param"), safe=""),
        canonical,
    )
    query = data.draw(st.dictionaries(st.sampled_from(["limit", "after", "state"]), _TEXT))
    if query:
        path += "?" + urllib.parse.urlencode(query)
    body = data.draw(_USERISH if name == "users.add" else _JSON, label="body")
    token = {"none": None, "garbage": data.draw(_SEGMENT, label="token")}.get(role)
    token = fuzz_tokens.get(role, token)
    headers = data.draw(
        st.dictionaries(
            st.sampled_from(["Idempotency-Key", "X-Request-Id"]),
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
        )
    )
    if token is not None and not token.isascii():
        token = token.encode("utf-8").decode("latin-1")  # header bytes as a client sends them
    try:
        status, answer, _ = api.call(method, path, token, body, headers)
    except (ValueError, http.client.HTTPException):  # the client refused to send it
        return
    assert status != 500, (name, path, answer)
    assert answer is None or "error" in answer or status < 400
    assert api.call("GET", "/healthz", None)[0] == 200
    check_store(api.store)


# -- the bootstrap and an older store ----------------------------------------------------------


def test_a_store_from_before_users_keeps_its_token_as_the_admins(tmp_path: Path) -> None:
    """A version-1 database (no users, no owner column) with jobs in it: opening it adds the
    column, the existing token becomes the admin's, old jobs list with no owner."""
    db_path = tmp_path / "controlplane.db"
    with sqlite3.connect(db_path) as db:
        db.executescript(
            """
            CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL,
              spec_json TEXT NOT NULL, queue TEXT NOT NULL, priority_class TEXT NOT NULL,
              state TEXT NOT NULL, idempotency_key TEXT UNIQUE, submitted_s REAL NOT NULL,
              queued_s REAL NOT NULL, updated_s REAL NOT NULL,
              num_preemptions INTEGER NOT NULL DEFAULT 0, info_json TEXT NOT NULL DEFAULT '{}');
            PRAGMA user_version=1;
            """
        )
        spec = JobSpec.from_dict(job()).to_dict()
        db.execute(
            "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
            "submitted_s, queued_s, updated_s) VALUES ('job-old', 't', ?, 'default', "
            "'medium', 'QUEUED', 1, 1, 1)",
            (json.dumps(spec, sort_keys=True),),
        )
    api = Api(tmp_path)
    try:
        assert Client(api.url, ADMIN_TOKEN).whoami()["role"] == "admin"
        listed = Client(api.url, ADMIN_TOKEN).list()
        assert [(j.id, j.owner) for j in listed] == [("job-old", None)]
        with sqlite3.connect(db_path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        api.close()


def test_a_restart_does_not_bring_back_a_rotated_admin_token(tmp_path: Path) -> None:
    api = Api(tmp_path)
    new = Client(api.url, ADMIN_TOKEN).users_rotate_token("admin").token
    api.close()
    again = Api(tmp_path)  # the same state dir token, as a restarted controller passes it
    try:
        assert again.call("GET", "/v1/whoami", ADMIN_TOKEN)[0] == 401
        assert new is not None and again.call("GET", "/v1/whoami", new)[0] == 200
    finally:
        again.close()


def test_concurrent_removals_leave_one_admin(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        tokens = [api.add_user(f"adm-{i}", "admin", []) for i in range(3)]
        names = ["admin", "adm-0", "adm-1", "adm-2"]
        results: list[int] = []

        def remove(token: str, name: str) -> None:
            results.append(api.call("DELETE", f"/v1/users/{name}", token)[0])

        threads = [
            threading.Thread(target=remove, args=(ADMIN_TOKEN if i == 0 else tokens[i - 1], n))
            for i, n in enumerate(names)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert api.store.count_users(ADMIN_ROLE) >= 1
        assert set(results) <= {200, 401, 409} and results.count(200) <= 3
        check_store(api.store)
    finally:
        api.close()


# -- the CLI -----------------------------------------------------------------------------------


def test_rcp_users_and_whoami_over_the_url(api: Api) -> None:
    """`rcp users add | list | rotate-token | remove` and `rcp whoami`, with only a URL and a
    token; a new token is printed once, on stdout alone."""
    from click.testing import CliRunner

    from controlplane.cli.users import users_group, whoami

    runner = CliRunner()
    admin = {"RCP_API_URL": api.url, "RCP_API_TOKEN": ADMIN_TOKEN}
    added = runner.invoke(
        users_group, ["add", "olga", "--role", "operator", "--queue", "team-a", "--json"], env=admin
    )
    assert added.exit_code == 0, added.output
    token = json.loads(added.stdout)["token"]
    mine = {"RCP_API_URL": api.url, "RCP_API_TOKEN": token}
    said = runner.invoke(whoami, [], env=mine).stdout.splitlines()
    assert said[0] == "olga (operator), queues: team-a" and said[2].startswith("team-a  30%")
    listed = runner.invoke(users_group, ["list", "--json"], env=admin)
    olga = next(u for u in json.loads(listed.stdout) if u["name"] == "olga")
    assert olga["role"] == "operator" and "token" not in olga
    table = runner.invoke(users_group, ["list"], env=admin).stdout
    assert any(line.split()[:2] == ["olga", "operator"] for line in table.splitlines())
    refused = runner.invoke(users_group, ["list"], env=mine)
    assert refused.exit_code == 2 and "manage-users" in refused.stderr
    rotated = runner.invoke(users_group, ["rotate-token", "olga"], env=admin)
    assert rotated.exit_code == 0 and rotated.stdout.strip() not in ("", token)
    assert "shown this once" in rotated.stderr and rotated.stdout.strip() not in rotated.stderr
    assert runner.invoke(whoami, [], env=mine).exit_code == 1  # the old token: 401
    removed = runner.invoke(users_group, ["remove", "olga"], env=admin)
    assert removed.exit_code == 0 and removed.stdout == "removed olga (operator)\n"


def test_the_sdk_waits_out_retry_after_and_its_submit_then_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 is refused before anything happens, so the SDK sends even a submit again, after
    the server's Retry-After (the sleep advances the API's clock here: no real waiting)."""
    import controlplane.sdk.connection

    api = Api(tmp_path, "api.rate_limit_per_s=0.5", "api.rate_burst=1")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        api.clock.now_s += seconds

    monkeypatch.setattr(controlplane.sdk.connection.time, "sleep", sleep)
    try:
        client = Client(api.url, api.add_user("paced", "researcher", ["default"]))
        first = client.submit(job(name="one"))
        second = client.submit(job(name="two"))
        assert slept == [2.0] and second.id != first.id
        assert {j.name for j in client.list(state="QUEUED")} == {"one", "two"}
        assert len(slept) == 2  # the listing waited its turn too
    finally:
        api.close()
