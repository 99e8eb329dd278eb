"""Latent steering: RL in the flow policy's noise space (--algorithm.type=steer), as DSRL (Wagenmaker et
al. 2025, "Steering Your Diffusion Policy with Latent Space Reinforcement Learning").

A flow policy turns an initial noise x_0 into a chunk by integrating its velocity field. The BC policy
draws x_0 ~ N(0, I); from the same observation, some noises lead to a success and others do not (on push,
two thirds of the starts have both among 8 rollouts). GRPO, PPO and NFT change the velocity field; steer
keeps it and learns where to draw x_0: a small head (`FlowVLAPolicy.latent_steering`) reads the
observation tokens and gives the mean of x_0 ~ N(mean(obs), std^2 I), and the chunk is the deterministic
Euler integration from x_0. That turns RL into RL over a Gaussian policy in a 40-number space (10 actions
x 4 joints), whose likelihood is as smooth as a Gaussian's, not the sharp likelihood of a denoising chain
(GRPO's trouble, rl_finetune/policy_rl/nft/nft.py's docstring).

Everything else is PPO's (`PPOTrainer`): collection of `rollouts_per_start` episodes per start, the value
head on the BC policy's pooled observation features and the horizon share, GAE, the clipped update. The
decision's "chain" is [x_0, chunk] and its one "denoising step" is the Gaussian draw of x_0. The KL to the
BC reference is |mean|^2 / (2 std^2) (the reference's head is 0), so `kl_coef` pulls the head back to the BC
policy's own noise. Only the head learns: the observation encoder and the velocity field keep their BC
weights, and the fine-tuned policy is the BC policy plus its head (saved with it; `steering_hidden` in its
config).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from worldloop.common.checkpoint import load_matching_weights
from worldloop.rl_finetune.policy_rl.flow_policy_gradient import Sampler
from worldloop.rl_finetune.policy_rl.ppo.ppo import PPOTrainer
from worldloop.rl_finetune.policy_rl.steer.configuration_steer import SteerConfig
from worldloop.vla.flow_vla import flow_matching
from worldloop.world_model.world_model_env import WorldModelEnv


@torch.no_grad()
def steered_sample(
    model, batch: dict, generator: torch.Generator | None = None
) -> flow_matching.StochasticChunk:
    """x_0 ~ N(mean(obs), std^2 I), then the deterministic sampler: chain [B, 2, H, A] = [x_0, chunk] and
    step_log_probs [B, 1] = log N(x_0; mean, std^2 I)."""
    obs = model.encode_observation(batch)
    mean = model.noise_mean(obs)
    noise = model.initial_noise(obs, generator=generator)
    chunk = flow_matching.euler_sample(model.velocity_fn(obs), noise, model.config.num_inference_steps)
    log_prob = flow_matching.gaussian_log_prob(noise, mean, model.noise_std)
    return flow_matching.StochasticChunk(torch.stack([noise, chunk], 1), log_prob[:, None])


class SteerTrainer(PPOTrainer):
    """PPO on the latent steering head alone (the module docstring)."""

    algorithm = "steer"

    def __init__(self, policy, env: WorldModelEnv, cfg: SteerConfig, seed: int = 0):
        if not hasattr(policy, "enable_latent_steering"):
            raise TypeError(
                f"steer needs a policy with a latent steering head (FlowVLAPolicy), got {type(policy).__name__}"
            )
        if policy.latent_steering is None:
            policy.enable_latent_steering(cfg.steering_hidden, cfg.steering_std)
        elif policy.config.steering_std != cfg.steering_std:
            raise ValueError(
                f"algorithm.steering_std={cfg.steering_std}: the policy's head was trained with "
                f"steering_std={policy.config.steering_std}; use that"
            )
        policy.requires_grad_(False)
        policy.latent_steering.requires_grad_(True)
        super().__init__(policy, env, cfg, seed)

    def load_reference(self, path: Path) -> None:
        """The BC reference's frozen parts from `path`; its head too if the file has one, else 0 (the BC
        policy's own noise, what the KL then pulls towards)."""
        missing = load_matching_weights(self.reference, path)
        if any(not name.startswith("latent_steering.") for name in missing):
            raise ValueError(f"{path}: weights do not fit the policy being fine-tuned: missing {missing[:8]}")
        if missing:
            torch.nn.init.zeros_(self.reference.latent_steering.net[-1].weight)
            torch.nn.init.zeros_(self.reference.latent_steering.net[-1].bias)

    def sampler(self, model) -> Sampler:
        return functools.partial(steered_sample, model)

    def _transitions(
        self, model, batch: dict, chain: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The one Gaussian step of a decision: mean [N, 1, H, A], std, log-prob [N, 1] of its x_0."""
        mean = model.noise_mean(model.encode_observation(batch))
        std = torch.tensor(model.noise_std, device=chain.device)
        return mean[:, None], std, flow_matching.gaussian_log_prob(chain[:, 0], mean, std)[:, None]
