"""Fixtures shared by the policy RL tests (GRPO, PPO, NFT, steer): a tiny world model whose imagined episodes
differ in outcome, a trainer on it, a two-iteration fine-tuning config, and a flat view of a module's parameters.

A random tiny world model's success head can fire (or never fire) for every start, depending on how the
random weights fall; RL tests need both outcomes. `mixed_outcome_world_model` shifts the success logit's
bias so that about one imagined step in ten from random starts crosses probability 0.5: over a few chunks
some episodes succeed and others do not.
"""

from __future__ import annotations

import torch
from imagination_fixtures import random_starts, tiny_policy, tiny_world_model

from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig


def mixed_outcome_world_model(seed: int = 0) -> WorldModel:
    wm = tiny_world_model(seed)
    env = WorldModelEnv(wm, WorldModelEnvConfig(horizon=2))
    env.reset(random_starts(16, seed=123), seed=0)
    g = torch.Generator().manual_seed(0)
    *_, info = env.step(torch.rand(16, 2, 4, generator=g))
    logits = torch.logit(info["success_prob"].clamp(1e-6, 1 - 1e-6))
    with torch.no_grad():
        wm.heads.out.bias[1] -= torch.quantile(logits.flatten(), 0.9)
    return wm


def make_trainer(trainer_class, cfg, horizon: int, seed: int = 0):
    """`trainer_class` (GRPOTrainer, PPOTrainer) fine-tuning a fresh tiny policy in the mixed-outcome world
    model, episodes of `horizon` env steps."""
    env = WorldModelEnv(
        mixed_outcome_world_model(), WorldModelEnvConfig(horizon=horizon, success_threshold=0.5)
    )
    return trainer_class(tiny_policy(), env, cfg, seed=seed)


def tiny_finetune_config(tmp_path, algorithm):
    """A 2-iteration `finetune` config for `algorithm` on a saved tiny policy and mixed-outcome world model,
    evaluated on 2 reach episodes of 4 steps (the output under `tmp_path / "ft"`)."""
    from worldloop.rl_finetune.policy_rl.finetune import (
        FinetuneEvalConfig,
        FinetunePolicyConfig,
        PolicyPath,
        StartsConfig,
    )
    from worldloop.vla.sim_evaluation import SimEvalConfig

    wm, policy = tmp_path / "wm", tmp_path / "policy"
    mixed_outcome_world_model().save_pretrained(wm)
    tiny_policy().save_pretrained(policy)
    return FinetunePolicyConfig(
        policy=PolicyPath(str(policy)), world_model=str(wm), output_dir=str(tmp_path / "ft"), iterations=2,
        env=WorldModelEnvConfig(horizon=4), algorithm=algorithm, starts=StartsConfig(count=3, seed=0),
        eval=FinetuneEvalConfig(every=2, episodes=2, seed=100, batch_envs=2, max_gap=1.0,
                                sim=SimEvalConfig(task="reach", max_steps=4, batch_envs=2, videos=0)),
    )  # fmt: skip


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    """A detached copy of all of `module`'s parameters in one vector, to compare before and after updates."""
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])
