"""A gang that steps until it is released: what tests/integration/test_head_loss.py runs
while it kills the head. One file for both kinds of job: ``held_gang:train_loop`` (a Ray
Train loop, ``module:function``; the job puts this directory on ``PYTHONPATH``) and
``python <this file>`` (a plain command on every rank).

Config (JSON: the Train loop's config, or ``RCP_TRAIN_CONFIG`` for the command): ``log``, a
file each step appends ``<step> <pid>`` to (the pid tells one process from a restarted one);
``release``, the loop ends (the job succeeds) once this file exists; ``max_s`` (900), the
job fails if it is not released by then, so a broken test leaves no gang behind.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STEP_S = 0.25


def hold(config: Mapping[str, Any]) -> int:
    """Step until released; returns the steps taken."""
    log, release = Path(config["log"]), Path(config["release"])
    max_s = float(config.get("max_s", 900))
    give_up_s = time.monotonic() + max_s
    step = 0
    while not release.exists():
        if time.monotonic() > give_up_s:
            raise RuntimeError(f"held_gang: not released within {max_s:g}s")
        step += 1
        with log.open("a") as out:
            out.write(f"{step} {os.getpid()}\n")
        time.sleep(STEP_S)
    return step


def train_loop(config: dict[str, Any]) -> None:
    hold(config)


if __name__ == "__main__":
    hold(json.loads(os.environ["RCP_TRAIN_CONFIG"]))
