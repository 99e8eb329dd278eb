"""PPO's settings, the `ppo` choice of `AlgorithmConfig` (`--algorithm.type=ppo`)."""

from __future__ import annotations

from dataclasses import dataclass

from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig, FlowPolicyGradientConfig


@AlgorithmConfig.register_subclass("ppo")
@dataclass
class PPOConfig(FlowPolicyGradientConfig):
    """PPO (--algorithm.type=ppo): a value head on the BC policy's observation features, GAE advantages."""

    starts_per_iteration: int = 16  # initial states per iteration (a shared field; PPO's default)
    epochs: int = 4  # passes over an iteration's data (a shared field; PPO's default)
    rollouts_per_start: int = 2  # episodes per start (batch = starts x rollouts); 1 is fine for PPO
    gamma: float = 0.99  # discount per chunk decision
    gae_lambda: float = 0.95
    value_lr: float = 1.0e-3
    value_hidden: int = 128
    value_clip: float = 0.0  # > 0: clip the value's change per iteration (as PPO2; often no help); 0: off
    normalize_advantages: bool = True

    @property
    def episodes_per_iteration(self) -> int:
        return self.starts_per_iteration * self.rollouts_per_start

    def validate(self) -> None:
        super().validate()
        for name in ("rollouts_per_start", "value_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 1")
        if self.value_lr <= 0 or self.value_clip < 0:
            raise ValueError(
                f"algorithm.value_lr={self.value_lr}, algorithm.value_clip={self.value_clip}: need value_lr > 0 and value_clip >= 0"
            )
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(
                f"algorithm.gamma={self.gamma}, algorithm.gae_lambda={self.gae_lambda}: need 0 < gamma <= 1 "
                "and 0 <= gae_lambda <= 1"
            )
