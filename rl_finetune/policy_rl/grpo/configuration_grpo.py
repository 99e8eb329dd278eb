"""GRPO's settings, the `grpo` choice of `AlgorithmConfig` (`--algorithm.type=grpo`, the default)."""

from __future__ import annotations

from dataclasses import dataclass

from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig, FlowPolicyGradientConfig


@AlgorithmConfig.register_subclass("grpo")
@dataclass
class GRPOConfig(FlowPolicyGradientConfig):
    """GRPO (--algorithm.type=grpo, the default): groups of rollouts per start, group-normalised returns."""

    group_size: int = 8  # rollouts per initial state (batch = starts_per_iteration x group_size)
    advantage_eps: float = 1e-4  # groups whose returns are all equal give zero advantage
    # Divide by the group's std (GRPO) or not (Dr. GRPO). Dividing gives a group whose members differ
    # only by a little progress the same weight as a group split between success and failure.
    scale_by_group_std: bool = True

    @property
    def episodes_per_iteration(self) -> int:
        return self.starts_per_iteration * self.group_size

    def validate(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"algorithm.group_size={self.group_size}: a group needs at least 2 rollouts")
        super().validate()
