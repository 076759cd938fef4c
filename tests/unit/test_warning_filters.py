"""pytest's warning filters (pyproject.toml, [tool.pytest.ini_options] filterwarnings), as
every test runs under them: third-party deprecations are silent, the project's are errors,
anything else is shown."""

from __future__ import annotations

import warnings

import pytest


@pytest.mark.parametrize(
    ("module", "category", "outcome"),
    [
        pytest.param("ray.serve._private.config", DeprecationWarning, "ignored", id="ray"),
        pytest.param("ray", PendingDeprecationWarning, "ignored", id="ray-pending"),
        pytest.param("pydantic._internal._fields", DeprecationWarning, "ignored", id="pydantic"),
        pytest.param("botocore.auth", DeprecationWarning, "ignored", id="botocore"),
        pytest.param("controlplane.loop.tick", DeprecationWarning, "error", id="controlplane"),
        pytest.param("jobs", PendingDeprecationWarning, "error", id="jobs-pending"),
        pytest.param("serve.edge.config", DeprecationWarning, "error", id="serve-not-ray-serve"),
        pytest.param("policies.health", DeprecationWarning, "error", id="policies"),
        pytest.param("tests.unit.test_x", DeprecationWarning, "error", id="tests"),
        pytest.param("rayleigh", DeprecationWarning, "shown", id="a-name-starting-with-ray"),
        pytest.param("numpy.core", DeprecationWarning, "shown", id="unlisted-third-party"),
        pytest.param("controlplane.cli", UserWarning, "shown", id="not-a-deprecation"),
    ],
)
def test_a_warning_from_module(module: str, category: type[Warning], outcome: str) -> None:
    def warn() -> None:
        warnings.warn_explicit("old", category, f"{module}.py", 1, module=module)

    if outcome == "error":
        with pytest.raises(category, match="^old$"):
            warn()
        return
    with warnings.catch_warnings(record=True) as seen:  # keeps the filters pytest installed
        warn()
    assert [str(w.message) for w in seen] == ([] if outcome == "ignored" else ["old"])
