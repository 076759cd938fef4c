"""JobSpec validation, dict and YAML round trips: every bad spec names its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray._common.runtime_env_uri import Protocol
from ray._private.runtime_env.packaging import is_tar_uri, is_whl_uri, is_zip_uri

from jobs import launcher
from jobs.spec import (
    CODE_ARCHIVE_SUFFIXES,
    REMOTE_URI_SCHEMES,
    USER_ENV_VARS,
    CheckpointSpec,
    JobSpec,
    SpecError,
)

GOOD: dict[str, Any] = {
    "name": "llama-ft",
    "entrypoint": "python train.py --epochs 3",
    "num_workers": 4,
    "gpus_per_worker": 2,
}


def with_(**changes: Any) -> dict[str, Any]:
    data = dict(GOOD)
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


_DROP = object()


BAD_SPECS = [
    pytest.param(with_(num_workers=0), "num_workers", "at least 1 worker", id="zero-workers"),
    pytest.param(with_(num_workers=-3), "num_workers", ">= 1", id="negative-workers"),
    pytest.param(
        with_(num_workers=2.5), "num_workers", "must be an integer", id="fractional-workers"
    ),
    pytest.param(with_(num_workers=True), "num_workers", "got a boolean", id="bool-workers"),
    pytest.param(with_(gpus_per_worker=-1), "gpus_per_worker", ">= 0", id="negative-gpus"),
    pytest.param(with_(entrypoint=_DROP), "entrypoint", "required", id="missing-entrypoint"),
    pytest.param(with_(entrypoint="   "), "entrypoint", "non-empty", id="blank-entrypoint"),
    pytest.param(with_(name=_DROP), "name", "required", id="missing-name"),
    pytest.param(with_(name="has space"), "name", "letters, digits", id="bad-name"),
    pytest.param(with_(max_runtime_s=0), "max_runtime_s", "> 0", id="zero-runtime"),
    pytest.param(with_(max_runtime_s="1h"), "max_runtime_s", "got a string", id="string-runtime"),
    pytest.param(with_(num_wrkers=2), "num_wrkers", "did you mean 'num_workers'", id="typo-key"),
    pytest.param(
        with_(checkpoint={"interval_s": -5}), "checkpoint.interval_s", "> 0", id="bad-interval"
    ),
    pytest.param(
        with_(checkpoint={"intervl_s": 5}), "checkpoint.intervl_s", "unknown field", id="ckpt-typo"
    ),
    pytest.param(with_(checkpoint=[1]), "checkpoint", "mapping", id="ckpt-not-mapping"),
    pytest.param(with_(cpus_per_worker=-1), "cpus_per_worker", ">= 0", id="negative-cpus"),
    pytest.param(with_(queue=" "), "queue", "non-empty", id="blank-queue"),
    pytest.param(with_(priority_class=""), "priority_class", "non-empty", id="blank-class"),
    pytest.param(with_(name=7), "name", "must be a string, got an integer", id="name-not-str"),
    pytest.param(
        with_(checkpoint={"keep_last": 0}), "checkpoint.keep_last", ">= 1", id="keep-none"
    ),
    pytest.param(
        with_(checkpoint={"preempt_deadline_s": 0}),
        "checkpoint.preempt_deadline_s",
        "> 0",
        id="no-preempt-deadline",
    ),
    pytest.param(
        with_(checkpoint={"enabled": "yes"}),
        "checkpoint.enabled",
        "true or false",
        id="enabled-not-bool",
    ),
    pytest.param(
        with_(checkpoint={"uri": "gs://b"}), "checkpoint.uri", "s3://bucket/prefix", id="bad-uri"
    ),
    pytest.param(
        with_(working_dir="s3://b/src.zip", runtime_env={"working_dir": "s3://b/other.zip"}),
        "runtime_env.working_dir",
        "not both",
        id="two-working-dirs",
    ),
]


@pytest.mark.parametrize(("data", "field", "message"), BAD_SPECS)
def test_bad_spec_names_the_field(data: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert field in info.value.fields
    assert message in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "x", "num_workers": 0, "gpus_per_worker": -1, "entrypoint": "e"})
    assert set(info.value.fields) == {"num_workers", "gpus_per_worker"}


def test_direct_construction_validates_too() -> None:
    with pytest.raises(SpecError, match="num_workers"):
        JobSpec(name="x", entrypoint="python t.py", num_workers=0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("name: [unclosed\n", "line 2", id="unclosed-list"),
        pytest.param("name: a\n  bad: indent: here\n", "not valid YAML", id="bad-indent"),
        pytest.param("", "empty", id="empty-file"),
        pytest.param("- just\n- a list\n", "must be a mapping, got a list", id="top-level-list"),
    ],
)
def test_malformed_yaml_is_a_spec_error(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_yaml(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        pytest.param(
            {"priority_classes": ("low", "medium", "high")},
            "priority_class",
            "unknown priority class 'urgent'",
            id="unknown-priority-class",
        ),
        pytest.param(
            {"queues": ("research",)}, "queue", "unknown queue 'default'", id="unknown-queue"
        ),
    ],
)
def test_check_against_config(kwargs: dict[str, Any], field: str, message: str) -> None:
    spec = JobSpec.from_dict(with_(priority_class="urgent" if field == "priority_class" else "low"))
    with pytest.raises(SpecError) as info:
        spec.check_against(**kwargs)
    assert info.value.fields == (field,)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("workers", "gpus", "node_gpus", "field"),
    [
        pytest.param(4, 2, [8], None, id="fits-one-node"),
        pytest.param(2, 8, [8, 8], None, id="one-worker-per-node"),
        pytest.param(3, 8, [8, 8], "num_workers", id="more-gpus-than-the-pool-holds"),
        pytest.param(1, 16, [8, 8], "gpus_per_worker", id="worker-bigger-than-any-node"),
        pytest.param(3, 3, [4, 4], "num_workers", id="8-gpus-but-only-2-slots-of-3"),
    ],
)
def test_check_against_live_pool(
    workers: int, gpus: int, node_gpus: list[int], field: str | None
) -> None:
    spec = JobSpec.from_dict(with_(num_workers=workers, gpus_per_worker=gpus))
    if field is None:
        spec.check_against(cluster_node_gpus=node_gpus)
        return
    with pytest.raises(SpecError) as info:
        spec.check_against(cluster_node_gpus=node_gpus)
    assert info.value.fields == (field,)


def test_yaml_round_trip_keeps_every_field() -> None:
    spec = JobSpec(
        name="llama-ft",
        entrypoint="python train.py",
        num_workers=4,
        gpus_per_worker=2,
        cpus_per_worker=3.5,
        working_dir="s3://b/src.zip",
        runtime_env={"env_vars": {"A": "1"}, "py_modules": ["gs://b/m.whl"]},
        queue="research",
        priority_class="high",
        max_runtime_s=7200,
        checkpoint=CheckpointSpec(interval_s=600, keep_last=3, uri="s3://b/ckpt"),
    )
    assert JobSpec.from_yaml(spec.to_yaml()) == spec
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.gpus_total == 8


def test_defaults_from_minimal_yaml() -> None:
    spec = JobSpec.from_yaml("name: t\nentrypoint: python t.py\n")
    assert (spec.num_workers, spec.gpus_per_worker, spec.queue, spec.priority_class) == (
        1,
        1,
        "default",
        "medium",
    )
    assert spec.checkpoint == CheckpointSpec()


def test_type_and_value_problems_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_yaml("num_workers: 0\ngpus_per_worker: two\n")
    assert set(info.value.fields) == {"name", "entrypoint", "num_workers", "gpus_per_worker"}


# -- untrusted input: code from remote URIs only, allow-listed runtime_env, finite numbers ----

NAN, INF = float("nan"), float("inf")

UNSAFE_SPECS = [
    pytest.param(with_(working_dir="./src"), "working_dir", "local path", id="relative-dir"),
    pytest.param(with_(working_dir="/var/lib/rcp"), "working_dir", "local path", id="abs-dir"),
    pytest.param(with_(working_dir="/dev"), "working_dir", "local path", id="dev"),
    pytest.param(with_(working_dir="file:///x/c.zip"), "working_dir", "file://", id="file-uri"),
    pytest.param(with_(working_dir="local:///app"), "working_dir", "local://", id="local-uri"),
    pytest.param(with_(working_dir="gcs://_ray_pkg_1.zip"), "working_dir", "gcs://", id="gcs"),
    pytest.param(with_(working_dir="http://h/c.zip"), "working_dir", "http://", id="plain-http"),
    pytest.param(with_(working_dir="s3:///c.zip"), "working_dir", "no bucket", id="no-bucket"),
    pytest.param(with_(working_dir="s3://b/code"), "working_dir", ".zip", id="not-an-archive"),
    pytest.param(
        with_(runtime_env={"working_dir": "."}), "runtime_env.working_dir", "local", id="env-wd"
    ),
    pytest.param(
        with_(runtime_env={"py_modules": ["s3://b/m.whl", "/home/me/pkg"]}),
        "runtime_env.py_modules[1]",
        "local path",
        id="py-module-path",
    ),
    pytest.param(
        with_(runtime_env={"py_modules": "s3://b/m.whl"}),
        "runtime_env.py_modules",
        "list",
        id="py-modules-not-list",
    ),
    pytest.param(
        with_(runtime_env={"pip": "requirements.txt"}),
        "runtime_env.pip",
        "requirements-file",
        id="pip-file",
    ),
    pytest.param(
        with_(runtime_env={"pip": ["torch", "-r /etc/shadow"]}),
        "runtime_env.pip[1]",
        "no pip options",
        id="pip-option",
    ),
    pytest.param(
        with_(runtime_env={"pip": {"packages": ["./pkg"]}}),
        "runtime_env.pip.packages[0]",
        "local paths",
        id="pip-local-path",
    ),
    pytest.param(
        with_(runtime_env={"uv": ["x @ file:///srv/x"]}),
        "runtime_env.uv[0]",
        "file: URLs",
        id="uv-file-url",
    ),
    pytest.param(
        with_(runtime_env={"conda": "/srv/env.yaml"}),
        "runtime_env.conda",
        "never a file path",
        id="conda-file",
    ),
    pytest.param(
        with_(runtime_env={"container": {"image": "x", "run_options": ["-v /:/host"]}}),
        "runtime_env.container",
        "allowed keys",
        id="container",
    ),
    pytest.param(
        with_(runtime_env={"image_uri": "evil:latest"}),
        "runtime_env.image_uri",
        "not accepted",
        id="image-uri",
    ),
    pytest.param(
        with_(runtime_env={"excludes": ["*"]}), "runtime_env.excludes", "allowed", id="excludes"
    ),
    pytest.param(
        with_(runtime_env={"env_vars": {"RCP_JOB_ID": "someone-else"}}),
        "runtime_env.env_vars.RCP_JOB_ID",
        "belong to Ray and the control plane",
        id="env-rcp",
    ),
    pytest.param(
        with_(runtime_env={"env_vars": {"ray_address": "10.0.0.1:6379"}}),
        "runtime_env.env_vars.ray_address",
        "belong to Ray",
        id="env-ray-lowercase",
    ),
    pytest.param(
        with_(runtime_env={"env_vars": {"A": {"b": 1}}}),
        "runtime_env.env_vars.A",
        "must be a string",
        id="env-value-mapping",
    ),
    pytest.param(
        with_(runtime_env={"config": {"setup_timeout_seconds": "x"}}),
        "runtime_env.config.setup_timeout_seconds",
        "must be int",
        id="config-type",
    ),
    pytest.param(with_(max_runtime_s=NAN), "max_runtime_s", "finite", id="nan-runtime"),
    pytest.param(with_(max_runtime_s=INF), "max_runtime_s", "finite", id="inf-runtime"),
    pytest.param(with_(cpus_per_worker=NAN), "cpus_per_worker", "finite", id="nan-cpus"),
    pytest.param(with_(cpus_per_worker=INF), "cpus_per_worker", "finite", id="inf-cpus"),
    pytest.param(
        with_(checkpoint={"interval_s": NAN}), "checkpoint.interval_s", "finite", id="nan-interval"
    ),
    pytest.param(
        with_(checkpoint={"preempt_deadline_s": -INF}),
        "checkpoint.preempt_deadline_s",
        "finite",
        id="neg-inf-deadline",
    ),
    pytest.param(
        with_(runtime_env={"env_vars": {"LR": NAN}}),
        "runtime_env.env_vars.LR",
        "finite",
        id="nan-in-runtime-env",
    ),
]


PIP_OPTIONS = "only one requirement specifier per item"

UNSAFE_PACKAGES_AND_CHECKPOINTS = [
    pytest.param(
        {"pip": ["numpy\n-r /etc/passwd\n--extra-index-url http://evil"]},
        "runtime_env.pip[0]",
        PIP_OPTIONS,
        id="pip-newline-smuggles-options",
    ),
    pytest.param(
        {"pip": ["foo --index-url http://evil/"]},
        "runtime_env.pip[0]",
        PIP_OPTIONS,
        id="pip-trailing-option",
    ),
    pytest.param(
        {"pip": ["torch==2.5.1 --hash=sha256:00"]}, "runtime_env.pip[0]", PIP_OPTIONS, id="pip-hash"
    ),
    pytest.param({"pip": ["numpy; rm -rf /"]}, "runtime_env.pip[0]", PIP_OPTIONS, id="bad-marker"),
    pytest.param({"pip": ["../pkg"]}, "runtime_env.pip[0]", PIP_OPTIONS, id="pip-parent-path"),
    pytest.param(
        {"pip": ["evil-1.0-py3-none-any.whl"]}, "runtime_env.pip[0]", PIP_OPTIONS, id="pip-wheel"
    ),
    pytest.param(
        {"pip": ["x @ http://evil/x.whl"]}, "runtime_env.pip[0]", "https://", id="pip-http-url"
    ),
    pytest.param(
        {"uv": ["x @ git+https://h/x.git"]}, "runtime_env.uv[0]", "https://", id="uv-vcs-url"
    ),
    pytest.param(
        {"uv": {"packages": ["x @ file:///srv/x"]}},
        "runtime_env.uv.packages[0]",
        "https://",
        id="uv-dict-file-url",
    ),
    pytest.param(
        {"pip": {"packages": ["numpy"], "pip_version": "==24.0 --index-url http://evil"}},
        "runtime_env.pip.pip_version",
        "version specifier",
        id="pip-version-option",
    ),
    pytest.param(
        {"conda": {"dependencies": ["numpy", {"pip": ["-r /etc/passwd"]}]}},
        "runtime_env.conda.dependencies[1].pip[0]",
        PIP_OPTIONS,
        id="conda-nested-pip-option",
    ),
    pytest.param(
        {"conda": {"dependencies": ["numpy --override-channels"]}},
        "runtime_env.conda.dependencies[0]",
        "no options",
        id="conda-option",
    ),
    pytest.param(
        {"conda": {"dependencies": ["file:///srv/pkg.tar.bz2"]}},
        "runtime_env.conda.dependencies[0]",
        "no options, URLs, paths",
        id="conda-file-url",
    ),
    pytest.param(
        {"conda": {"dependencies": ["/srv/pkg.conda"]}},
        "runtime_env.conda.dependencies[0]",
        "paths",
        id="conda-path",
    ),
    pytest.param(
        {"conda": {"channels": ["file:///srv/channel"], "dependencies": ["numpy"]}},
        "runtime_env.conda.channels[0]",
        "https://",
        id="conda-file-channel",
    ),
    pytest.param(
        {"conda": {"dependencies": ["numpy"], "prefix": "/opt/ray"}},
        "runtime_env.conda.prefix",
        "unknown key",
        id="conda-prefix",
    ),
    pytest.param(
        {"conda": {"dependencies": ["numpy"], "variables": {"RAY_ADDRESS": "x"}}},
        "runtime_env.conda.variables",
        "unknown key",
        id="conda-variables",
    ),
]


@pytest.mark.parametrize(("runtime_env", "field", "message"), UNSAFE_PACKAGES_AND_CHECKPOINTS)
def test_package_lists_are_one_requirement_per_item(
    runtime_env: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(with_(runtime_env=runtime_env))
    assert field in info.value.fields
    assert message in str(info.value)


@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("file:///var/lib/rcp/ckpt", id="file-uri"),
        pytest.param("/mnt/ckpt", id="local-path"),
        pytest.param("s3:///no-bucket", id="no-bucket"),
        pytest.param("s3://b/jobs/../other", id="dot-dot"),
        pytest.param("gs://b/x", id="other-scheme"),
    ],
)
def test_checkpoint_uri_must_be_remote(uri: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(with_(checkpoint={"uri": uri}))
    assert info.value.fields == ("checkpoint.uri",)


@pytest.mark.parametrize(("data", "field", "message"), UNSAFE_SPECS)
def test_unsafe_or_non_finite_spec_is_refused_naming_the_field(
    data: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert field in info.value.fields
    assert message in str(info.value)


@pytest.mark.parametrize(
    "runtime_env",
    [
        pytest.param({"working_dir": "https://code.example.com/a/b.tar.gz"}, id="https-tarball"),
        pytest.param({"py_modules": ["s3://b/m.zip", "gs://b/w-1.0-py3-none-any.whl"]}, id="mods"),
        pytest.param({"pip": ["torch==2.5.1", "numpy>=1.26", "x[extra]"]}, id="pip-list"),
        pytest.param({"pip": {"packages": ["numpy"], "pip_check": False}}, id="pip-dict"),
        pytest.param({"conda": "pytorch-env"}, id="conda-name"),
        pytest.param({"conda": {"dependencies": ["numpy"]}}, id="conda-mapping"),
        pytest.param(
            {
                "conda": {
                    "name": "train",
                    "channels": ["conda-forge", "https://conda.example.com/main"],
                    "dependencies": [
                        "python=3.11",
                        "conda-forge::numpy>=1.26",
                        "pytorch 2.5.* py311*",
                        {"pip": ["transformers==4.46.0", "x[extra]>=1; python_version>'3.10'"]},
                    ],
                }
            },
            id="conda-full-mapping",
        ),
        pytest.param(
            {"pip": ["numpy >= 1.26", "pkg @ https://files.example.com/pkg-1.0.tar.gz"]},
            id="pip-spaces-and-https-url",
        ),
        pytest.param({"pip": {"packages": ["numpy"], "pip_version": "==24.0"}}, id="pip-version"),
        pytest.param(
            {"env_vars": {"RCP_TRAIN_CONFIG": "{}", "OMP_NUM_THREADS": 4}}, id="env-user-vars"
        ),
        pytest.param({"config": {"setup_timeout_seconds": 900}}, id="config"),
    ],
)
def test_safe_runtime_envs_pass(runtime_env: dict[str, Any]) -> None:
    assert JobSpec.from_dict(with_(runtime_env=runtime_env)).runtime_env == runtime_env


def test_accepted_uri_forms_are_ones_ray_fetches_remotely() -> None:
    """Our schemes and archive suffixes are a subset of what the installed Ray unpacks from a
    remote URI (imports Ray's parsing helpers only; starts nothing)."""
    remote = {p.value for p in Protocol.remote_protocols()}
    assert set(REMOTE_URI_SCHEMES) <= remote
    for suffix in (*CODE_ARCHIVE_SUFFIXES, ".whl"):
        uri = f"s3://bucket/code{suffix}"
        assert is_zip_uri(uri) or is_tar_uri(uri) or is_whl_uri(uri), uri


def test_user_env_vars_are_the_ones_the_launcher_reads() -> None:
    assert {launcher.ENV_TRAIN_CONFIG, launcher.ENV_BACKEND} == USER_ENV_VARS


def test_the_example_job_is_valid() -> None:
    root = Path(__file__).resolve().parents[3]
    for path in sorted((root / "jobs" / "examples").glob("*.yaml")):
        JobSpec.from_yaml(path.read_text())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_restarts", -1),
        ("max_restarts", 1001),
        ("max_restarts", 2.5),
        ("stall_timeout_s", 0),
        ("stall_timeout_s", float("nan")),
        ("stall_timeout_s", "10m"),
    ],
)
def test_restart_and_stall_limits_name_the_field(field: str, value: object) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "t", "entrypoint": "python t.py", field: value})
    assert info.value.fields == (field,)


