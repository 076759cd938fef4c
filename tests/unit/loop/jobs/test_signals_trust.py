"""The controller trusts the job signals actor by its pinned actor id, never by its name, and
no admin call carries its key (issue 12). Ray's actor calls are faked in memory: a named
registry, handles with actor ids, and `ray.get` resolving a call at once.

The attack: a job kills ``rcp-job-signals`` and registers its own actor under the name. The
old controller then sent its admin key to that actor (``check_admin.remote(key)``) and every
admin call after it carried the key.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.exceptions

from controlplane.adapters.ray_jobs import SIGNALS_ACTOR_KEY, RayJobs
from controlplane.config import load_config
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.store import Store
from jobs.signals import mailbox
from jobs.signals.trust import token_sha256

_ids = itertools.count(1)


class _Id:
    def __init__(self) -> None:
        self.value = f"{next(_ids):032x}"

    def hex(self) -> str:
        return self.value


class FakeHandle:
    """An actor handle: records every call (method, args, kwargs) sent to it."""

    def __init__(self, target: Any) -> None:
        self._actor_id = _Id()
        self.target = target
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.dead = False

    def __getattr__(self, method: str) -> Any:
        handle = self

        class _Method:
            def remote(self, *args: Any, **kwargs: Any) -> Callable[[], Any]:
                handle.calls.append((method, args, kwargs))

                def result() -> Any:
                    if handle.dead:
                        raise ray.exceptions.RayActorError()
                    return getattr(handle.target, method)(*args, **kwargs)

                return result

        return _Method()


class FakeRayActors:
    """``ray.get_actor``/``ray.kill``/``ray.get`` and the signals actor class, in memory."""

    def __init__(self) -> None:
        self.named: dict[str, FakeHandle] = {}
        self.created: list[FakeHandle] = []
        self.killed: list[str] = []
        self.constructor_args: list[tuple[Any, ...]] = []

    def get_actor(self, name: str, namespace: str | None = None) -> FakeHandle:
        if name not in self.named:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return self.named[name]

    def kill(self, handle: FakeHandle, no_restart: bool = True) -> None:
        handle.dead = True
        self.killed.append(handle._actor_id.hex())
        self.named = {n: h for n, h in self.named.items() if h is not handle}

    def get(self, ref: Callable[[], Any], timeout: float | None = None) -> Any:
        return ref()

    def squat(self) -> FakeHandle:
        """A job's actor under the signals actor's name (it answers yes to everything)."""
        impostor = FakeHandle(_Yes())
        self.named[mailbox.SIGNALS_ACTOR_NAME] = impostor
        return impostor

    # the actor class: JobSignals.options(...).remote(secret)
    def options(self, **options: Any) -> Any:
        fake = self

        class _Creator:
            def remote(self, *args: Any) -> FakeHandle:
                name = options["name"]
                if options.get("get_if_exists") and name in fake.named:
                    return fake.named[name]
                if name in fake.named:
                    raise ValueError("the name is taken")
                fake.constructor_args.append(args)
                handle = FakeHandle(mailbox._JobSignals(*args))
                fake.named[name] = handle
                fake.created.append(handle)
                return handle

        return _Creator()


class _Yes:
    def __getattr__(self, _name: str) -> Any:
        return lambda *a, **k: True if _name == "check_admin" else {}


@pytest.fixture()
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRayActors:
    fake = FakeRayActors()
    monkeypatch.setattr(ray, "get_actor", fake.get_actor)
    monkeypatch.setattr(ray, "kill", fake.kill)
    monkeypatch.setattr(ray, "get", fake.get)
    monkeypatch.setattr(mailbox, "JobSignals", fake)
    return fake


def make(tmp_path: Path) -> tuple[Store, RayJobs]:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    store = Store(tmp_path / "db.sqlite")
    jobs = RayJobs(cfg)
    JobRunner(store, cfg, jobs)  # hands the store to RayJobs, as the controller does
    return store, jobs


def _sent(handles: list[FakeHandle]) -> str:
    return repr([h.calls for h in handles])


def test_an_actor_squatting_the_name_is_never_called_and_is_replaced(
    tmp_path: Path, fake_ray: FakeRayActors
) -> None:
    store, jobs = make(tmp_path)
    impostor = fake_ray.squat()
    jobs.register_signals("job-a", 1, token_sha256("t"), "/train/job-a")
    assert impostor.calls == []  # not one call: nothing to record, no key to learn
    assert impostor._actor_id.hex() in fake_ray.killed
    ours = fake_ray.named[mailbox.SIGNALS_ACTOR_NAME]
    assert ours is not impostor and ours in fake_ray.created
    assert store.get_value(SIGNALS_ACTOR_KEY)["actor_id"] == ours._actor_id.hex()
    events = store.events(kind_prefix="jobs.signals_impostor")
    assert len(events) == 1 and impostor._actor_id.hex() in events[0].message
    # The real actor got the registration; the admin key went nowhere, not even to it.
    assert jobs.signal_status("job-a")["attempt"] == 1
    key = jobs.signals_key()
    assert key not in _sent([impostor, ours]) and key not in repr(fake_ray.constructor_args)


def test_a_squatter_after_ours_was_killed_is_replaced_too(
    tmp_path: Path, fake_ray: FakeRayActors
) -> None:
    store, jobs = make(tmp_path)
    jobs.register_signals("job-a", 1, token_sha256("t"), "/train/job-a")
    ours = fake_ray.named[mailbox.SIGNALS_ACTOR_NAME]
    fake_ray.kill(ours)  # a job kills the real actor ...
    impostor = fake_ray.squat()  # ... and takes the name
    with pytest.raises(ray.exceptions.RayActorError):
        jobs.signal_status("job-a")  # our handle is dead: the call fails, nothing is sent
    jobs.register_signals("job-a", 1, token_sha256("t"), "/train/job-a")
    assert impostor.calls == [] and impostor._actor_id.hex() in fake_ray.killed
    new = fake_ray.named[mailbox.SIGNALS_ACTOR_NAME]
    assert new not in (ours, impostor)
    assert store.get_value(SIGNALS_ACTOR_KEY)["actor_id"] == new._actor_id.hex()


def test_a_restarted_controller_keeps_the_pinned_actor(
    tmp_path: Path, fake_ray: FakeRayActors
) -> None:
    _store, jobs = make(tmp_path)
    jobs.register_signals("job-a", 1, token_sha256("t"), "/train/job-a")
    ours = fake_ray.named[mailbox.SIGNALS_ACTOR_NAME]
    _store2, restarted = make(tmp_path)  # same state dir and store: same key and pin
    assert restarted.signal_status("job-a")["attempt"] == 1
    assert fake_ray.killed == [] and fake_ray.created == [ours]


def test_a_recorded_admin_call_cannot_be_replayed(tmp_path: Path, fake_ray: FakeRayActors) -> None:
    _store, jobs = make(tmp_path)
    jobs.register_signals("job-a", 1, token_sha256("t"), "/train/job-a")
    jobs.forget_signals("job-a")
    ours = fake_ray.named[mailbox.SIGNALS_ACTOR_NAME]
    method, args, kwargs = ours.calls[0]  # the recorded register
    with pytest.raises(PermissionError):
        getattr(ours.target, method)(*args, **kwargs)
    assert jobs.signal_status("job-a") == {}
