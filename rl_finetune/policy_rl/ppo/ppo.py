"""PPO with a value head: the alternative to GRPO for fine-tuning a flow-matching VLA in imagination.

    python finetune_policy.py --config configs/finetune/tiny.yaml --algorithm.type=ppo --policy.path=... --world_model=...

One iteration:
1. Collect (shared with GRPO, `rl_finetune.policy_rl.flow_policy_gradient.imagine_chunks`): `rollouts_per_start`
   imagined episodes from each of N starts with the policy's stochastic sampler; each chunk decision earns
   the success bonus when the success head first fires in its chunk plus the change of progress over it.
2. Advantages: a small value network reads the observation features of the frozen BC policy (its
   observation encoder's tokens, mean-pooled; frozen so that the value's inputs do not move while the
   policy learns) and the fraction of the horizon already used (the episode is finite, so the value
   depends on time). GAE(gamma, lambda) over each episode's chunk decisions, no bootstrap past its end;
   advantages are normalised over the batch, the value's targets are advantage + old value.
3. Update: the same per-denoising-step clipped objective and exact KL to the BC policy as GRPO, and on each
   minibatch a step of the value head on its clipped squared error (its own optimiser).

Compared with GRPO, PPO needs no group of rollouts per start: a decision's baseline is the value of its
own state, so every episode can start from a different state and credit is assigned per chunk.
"""

from __future__ import annotations

import torch
from torch import nn

from worldloop.rl_finetune.policy_rl.flow_policy_gradient import (
    FlowPolicyTrainer,
    Rollouts,
    flatten,
    imagine_chunks,
)
from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv


class ValueHead(nn.Module):
    """V(observation features, fraction of the horizon used) -> expected return to go."""

    def __init__(self, feature_dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(feature_dim + 1),
            nn.Linear(feature_dim + 1, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs).squeeze(-1)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, live: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns [T, B] of T decisions of B episodes; `live[t]` marks decisions taken before
    the episode ended. Nothing is bootstrapped past an episode's last decision (its horizon is final)."""
    steps = rewards.shape[0]
    live = live.float()
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(steps)):
        next_live = live[t + 1] if t + 1 < steps else torch.zeros_like(live[t])
        next_value = values[t + 1] * next_live if t + 1 < steps else torch.zeros_like(values[t])
        delta = rewards[t] + gamma * next_value - values[t]
        running = (delta + gamma * lam * next_live * running) * live[t]
        advantages[t] = running
    return advantages, advantages + values * live


class PPOTrainer(FlowPolicyTrainer):
    """PPO: the update of `FlowPolicyTrainer` on GAE advantages from a learned value head."""

    algorithm = "PPO"

    def __init__(self, policy, env: WorldModelEnv, cfg: PPOConfig, seed: int = 0):
        super().__init__(policy, env, cfg, seed)
        with torch.random.fork_rng(devices=[]):  # the value head's initial weights, from the seed alone
            torch.manual_seed(seed)
            self.value = ValueHead(policy.config.dim, cfg.value_hidden)
        self.value_optimizer = torch.optim.Adam(self.value.parameters(), lr=cfg.value_lr)

    @torch.no_grad()
    def value_inputs(self, obs: dict, time_fraction: float) -> torch.Tensor:
        """[B, D + 1]: the BC policy's mean-pooled observation tokens and the share of the horizon used."""
        tokens, pad = self.reference.encode_observation(obs)
        keep = (~pad).float()[..., None]
        pooled = (tokens * keep).sum(1) / keep.sum(1).clamp(min=1)
        return torch.cat([pooled, pooled.new_full((pooled.shape[0], 1), time_fraction)], 1)

    def collect(self, starts: InitialStates, seed: int) -> Rollouts:
        cfg = self.cfg
        chunks = imagine_chunks(
            self.policy,
            self.env,
            starts.repeat(cfg.rollouts_per_start),
            seed,
            self.sampler(self.policy),
            cfg,
        )
        chunk_steps = self.policy.n_action_steps
        horizon = self.env.config.horizon
        inputs = [self.value_inputs(o, t * chunk_steps / horizon) for t, o in enumerate(chunks.observations)]
        with torch.no_grad():
            values = torch.stack([self.value(x) for x in inputs])
        live = torch.stack(chunks.live)
        advantages, targets = gae(torch.stack(chunks.rewards), values * live, live, cfg.gamma, cfg.gae_lambda)
        if cfg.normalize_advantages:
            kept = advantages[live]
            advantages = (advantages - kept.mean()) / (kept.std() + 1e-6) if kept.numel() > 1 else advantages
        return flatten(
            chunks,
            list(advantages),
            {"value_inputs": inputs, "value_targets": list(targets), "old_values": list(values)},
        )

    def value_loss(self, data: Rollouts, index: torch.Tensor) -> torch.Tensor:
        inputs, targets = data.extras["value_inputs"][index], data.extras["value_targets"][index]
        predicted = self.value(inputs)
        loss = (predicted - targets) ** 2
        if self.cfg.value_clip > 0:
            old = data.extras["old_values"][index]
            clipped = old + (predicted - old).clamp(-self.cfg.value_clip, self.cfg.value_clip)
            loss = torch.maximum(loss, (clipped - targets) ** 2)
        return 0.5 * loss.mean()

    def auxiliary_update(self, data: Rollouts, index: torch.Tensor) -> dict[str, float]:
        loss = self.value_loss(data, index)
        self.value_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.value.parameters(), self.cfg.max_grad_norm)
        self.value_optimizer.step()
        return {"loss/value": loss.item()}

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "value": self.value.state_dict(),
            "value_optimizer": self.value_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.value.load_state_dict(state["value"])
        self.value_optimizer.load_state_dict(state["value_optimizer"])
