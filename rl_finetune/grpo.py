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

Everything random is drawn from generators seeded by (seed, iteration), so a run is reproducible.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from data.features import STATE, TASK, image_key
from vla.flow_vla import flow_matching
from world_model.world_model_env import InitialStates, WorldModelEnv


@dataclass
class GRPOConfig:
    group_size: int = 8  # rollouts per initial state
    starts_per_iteration: int = 4  # initial states per iteration (batch = starts x group)
    epochs: int = 2  # passes over an iteration's data
    minibatch_size: int = 32  # chunk samples per gradient step
    lr: float = 1.0e-5
    weight_decay: float = 0.0
    clip_ratio: float = 0.2  # PPO clip on the per-denoising-step ratio
    kl_coef: float = 0.05  # weight of KL(policy || BC policy)
    max_grad_norm: float = 1.0
    noise_level: float = 0.0  # sampler noise for exploration; 0 -> the policy's sde_noise_level
    success_reward: float = 1.0  # sparse: 1 if the success head fired before the horizon
    progress_reward: float = 0.5  # dense: the reward head's final progress in [0, 1]
    advantage_eps: float = 1e-4  # groups whose returns are all equal give zero advantage

    def validate(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"grpo.group_size={self.group_size}: a group needs at least 2 rollouts")
        for name in ("starts_per_iteration", "epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"grpo.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0 or self.clip_ratio <= 0 or self.kl_coef < 0 or self.noise_level < 0:
            raise ValueError("grpo: need lr > 0, clip_ratio > 0, kl_coef >= 0, noise_level >= 0")


@dataclass
class Rollouts:
    """Chunk decisions of one iteration, flattened over (chunk step, episode); only live steps are kept."""

    images: dict[str, torch.Tensor]  # camera -> [N, 3, H, W]
    state: torch.Tensor  # [N, S]
    task: list[str]
    chain: torch.Tensor  # [N, K+1, H, A] normalised denoising chains
    old_log_probs: torch.Tensor  # [N, K] per-step log-probs under the collecting policy
    advantages: torch.Tensor  # [N]
    returns: torch.Tensor  # [B] per episode
    success: torch.Tensor  # [B]
    progress: torch.Tensor  # [B]

    def __len__(self) -> int:
        return self.chain.shape[0]

    def batch(self, index: torch.Tensor) -> dict:
        b = {image_key(c): v[index] for c, v in self.images.items()}
        b[STATE] = self.state[index]
        b[TASK] = [self.task[i] for i in index.tolist()]
        return b


def group_advantages(returns: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """(R - mean of its group) / (std of its group + eps); rows are [s0 x G, s1 x G, ...]."""
    if returns.numel() % group_size:
        raise ValueError(f"{returns.numel()} returns do not split into groups of {group_size}")
    r = returns.view(-1, group_size)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)
    return adv.flatten()


def _check_flow_policy(policy) -> None:
    needed = ("sample_stochastic", "encode_observation", "velocity_fn", "unnormalize_actions")
    missing = [m for m in needed if not hasattr(policy, m)]
    if missing:
        raise TypeError(
            f"GRPO needs a flow-matching policy with a stochastic sampler (FlowVLAPolicy); "
            f"{type(policy).__name__} lacks {missing}"
        )


class GRPOTrainer:
    """Owns the policy being trained, the frozen BC reference and the optimiser."""

    def __init__(self, policy, env: WorldModelEnv, cfg: GRPOConfig, seed: int = 0):
        cfg.validate()
        _check_flow_policy(policy)
        self.policy, self.env, self.cfg, self.seed = policy, env, cfg, seed
        self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        self.noise_level = cfg.noise_level or policy.config.sde_noise_level
        self.optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.iteration = 0

    # ---- collection ----------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, starts: InitialStates, seed: int) -> Rollouts:
        """Imagine `group_size` episodes from every start with the stochastic sampler."""
        cfg, env, policy = self.cfg, self.env, self.policy
        policy.eval()
        group = starts.repeat(cfg.group_size)
        generator = torch.Generator(device=env.device).manual_seed(seed)
        obs = env.reset(group, seed=seed)
        steps: list[dict] = []
        while not env.done.all():
            live = ~env.done
            sample = policy.sample_stochastic(obs, generator=generator, noise_level=self.noise_level)
            actions = policy.unnormalize_actions(sample.actions)[:, : policy.n_action_steps]
            steps.append(
                {"obs": obs, "chain": sample.chain, "log_probs": sample.step_log_probs, "live": live}
            )
            obs, *_ = env.step(actions)
        success, progress = env.succeeded.float(), env.progress
        returns = cfg.success_reward * success + cfg.progress_reward * progress
        adv = group_advantages(returns, cfg.group_size, cfg.advantage_eps)
        keep = [s["live"].nonzero().flatten() for s in steps]
        cams = [c for c in env.cameras if image_key(c) in steps[0]["obs"]]
        return Rollouts(
            images={c: torch.cat([s["obs"][image_key(c)][k] for s, k in zip(steps, keep)]) for c in cams},
            state=torch.cat([s["obs"][STATE][k] for s, k in zip(steps, keep)]),
            task=[s["obs"][TASK][i] for s, k in zip(steps, keep) for i in k.tolist()],
            chain=torch.cat([s["chain"][k] for s, k in zip(steps, keep)]),
            old_log_probs=torch.cat([s["log_probs"][k] for s, k in zip(steps, keep)]),
            advantages=torch.cat([adv[k] for k in keep]),
            returns=returns,
            success=success,
            progress=progress,
        )

    # ---- update --------------------------------------------------------------------------------------
    def _transitions(
        self, model, batch: dict, chain: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per denoising step: means [N, K, H, A], std (scalar tensor) and log-probs [N, K] of `chain`."""
        velocity = model.velocity_fn(model.encode_observation(batch))
        k_steps = chain.shape[1] - 1
        dt = 1.0 / k_steps
        means, log_probs = [], []
        for k, t in enumerate(flow_matching.time_grid(k_steps, chain.shape[0], chain.device)):
            mean, std = flow_matching.sde_transition(velocity, chain[:, k], t, dt, self.noise_level)
            means.append(mean)
            log_probs.append(flow_matching.gaussian_log_prob(chain[:, k + 1], mean, std))
        return torch.stack(means, 1), std.flatten()[0], torch.stack(log_probs, 1)

    def update(self, data: Rollouts, seed: int) -> dict[str, float]:
        cfg, policy = self.cfg, self.policy
        policy.train()
        generator = torch.Generator().manual_seed(seed)
        logs = {"loss/policy": 0.0, "loss/kl": 0.0, "clip_fraction": 0.0, "ratio_max": 0.0}
        n_steps = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(len(data), generator=generator)
            for first in range(0, len(data), cfg.minibatch_size):
                index = order[first : first + cfg.minibatch_size]
                batch, chain = data.batch(index), data.chain[index]
                means, std, log_probs = self._transitions(policy, batch, chain)
                with torch.no_grad():
                    ref_means, _, _ = self._transitions(self.reference, batch, chain)
                ratio = torch.exp(log_probs - data.old_log_probs[index])
                adv = data.advantages[index][:, None]
                clipped = ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
                policy_loss = -torch.minimum(ratio * adv, clipped * adv).mean()
                kl = ((means - ref_means) ** 2).flatten(2).sum(-1).mean() / (2 * std**2)
                loss = policy_loss + cfg.kl_coef * kl
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                logs["loss/policy"] += policy_loss.item()
                logs["loss/kl"] += kl.item()
                logs["clip_fraction"] += ((ratio - 1).abs() > cfg.clip_ratio).float().mean().item()
                logs["ratio_max"] = max(logs["ratio_max"], ratio.max().item())
                n_steps += 1
        policy.eval()
        for key in ("loss/policy", "loss/kl", "clip_fraction"):
            logs[key] /= max(n_steps, 1)
        logs["gradient_steps"] = n_steps
        return logs

    def step(self, starts: InitialStates) -> dict[str, float]:
        """One GRPO iteration from `starts` (N initial states); returns its logs."""
        seed = self.seed * 100_003 + self.iteration
        data = self.collect(starts, seed)
        logs = self.update(data, seed)
        logs.update(
            {
                "imagined/return": data.returns.mean().item(),
                "imagined/success": data.success.mean().item(),
                "imagined/progress": data.progress.mean().item(),
                "samples": len(data),
            }
        )
        self.iteration += 1
        return logs

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
