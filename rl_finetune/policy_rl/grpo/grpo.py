"""Group-relative policy optimisation (GRPO) of a flow-matching VLA inside the world model.

One iteration:
1. Collect: each of N imagined initial states is repeated G times (a group); the policy acts with its
   stochastic sampler (noise injected at every denoising step, so every chunk has an exact log-probability:
   `FlowVLAPolicy.sample_stochastic`), and the world model imagines what follows. No simulator is involved.
2. Score: an episode's return is `success_reward * success + progress_reward * progress` from the world
   model's success and reward heads; its advantage is the return normalised within its group (GRPO: the
   group mean is the baseline, so no value network is needed; imagination makes groups free).
3. Update: a PPO-clipped objective on each denoising transition of each chunk (as Flow-GRPO: every step
   of the sampler is a Gaussian policy step, the ratio is taken per step), plus the exact KL from the BC
   policy: both transitions are Gaussians with the same std, so KL = |mean - mean_bc|^2 / (2 std^2).
   The clip keeps each update near the data-collecting policy; the KL keeps the whole run near BC, the
   trust region that stops the policy from drifting into states where the world model is wrong.

Collection and the update are shared with PPO (`rl_finetune.policy_rl.flow_policy_gradient`); PPO
(`rl_finetune.policy_rl.ppo.ppo`) replaces the group baseline by a value head and GAE. Everything random is drawn from generators seeded by (seed, iteration), so a run is reproducible.
"""

from __future__ import annotations

import torch

from worldloop.rl_finetune.policy_rl.flow_policy_gradient import (
    FlowPolicyTrainer,
    Rollouts,
    flatten,
    imagine_chunks,
)
from worldloop.world_model.world_model_env import InitialStates


def group_advantages(
    returns: torch.Tensor, group_size: int, eps: float = 1e-4, scale_by_std: bool = True
) -> torch.Tensor:
    """R - mean of its group, divided by (std of its group + eps) if `scale_by_std`; rows are
    [s0 x G, s1 x G, ...]."""
    if returns.numel() % group_size:
        raise ValueError(f"{returns.numel()} returns do not split into groups of {group_size}")
    r = returns.view(-1, group_size)
    adv = r - r.mean(1, keepdim=True)
    if scale_by_std:
        adv = adv / (r.std(1, keepdim=True) + eps)
    return adv.flatten()


class GRPOTrainer(FlowPolicyTrainer):
    """GRPO: the update of `FlowPolicyTrainer` on group-normalised returns."""

    algorithm = "GRPO"

    def collect(self, starts: InitialStates, seed: int) -> Rollouts:
        """Imagine `group_size` episodes from every start with the stochastic sampler."""
        cfg = self.cfg
        chunks = imagine_chunks(
            self.policy, self.env, starts.repeat(cfg.group_size), seed, self.sampler(self.policy), cfg
        )
        adv = group_advantages(chunks.returns, cfg.group_size, cfg.advantage_eps, cfg.scale_by_group_std)
        return flatten(chunks, [adv] * len(chunks.chains))
