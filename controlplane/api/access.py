"""Who may call which API route: roles, actions, the caller of a request.

Owns: `Role` (researcher < operator < admin), `Action` (what a route does, for authorization),
`ROLE_ACTIONS` (which role may do what), `Principal` (the authenticated caller of one
request) and `add_route`, through which every API route is registered together with the
action it needs, so no route can exist without one. What an action allows beyond the role
table (a researcher cancels only their own jobs, submits only to their queues) the handler
decides with `Principal.may_cancel` and `Principal.may_submit_to`.

Must not: read tokens or the store (that is the API's auth), or touch Ray.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

__all__ = [
    "ALL_QUEUES",
    "PRINCIPAL",
    "ROLE_ACTIONS",
    "ROUTE_ACTIONS",
    "Action",
    "Principal",
    "Role",
    "add_route",
    "principal_of",
    "route_action",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Role(enum.StrEnum):
    RESEARCHER = "researcher"
    OPERATOR = "operator"
    ADMIN = "admin"


class Action(enum.StrEnum):
    """What a route does, as far as authorization cares."""

    PUBLIC = "public"
    """No token needed (``/healthz``)."""
    READ = "read"
    """Look at anything: jobs, logs, events, nodes, health, serve status, policy state."""
    SUBMIT = "submit"
    """Submit a job, to a queue the caller is bound to (`Principal.may_submit_to`)."""
    CANCEL = "cancel"
    """Cancel a job: one's own, or any job for an operator (`Principal.may_cancel`)."""
    OPERATE = "operate"
    """Act on nodes (health clear, cordon, uncordon, drain, fault injection) and on the policy
    actor (pause, resume, breaker reset, pin and unpin a model)."""
    MANAGE_USERS = "manage-users"
    """Add, list, remove users and rotate their tokens."""


ROLE_ACTIONS: Mapping[Role, frozenset[Action]] = {
    Role.RESEARCHER: frozenset({Action.PUBLIC, Action.READ, Action.SUBMIT, Action.CANCEL}),
    Role.OPERATOR: frozenset(
        {Action.PUBLIC, Action.READ, Action.SUBMIT, Action.CANCEL, Action.OPERATE}
    ),
    Role.ADMIN: frozenset(Action),
}

ALL_QUEUES = "*"
"""In `Principal.queues`: bound to every queue."""


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of one request."""

    name: str
    role: Role
    queues: frozenset[str] = frozenset({ALL_QUEUES})
    user_id: str | None = None
    """The user's stable id (`UserRecord.user_id`): what owns jobs, idempotency keys and
    audit events, so a name removed and added again starts with none of them."""

    def may(self, action: Action) -> bool:
        return action in ROLE_ACTIONS[self.role]

    def may_submit_to(self, queue: str) -> bool:
        return ALL_QUEUES in self.queues or queue in self.queues

    def may_cancel(self, owner_id: str | None) -> bool:
        """Operators and admins cancel any job; a researcher only jobs they own (by user id,
        not name)."""
        return self.role is not Role.RESEARCHER or (
            owner_id is not None and owner_id == self.user_id
        )

    @property
    def sees_every_audit_event(self) -> bool:
        """Operators and admins read every audit event; a researcher only their own (the
        others name users and roles, which `manage-users` alone may list)."""
        return self.role is not Role.RESEARCHER


PRINCIPAL = web.RequestKey("principal", Principal)
ROUTE_ACTIONS = web.AppKey("route_actions", dict[str, Action])
"""Route name -> the action it needs; filled by `add_route`."""


def principal_of(request: web.Request) -> Principal:
    """The caller the auth middleware authenticated (it runs before every handler)."""
    return request[PRINCIPAL]


def add_route(
    app: web.Application, method: str, path: str, handler: Handler, *, name: str, action: Action
) -> None:
    """Register `handler` for ``method path`` under `name`, needing `action`."""
    if ROUTE_ACTIONS not in app:
        app[ROUTE_ACTIONS] = {}
    actions = app[ROUTE_ACTIONS]
    if name in actions:
        raise ValueError(f"route name {name!r} is registered twice")
    app.router.add_route(method, path, handler, name=name)
    actions[name] = action


def route_action(request: web.Request) -> Action | None:
    """The action the matched route needs; None for a route registered without `add_route`
    (the catch-all 404), which the middleware treats as needing only a valid token."""
    name = request.match_info.route.name
    if name is None:
        return None
    actions = request.app.get(ROUTE_ACTIONS, {})
    return actions.get(name)
