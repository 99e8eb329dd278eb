"""Build a policy by type name, or load one from a checkpoint directory whose config.yaml names its type."""

from __future__ import annotations

from pathlib import Path

import yaml

from vla.flow_vla import FlowVLAConfig, FlowVLAPolicy
from vla.lerobot_adapters import ACTAdapter, ACTAdapterConfig, DiffusionAdapter, DiffusionAdapterConfig
from vla.policy import Policy

POLICY_CLASSES: dict[str, tuple[type, type[Policy]]] = {
    "flow_vla": (FlowVLAConfig, FlowVLAPolicy),
    "act": (ACTAdapterConfig, ACTAdapter),
    "diffusion": (DiffusionAdapterConfig, DiffusionAdapter),
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


def load_policy(path: str | Path, device: str = "cpu") -> Policy:
    """Load a saved policy of any registered type (reads `type` from `path/config.yaml`)."""
    path = Path(path)
    config_file = path / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} does not exist: is {path} a pretrained policy directory?")
    data = yaml.safe_load(config_file.read_text()) or {}
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"{config_file}: expected a mapping with a 'type' key ({sorted(POLICY_CLASSES)})")
    _, policy_class = policy_classes(data["type"])
    return policy_class.from_pretrained(path).to(device).eval()
