"""`rcp timeline --since 1h -o FILE.png`: the cluster's recent history as a picture.

Owns: the command's options (the window, the output, where Prometheus is, saving or reusing
the inputs) and what it prints. Events come through the API (the SDK, so `--url` reaches any
running control plane), metrics from Prometheus's HTTP API; `controlplane.timeline` does the
rest. Must not: reach Ray or the store.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

from controlplane.cli.common import api_call, client_options, load_cfg, sdk_client
from controlplane.timeline.collect import TimelineInputs, collect
from controlplane.timeline.draw import draw_png

__all__ = ["parse_since", "timeline"]

MAX_SINCE_S = 30 * 86400.0
"""The longest window (the event log keeps less than this by default anyway)."""
MAX_INPUTS_BYTES = 64 << 20
"""The largest `--from-inputs` file read."""
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str) -> float:
    """Seconds in ``90s``, ``30m``, ``1h`` or ``2d``; ValueError with what to write otherwise."""
    match = _SINCE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m, 1h or 2d")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not 0 < seconds <= MAX_SINCE_S:
        raise ValueError(f"{text!r} must be more than 0 and at most {MAX_SINCE_S / 86400:g}d")
    return seconds


def default_prometheus_url() -> str:
    """The local Prometheus of the config `--config` names (``rcp up`` starts it there)."""
    cfg = load_cfg(click.get_current_context().meta.get("rcp.config_file"), ())
    return f"http://{cfg.ray.node_ip}:{cfg.observability.prometheus_port}"


@click.command("timeline")
@client_options
@click.option("--since", default="1h", show_default=True, help="How far back: 90s, 30m, 1h, 2d.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("timeline.png"),
    show_default=True,
    help="The PNG to write.",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    envvar="RCP_PROMETHEUS_URL",
    help="Prometheus's URL (env: RCP_PROMETHEUS_URL; default: the local one of --config).",
)
@click.option(
    "--save-inputs",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the events and metric samples drawn, as JSON.",
)
@click.option(
    "--from-inputs",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Draw a file --save-inputs wrote instead of reading the cluster.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was drawn as JSON.")
def timeline(
    url: str | None,
    state_dir: str | None,
    since: str,
    output: Path,
    prometheus_url: str | None,
    save_inputs: Path | None,
    from_inputs: Path | None,
    as_json: bool,
) -> None:
    """Draw replicas per model and pool, GPUs by owner, request and failure rates, and every
    policy decision over the last --since, from the control plane's events and Prometheus."""
    if from_inputs is not None:
        if from_inputs.stat().st_size > MAX_INPUTS_BYTES:
            raise click.BadParameter(
                f"larger than {MAX_INPUTS_BYTES} bytes", param_hint="--from-inputs"
            )
        try:
            inputs = TimelineInputs.from_json(json.loads(from_inputs.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise click.BadParameter(
                f"not a file --save-inputs wrote ({exc})", param_hint="--from-inputs"
            ) from exc
    else:
        try:
            window_s = parse_since(since)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from exc
        client = sdk_client(url, state_dir)
        end_s = time.time()
        inputs = api_call(
            lambda: collect(
                lambda after, limit: client.events(after=after, limit=limit),
                prometheus_url or default_prometheus_url(),
                end_s - window_s,
                end_s,
            )
        )
    if save_inputs is not None:
        save_inputs.write_text(json.dumps(inputs.to_json()))
    drawn = inputs.timeline()
    draw_png(drawn, output)
    summary = {"path": str(output), **drawn.summary()}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(
        f"wrote {output}: {len(drawn.replicas)} replica series, {len(drawn.gpus)} GPU series, "
        f"{len(drawn.requests)} request series, {len(drawn.markers)} decision markers"
    )
    for note in drawn.notes:
        click.echo(f"note: {note}")
