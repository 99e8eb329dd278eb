"""Latent steering's settings, the `steer` choice of `AlgorithmConfig` (`--algorithm.type=steer`)."""

from __future__ import annotations

from dataclasses import dataclass

from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig
from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig


@AlgorithmConfig.register_subclass("steer")
@dataclass
class SteerConfig(PPOConfig):
    """PPO in the sampler's noise space (--algorithm.type=steer): only a latent steering head learns, which
    picks the mean of each chunk's initial noise; the BC velocity field turns it into actions."""

    lr: float = 3.0e-4  # the steering head's step size (a shared field; the head is small and starts at 0)
    kl_coef: float = 0.0  # weight of |mean|^2 / (2 std^2), the KL to the BC policy's own N(0, std^2) noise
    steering_hidden: int = 128  # width of the head added to a policy that has none (FlowVLAConfig)
    steering_std: float = 1.0  # std of the initial noise around the head's mean; 1 starts at the BC policy

    def validate(self) -> None:
        super().validate()
        if self.steering_hidden < 1 or self.steering_std <= 0:
            raise ValueError(
                f"algorithm.steering_hidden={self.steering_hidden}, algorithm.steering_std={self.steering_std}: "
                "need steering_hidden >= 1 and steering_std > 0"
            )
        if self.noise_level:
            raise ValueError(
                f"algorithm.noise_level={self.noise_level}: steer explores through the initial noise "
                "(algorithm.steering_std) and samples each chunk deterministically from it; leave noise_level at 0"
            )
