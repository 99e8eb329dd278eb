"""What the deployment client (`real_robot.deploy`) and the policy server (`real_robot.policy_server`) share,
so that neither imports the other (as LeRobot's async inference splits its server, client and helpers), and
the range check every runtime config field passes."""

from __future__ import annotations

import math
from pathlib import Path


def check_policy_path(path: str | None) -> None:
    """Raise unless `path` names an existing directory (a pretrained policy's)."""
    if path is None:
        raise ValueError("policy_path: a pretrained policy directory is required (--policy_path=DIR)")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"policy_path: {path} is not a directory")


def load_policy(path: str | None):
    """The pretrained policy at `path` (checked first by `check_policy_path`)."""
    check_policy_path(path)
    from worldloop.vla.factory import load_policy as load

    return load(path)


def check_number(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise a ValueError naming config field `name` unless `value` is a finite number in the given range
    (`low` excluded when `low_open`, `high` included), and a whole number when `integer`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if integer and value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        left = "(" if low_open else "["
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf)" if high is None else f"{high:g}]"
        raise ValueError(f"{name} must be in {left}{lo}, {hi}, got {value}")
