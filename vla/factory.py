"""Build a policy by type name, or load one from a checkpoint directory: ours (config.yaml names the type) or
one LeRobot saved (config.json; any LeRobot policy type, see vla/lerobot_pretrained.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy
from worldloop.vla.lerobot_adapters import (
    ACTAdapter,
    ACTAdapterConfig,
    DiffusionAdapter,
    DiffusionAdapterConfig,
)
from worldloop.vla.lerobot_pretrained import CONFIG_FILE as LEROBOT_CONFIG_FILE
from worldloop.vla.lerobot_pretrained import load_lerobot_policy
from worldloop.vla.policy import Policy
from worldloop.vla.scripted_pusher import ScriptedPusherConfig, ScriptedPusherPolicy

POLICY_CLASSES: dict[str, tuple[type, type[Policy]]] = {
    "flow_vla": (FlowVLAConfig, FlowVLAPolicy),
    "act": (ACTAdapterConfig, ACTAdapter),
    "diffusion": (DiffusionAdapterConfig, DiffusionAdapter),
    "scripted_pusher": (ScriptedPusherConfig, ScriptedPusherPolicy),
}


def policy_classes(policy_type: str) -> tuple[type, type[Policy]]:
    if policy_type not in POLICY_CLASSES:
        raise ValueError(f"unknown policy type {policy_type!r}; expected one of {sorted(POLICY_CLASSES)}")
    return POLICY_CLASSES[policy_type]


def make_policy(policy_type: str, config=None, stats: dict | None = None) -> Policy:
    """A freshly initialised policy of `policy_type` (its default config unless `config` is given)."""
    config_class, policy_class = policy_classes(policy_type)
    config = config if config is not None else config_class()
    if not isinstance(config, config_class):
        raise TypeError(f"{policy_type}: expected a {config_class.__name__}, got {type(config).__name__}")
    if config.type != policy_type:
        raise ValueError(f"{config_class.__name__}.type is {config.type!r}, asked for {policy_type!r}")
    return policy_class(config, stats)


LEROBOT_TYPE = "lerobot"  # a directory written by LeRobot's own save_pretrained


def load_policy(
    path: str | Path, device: str = "cpu", policy_type: str = "", camera_map: dict[str, str] | None = None
) -> Policy:
    """Load a saved policy of any registered type (reads `type` from `path/config.yaml`), or with
    `policy_type="lerobot"` (the default when `path` holds LeRobot's config.json and no config.yaml) any
    LeRobot policy, offline; `camera_map` feeds its image inputs from our cameras."""
    path = Path(path)
    config_file = path / "config.yaml"
    if not policy_type and not config_file.is_file() and (path / LEROBOT_CONFIG_FILE).is_file():
        policy_type = LEROBOT_TYPE
    if policy_type == LEROBOT_TYPE:
        return load_lerobot_policy(path, device, camera_map)
    if camera_map:
        raise ValueError(f"camera_map applies to LeRobot policies (policy type {LEROBOT_TYPE!r}) only")
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{config_file} does not exist: is {path} a pretrained policy directory? (a LeRobot one holds "
            f"{LEROBOT_CONFIG_FILE}: load it with policy type {LEROBOT_TYPE!r})"
        )
    data = yaml.safe_load(config_file.read_text()) or {}
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"{config_file}: expected a mapping with a 'type' key ({sorted(POLICY_CLASSES)})")
    if policy_type and data["type"] != policy_type:
        raise ValueError(f"{config_file}: the policy is of type {data['type']!r}, asked for {policy_type!r}")
    _, policy_class = policy_classes(data["type"])
    return policy_class.from_pretrained(path).to(device).eval()