@pytest.mark.parametrize("interval", [0, -5, 8 * 86400.0, float("inf")])
def test_checkpoint_interval_is_bounded(interval: float) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(
            {"name": "t", "entrypoint": "python t.py", "checkpoint": {"interval_s": interval}}
        )
    assert info.value.fields == ("checkpoint.interval_s",)


def test_stall_timeout_shorter_than_the_step_report_interval_is_refused() -> None:
    spec = JobSpec.from_dict({"name": "t", "entrypoint": "python t.py", "stall_timeout_s": 2})
    with pytest.raises(SpecError) as info:
        spec.check_against(step_report_interval_s=5.0)
    assert info.value.fields == ("stall_timeout_s",)
    assert "step report interval" in str(info.value)
    spec.check_against(step_report_interval_s=2.0)  # equal is fine


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("gs://bucket/x", "gs:// is not supported"),
        ("file:///tmp/x", "file:// is not supported"),
        ("/tmp/x", "no scheme"),
        ("s3://", "expected s3://bucket/prefix"),
    ],
)
def test_checkpoint_uri_scheme_errors_name_the_field(uri: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "t", "entrypoint": "python t.py", "checkpoint": {"uri": uri}})
    assert info.value.fields == ("checkpoint.uri",)
    assert says in str(info.value)


@pytest.mark.parametrize(
    "entrypoint", ["python train.py --name 'unclosed", 'python -c "print(1)', "x" * 20000]
)
def test_an_entrypoint_that_cannot_be_split_into_words_is_refused_at_submit(
    entrypoint: str,
) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "t", "entrypoint": entrypoint})
    assert info.value.fields == ("entrypoint",)
