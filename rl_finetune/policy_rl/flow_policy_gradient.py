"""What GRPO, PPO and NFT share when they fine-tune a flow-matching VLA inside the world model.

- `imagine_chunks`: roll the policy's stochastic sampler out in a `WorldModelEnv` (never the simulator) and
  keep, for every chunk decision, the observation, the denoising chain and its per-step log-probs, which
  envs were still live, and the reward that decision earned.
- `Rollouts`: those decisions flattened over (chunk step, episode), live ones only, with an advantage each
  (how the advantage is made is the algorithm's business; NFT stores its optimality weights there).
- `FlowPolicyTrainer`: the BC reference, the optimiser, an iteration's bookkeeping, and the update GRPO
  and PPO use (NFT, rl_finetune/policy_rl/nft/nft.py, replaces it by a likelihood-free one). Every denoising step
  of the sampler is a Gaussian policy step (as in Flow-GRPO), so the PPO-clipped objective takes its ratio
  per step; the exact KL to the frozen BC policy is |mean - mean_bc|^2 / (2 std^2) because both
  transitions share the std. The clip keeps an update near the data-collecting policy; the KL keeps the
  whole run near BC, the trust region that stops the policy from drifting into states where the world
  model is wrong.

Rewards: a decision's reward is `success_reward` when the success head first fires during its chunk plus
`progress_reward` times the change of the reward head's progress over the chunk. An episode's rewards
sum to `success_reward * success + progress_reward * final progress` (progress starts at 0 at reset).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from worldloop.common.checkpoint import load_model_weights
from worldloop.data.features import IMAGE_PREFIX, STATE, TASK, camera_of, image_key
from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig
from worldloop.vla.flow_vla import flow_matching
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv

# How a trainer draws a chunk: (observation batch, generator=...) -> the chunk with its chain and log-probs.
Sampler = Callable[..., flow_matching.StochasticChunk]


@dataclass
class ImaginedChunks:
    """A batch of imagined episodes, one entry per chunk decision (all tensors have the batch B first)."""

    observations: list[dict]  # the policy's input at each decision
    chains: list[torch.Tensor]  # [B, K+1, H, A] normalised denoising chains
    log_probs: list[torch.Tensor]  # [B, K] per-step log-probs under the collecting policy
    live: list[torch.Tensor]  # [B] bool: the episode had not ended before this decision
    rewards: list[torch.Tensor]  # [B] what the decision earned (see the module docstring)
    success: torch.Tensor  # [B] float
    progress: torch.Tensor  # [B] final progress in [0, 1]
    returns: torch.Tensor  # [B] success_reward * success + progress_reward * progress (= summed rewards)
    # [B, I] with `instructions`: the first decision after which the success head, judging under
    # instruction i, crossed the threshold while the episode was live (-1: never). See `imagine_chunks`.
    hindsight: torch.Tensor | None = None


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
    extras: dict[
        str, torch.Tensor
    ]  # algorithm-specific per-decision tensors [N, ...] (PPO: features, targets)

    def __len__(self) -> int:
        return self.chain.shape[0]

    def batch(self, index: torch.Tensor) -> dict:
        b = {image_key(c): v[index] for c, v in self.images.items()}
        b[STATE] = self.state[index]
        b[TASK] = [self.task[i] for i in index.tolist()]
        return b

    def with_decisions(self, more: list[Rollouts]) -> Rollouts:
        """These rollouts plus the decisions of `more` (per-episode figures stay these rollouts')."""
        every = [self, *more]
        return Rollouts(
            images={c: torch.cat([r.images[c] for r in every]) for c in self.images},
            state=torch.cat([r.state for r in every]),
            task=[t for r in every for t in r.task],
            chain=torch.cat([r.chain for r in every]),
            old_log_probs=torch.cat([r.old_log_probs for r in every]),
            advantages=torch.cat([r.advantages for r in every]),
            returns=self.returns,
            success=self.success,
            progress=self.progress,
            extras={k: torch.cat([r.extras[k] for r in every]) for k in self.extras},
        )


@torch.no_grad()
def imagine_chunks(
    policy,
    env: WorldModelEnv,
    starts: InitialStates,
    seed: int,
    sample: Sampler,
    cfg: AlgorithmConfig,
    instructions: list[str] | None = None,
) -> ImaginedChunks:
    """Episodes from `starts`, each chunk drawn by `sample` (the trainer's `sampler(policy)`), rewarded by
    `cfg`'s success and progress weights.

    With `instructions`, every imagined step is also judged under each of them (`WorldModelEnv.success_prob`),
    and `hindsight` records after which decision an episode would have succeeded had it been asked for it.
    """
    policy.eval()
    generator = torch.Generator(device=env.device).manual_seed(seed)
    obs = env.reset(starts, seed=seed)
    out = ImaginedChunks([], [], [], [], [], *(torch.empty(0),) * 3)
    b = starts.batch_size
    if instructions:
        out.hindsight = torch.full((b, len(instructions)), -1, dtype=torch.long, device=env.device)
    while not env.done.all():
        live = ~env.done
        succeeded, progress = env.succeeded.clone(), env.progress.clone()
        drawn = sample(obs, generator=generator)
        actions = policy.unnormalize_actions(drawn.actions)[:, : policy.n_action_steps]
        out.observations.append(obs)
        out.chains.append(drawn.chain)
        out.log_probs.append(drawn.step_log_probs)
        out.live.append(live)
        obs, _, _, _, info = env.step(actions)
        for i, instruction in enumerate(instructions or []):
            hit = (env.success_prob(info, [instruction] * b) > env.success_threshold).any(1) & live
            out.hindsight[:, i] = torch.where(
                hit & (out.hindsight[:, i] < 0), len(out.chains) - 1, out.hindsight[:, i]
            )
        first_success = (env.succeeded & ~succeeded).float()
        reward = cfg.success_reward * first_success + cfg.progress_reward * (env.progress - progress)
        out.rewards.append(reward * live)
    out.success, out.progress = env.succeeded.float(), env.progress.clone()
    out.returns = cfg.success_reward * out.success + cfg.progress_reward * out.progress
    return out


def flatten(chunks: ImaginedChunks, advantages: list[torch.Tensor], extras: dict | None = None) -> Rollouts:
    """Live decisions only; `advantages` and each of `extras` hold one [B, ...] tensor per decision."""
    keep = [live.nonzero().flatten() for live in chunks.live]
    cams = [camera_of(k) for k in chunks.observations[0] if k.startswith(IMAGE_PREFIX)]

    def cat(per_step: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([x[k] for x, k in zip(per_step, keep)])

    return Rollouts(
        images={c: cat([o[image_key(c)] for o in chunks.observations]) for c in cams},
        state=cat([o[STATE] for o in chunks.observations]),
        task=[o[TASK][i] for o, k in zip(chunks.observations, keep) for i in k.tolist()],
        chain=cat(chunks.chains),
        old_log_probs=cat(chunks.log_probs),
        advantages=cat(advantages),
        returns=chunks.returns,
        success=chunks.success,
        progress=chunks.progress,
        extras={name: cat(values) for name, values in (extras or {}).items()},
    )


def mixed_starts(success: torch.Tensor, cfg: AlgorithmConfig) -> float:
    """Share of the iteration's start states whose rollouts (`starts.repeat(k)` order) both succeeded and
    failed: where success tells rollouts of one start apart, the only place a sparse success reward
    teaches anything relative to its group."""
    outcomes = success.view(-1, cfg.episodes_per_iteration // cfg.starts_per_iteration)
    return (outcomes.amax(1) != outcomes.amin(1)).float().mean().item()


def check_flow_policy(policy, algorithm: str) -> None:
    needed = ("sample_stochastic", "encode_observation", "velocity_fn", "unnormalize_actions")
    missing = [m for m in needed if not hasattr(policy, m)]
    if missing:
        raise TypeError(
            f"{algorithm} needs a flow-matching policy with a stochastic sampler (FlowVLAPolicy); "
            f"{type(policy).__name__} lacks {missing}"
        )


class FlowPolicyTrainer:
    """Owns the policy being trained, the frozen BC reference and the optimiser; subclasses define
    `collect(starts, seed) -> Rollouts` and may add a loss of their own in `auxiliary_update`."""

    algorithm = "policy gradient"

    def __init__(self, policy, env: WorldModelEnv, cfg: AlgorithmConfig, seed: int = 0):
        cfg.validate()
        check_flow_policy(policy, self.algorithm)
        self.policy, self.env, self.cfg, self.seed = policy, env, cfg, seed
        self.reference = copy.deepcopy(policy).eval().requires_grad_(False)
        if not cfg.train_observation_encoder:
            if not isinstance(getattr(policy, "observation_encoder", None), torch.nn.Module):
                raise TypeError(
                    "algorithm.train_observation_encoder=false: {type(policy).__name__} has no "
                    "observation_encoder module to keep frozen"
                )
            policy.observation_encoder.requires_grad_(False)
        self.noise_level = cfg.noise_level or policy.config.sde_noise_level
        self.optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.iteration = 0

    def collect(self, starts: InitialStates, seed: int) -> Rollouts:
        raise NotImplementedError

    def load_reference(self, path: Path) -> None:
        """The BC reference's weights from a `model.safetensors` (`FinetunePolicyConfig.reference_policy`)."""
        load_model_weights(self.reference, path)

    def sampler(self, model) -> Sampler:
        """How `model` draws the chunks it is trained on: its noise-injected sampler at the exploration
        noise (each denoising step a Gaussian policy step, see `_transitions`)."""
        return functools.partial(model.sample_stochastic, noise_level=self.noise_level)

    def auxiliary_update(self, data: Rollouts, index: torch.Tensor) -> dict[str, float]:
        """A further loss on the same minibatch (PPO: the value head); GRPO has none."""
        return {}

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
                for key, value in self.auxiliary_update(data, index).items():
                    logs[key] = logs.get(key, 0.0) + value
                logs["loss/policy"] += policy_loss.item()
                logs["loss/kl"] += kl.item()
                logs["clip_fraction"] += ((ratio - 1).abs() > cfg.clip_ratio).float().mean().item()
                logs["ratio_max"] = max(logs["ratio_max"], ratio.max().item())
                n_steps += 1
        policy.eval()
        for key in logs:
            if key != "ratio_max":
                logs[key] /= max(n_steps, 1)
        logs["gradient_steps"] = n_steps
        return logs

    def step(self, starts: InitialStates) -> dict[str, float]:
        """One iteration from `starts` (N initial states); returns its logs."""
        seed = self.seed * 100_003 + self.iteration
        data = self.collect(starts, seed)
        logs = self.update(data, seed)
        logs.update(
            {
                "imagined/return": data.returns.mean().item(),
                "imagined/success": data.success.mean().item(),
                "imagined/mixed_starts": mixed_starts(data.success, self.cfg),
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
