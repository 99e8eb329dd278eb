"""The config choice of policy RL's algorithm: `AlgorithmConfig`, a draccus choice registry, and the clipped
update's settings that GRPO and PPO share.

    --algorithm.type=nft --algorithm.lr=1e-4     # the choice, then any field of it

The algorithms register their subclasses in `policy_rl/<name>/configuration_<name>.py`; importing
`policy_rl.finetune` registers them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import draccus


@dataclass
class AlgorithmConfig(draccus.ChoiceRegistry):
    """The `algorithm` of policy fine-tuning, chosen by its registered name (`--algorithm.type=nft`): what
    every algorithm that trains the policy on imagined episodes shares (collection, the optimiser and the
    reward weights). GRPO and PPO extend it through `FlowPolicyGradientConfig`, NFT directly; each
    algorithm's folder registers its subclass (`policy_rl/<name>/configuration_<name>.py`)."""

    starts_per_iteration: int = 4  # initial states per iteration
    epochs: int = 2  # passes over an iteration's data
    minibatch_size: int = 32  # chunk samples per gradient step
    lr: float = 1.0e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    noise_level: float = 0.0  # sampler noise for exploration; 0 -> the policy's sde_noise_level
    success_reward: float = 1.0  # bonus when the success head first fires (at most once an episode)
    progress_reward: float = 0.5  # times the reward head's progress in [0, 1] gained (summed: final progress)
    # False: only the action expert learns; the observation encoder (vision, language, state, fusion) keeps
    # its BC weights. In imagination the policy sees drawn frames; an encoder fine-tuned on them can come
    # to read drawn frames better than rendered ones (the gap the README's NFT diagnosis measured).
    train_observation_encoder: bool = True

    @property
    def type(self) -> str:
        """The registered name of this choice (grpo, ppo, nft)."""
        return self.get_choice_name(type(self))

    @property
    def episodes_per_iteration(self) -> int:
        return self.starts_per_iteration

    def validate(self) -> None:
        for name in ("starts_per_iteration", "epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"algorithm.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"algorithm.lr={self.lr} must be > 0")
        if self.noise_level < 0:
            raise ValueError(f"algorithm.noise_level={self.noise_level} must be >= 0")


@dataclass
class FlowPolicyGradientConfig(AlgorithmConfig):
    """The clipped update's settings that GRPO and PPO share (their configs extend it)."""

    clip_ratio: float = 0.2  # PPO clip on the per-denoising-step ratio
    kl_coef: float = 0.05  # weight of KL(policy || BC policy)

    def validate(self) -> None:
        super().validate()
        if self.clip_ratio <= 0:
            raise ValueError(f"algorithm.clip_ratio={self.clip_ratio} must be > 0")
        if self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_coef={self.kl_coef} must be >= 0")
