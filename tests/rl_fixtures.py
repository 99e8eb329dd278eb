"""Fixtures shared by tests/test_grpo.py and tests/test_ppo.py: a tiny world model whose imagined episodes
differ in outcome, a trainer on it, and a flat view of a module's parameters.

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


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    """A detached copy of all of `module`'s parameters in one vector, to compare before and after updates."""
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])
