"""DiffusionNFT's settings for the policy, the `nft` choice of `AlgorithmConfig` (`--algorithm.type=nft`)."""

from __future__ import annotations

from dataclasses import dataclass

from worldloop.rl_finetune.nft import NFTConfig
from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig


@AlgorithmConfig.register_subclass("nft")
@dataclass
class PolicyNFTConfig(AlgorithmConfig, NFTConfig):
    """NFT (--algorithm.type=nft): groups of rollouts per start, optimality-weighted flow matching."""

    group_size: int = 8  # rollouts per initial state (batch = starts_per_iteration x group_size)
    # Also learn from episodes that failed their instruction but achieved another one, relabelled with it
    # (policy_rl/nft/nft.py's docstring).
    hindsight: bool = False
    # How an episode's return becomes r. "group": group-normalised (nft.py's docstring). "success": r = 1 for a success,
    # 1/2 (neither pulled nor pushed, only kept near the old policy) otherwise: learn the successes alone
    # (rejection-sampling fine-tuning; with hindsight, goal-conditioned supervised learning). No group
    # baseline: a start whose rollouts all succeed is still learnt.
    weights: str = "group"

    @property
    def episodes_per_iteration(self) -> int:
        return self.starts_per_iteration * self.group_size

    def validate(self) -> None:
        if self.weights not in ("group", "success"):
            raise ValueError(f"algorithm.weights={self.weights!r}: expected 'group' or 'success'")
        if self.group_size < 2:
            raise ValueError(f"algorithm.group_size={self.group_size}: a group needs at least 2 rollouts")
        AlgorithmConfig.validate(self)
        NFTConfig.validate(self)
