"""What the deployment client (`real_robot.deploy`) and the policy server (`real_robot.policy_server`) share,
so that neither imports the other (as LeRobot's async inference splits its server, client and helpers)."""

from __future__ import annotations

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
