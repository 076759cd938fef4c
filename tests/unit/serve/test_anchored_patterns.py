"""Validators that check a whole string refuse one with a trailing newline.

A pattern anchored with ``$`` and applied with ``re.match`` accepts ``"name\\n"``: ``$``
matches before a final newline. Each validator here must accept its good value and refuse the
same value with ``"\\n"`` appended (it goes into log lines, file names and Ray's names). One row
per validator, through its public entry point.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobs.spec import JobSpec, SpecError
from serve.config import ModelConfig, ServingConfig, validate_serving
from serve.edge.config import DnsProxies, EdgeSettings, render
from serve.inputs import request_id


def _request_id(value: str) -> bool:
    return request_id(value) == value


def _job_name(value: str) -> bool:
    try:
        JobSpec.from_dict({"name": value, "entrypoint": "python t.py", "num_workers": 1})
    except SpecError:
        return False
    return True


def _env_var_name(value: str) -> bool:
    try:
        JobSpec.from_dict(
            {
                "name": "t",
                "entrypoint": "python t.py",
                "num_workers": 1,
                "runtime_env": {"env_vars": {value: "1"}},
            }
        )
    except SpecError:
        return False
    return True


def _serving_model_name(value: str) -> bool:
    return validate_serving(ServingConfig(models=[ModelConfig(name=value)])) == []


def _dns_target(value: str) -> bool:
    settings = EdgeSettings("0.0.0.0", 8000, "0.0.0.0", 8404, "/tmp/e", DnsProxies(value, 8000))
    try:
        render(settings)
    except ValueError:
        return False
    return True


VALIDATORS: list[tuple[str, Callable[[str], bool], str]] = [
    ("request-id", _request_id, "r-1.a:b"),
    ("job-name", _job_name, "train-1"),
    ("env-var-name", _env_var_name, "MY_VAR"),
    ("serving-model-name", _serving_model_name, "sample"),
    ("dns-target", _dns_target, "rcp-serve.rcp.svc"),
]


@pytest.mark.parametrize(
    "check, good", [(c, g) for _, c, g in VALIDATORS], ids=[n for n, _, _ in VALIDATORS]
)
def test_a_trailing_newline_is_refused(check: Callable[[str], bool], good: str) -> None:
    assert check(good), f"{good!r} should be accepted"
    assert not check(good + "\n"), f"{good + chr(10)!r} must be refused"
