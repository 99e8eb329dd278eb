"""GRPO in imagination: advantages, log-prob consistency, one iteration changes the policy reproducibly,
the KL trust region, and zero simulator steps."""

from __future__ import annotations

import pytest
import torch
from imagination_fixtures import random_starts, tiny_world_model
from rl_fixtures import flat_params, make_trainer

from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.rl_finetune.policy_rl.grpo.grpo import GRPOTrainer, group_advantages
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.world_model.world_model_env import WorldModelEnv

CFG = GRPOConfig(group_size=4, starts_per_iteration=2, epochs=1, minibatch_size=16, lr=1e-3, kl_coef=0.1)


def _trainer(seed=0, cfg=CFG):
    return make_trainer(GRPOTrainer, cfg, horizon=4, seed=seed)


def test_group_advantages_are_normalised_within_each_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5]), 4)
    assert adv[:4].tolist() == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)
    assert adv[4:].abs().max() == 0  # a group with equal returns teaches nothing
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)


def test_unscaled_group_advantages_keep_the_size_of_the_return_gap():
    returns = torch.tensor([1.5, 0.5, 1.5, 0.5, 0.31, 0.29, 0.31, 0.29])
    adv = group_advantages(returns, 4, scale_by_std=False)
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.01, -0.01, 0.01, -0.01], abs=1e-6)
    scaled = group_advantages(returns, 4)
    assert scaled[4:].abs().max() > 0.8  # scaled, a tiny progress gap weighs as much as success


def test_collected_log_probs_match_the_recomputed_ones():
    trainer = _trainer()
    data = trainer.collect(random_starts(2), seed=0)
    # 2 starts x 4 rollouts, horizon 4, 2 actions per chunk -> 1 or 2 live chunk decisions per episode
    assert 8 < len(data) <= 16 and data.chain.shape[1:] == (3, 4, 4)
    _, _, log_probs = trainer._transitions(trainer.policy, data.batch(torch.arange(len(data))), data.chain)
    torch.testing.assert_close(log_probs, data.old_log_probs, atol=1e-3, rtol=1e-5)
    assert data.returns.shape == (8,) and data.returns.std() > 0


def test_one_iteration_changes_the_policy_and_is_reproducible():
    starts = random_starts(2, seed=3)
    a, b = _trainer(seed=7), _trainer(seed=7)
    before = flat_params(a.policy)
    logs_a, logs_b = a.step(starts), b.step(starts)
    after_a, after_b = flat_params(a.policy), flat_params(b.policy)
    assert (after_a - before).abs().max() > 1e-5
    assert torch.equal(after_a, after_b)
    assert logs_a == logs_b
    c = _trainer(seed=8)
    c.step(starts)
    assert not torch.equal(flat_params(c.policy), after_a)  # another seed, other rollouts


def test_kl_to_bc_is_zero_at_start_and_held_back_by_its_weight():
    starts = random_starts(2, seed=1)
    data = _trainer().collect(starts, seed=0)
    assert data.returns.numel() == 8
    free = _trainer(cfg=GRPOConfig(**{**CFG.__dict__, "kl_coef": 0.0, "epochs": 3}))
    tied = _trainer(cfg=GRPOConfig(**{**CFG.__dict__, "kl_coef": 50.0, "epochs": 3}))
    first = free.update(free.collect(starts, 0), seed=0)
    tied.update(tied.collect(starts, 0), seed=0)
    assert first["ratio_max"] > 0 and first["loss/kl"] >= 0
    bc = flat_params(free.reference)
    assert (flat_params(tied.policy) - bc).norm() < (flat_params(free.policy) - bc).norm()


def test_training_steps_the_simulator_zero_times():
    trainer = _trainer()
    with count_sim_steps() as counter:
        trainer.step(random_starts(2))
    assert counter.steps == 0
    # The counter does count: one sim env step is one physics advance.
    from worldloop.sim.tabletop_env import TabletopEnv

    env = TabletopEnv(task="reach", image_size=16, cameras=("front",))
    try:
        obs, _ = env.reset(seed=0)
        with count_sim_steps() as counter:
            env.step(obs["observation.state"])
        assert counter.steps == 1
    finally:
        env.close()


def test_non_flow_policy_is_refused():
    env = WorldModelEnv(tiny_world_model())
    with pytest.raises(TypeError, match="stochastic sampler"):
        GRPOTrainer(torch.nn.Linear(2, 2), env, CFG)


def test_shared_config_fields_keep_each_algorithms_defaults_and_validate():
    from worldloop.rl_finetune.policy_rl.configuration import FlowPolicyGradientConfig
    from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig

    assert issubclass(GRPOConfig, FlowPolicyGradientConfig) and issubclass(
        PPOConfig, FlowPolicyGradientConfig
    )
    # The shared fields keep each algorithm's own defaults.
    assert (GRPOConfig().starts_per_iteration, PPOConfig().starts_per_iteration) == (4, 16)
    with pytest.raises(ValueError, match=r"algorithm\.lr=0.0 must be > 0"):
        GRPOConfig(lr=0.0).validate()
    with pytest.raises(ValueError, match=r"algorithm\.epochs=0 must be >= 1"):
        PPOConfig(epochs=0).validate()


def test_mixed_starts_counts_groups_with_both_outcomes():
    from worldloop.rl_finetune.policy_rl.flow_policy_gradient import mixed_starts

    success = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0])  # 3 starts x 4: all, mixed, none
    assert mixed_starts(success, GRPOConfig(group_size=4, starts_per_iteration=3)) == pytest.approx(1 / 3)
