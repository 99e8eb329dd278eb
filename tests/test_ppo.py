"""PPO with a value head in imagination: GAE on known inputs, one iteration changes the policy reproducibly,
the value loss falls on a fixed batch, and training never steps the simulator."""

from __future__ import annotations

import pytest
import torch
from imagination_fixtures import random_starts, tiny_policy, tiny_world_model
from rl_fixtures import flat_params, make_trainer, mixed_outcome_world_model, tiny_finetune_config

from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig
from worldloop.rl_finetune.policy_rl.ppo.ppo import PPOTrainer, gae
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.world_model.world_model_env import WorldModelEnv

CFG = PPOConfig(
    starts_per_iteration=3, rollouts_per_start=2, epochs=1, minibatch_size=8, lr=1e-3, kl_coef=0.1
)


def _trainer(seed=0, cfg=CFG):
    return make_trainer(PPOTrainer, cfg, horizon=6, seed=seed)


def test_gae_on_known_inputs():
    # One episode of 3 decisions, one that ended after its first decision (the rest is not live).
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2], [0.5, 0.0], [0.5, 0.0]])
    live = torch.tensor([[True, True], [True, False], [True, False]])
    adv, ret = gae(rewards, values, live, gamma=0.5, lam=1.0)
    # lambda = 1: advantage = discounted return to go - value; nothing past the end is bootstrapped.
    assert ret[:, 0].tolist() == pytest.approx([0.25, 0.5, 1.0])
    assert adv[:, 0].tolist() == pytest.approx([-0.25, 0.0, 0.5])
    assert adv[:, 1].tolist() == pytest.approx([0.8, 0.0, 0.0]) and ret[1:, 1].abs().max() == 0
    adv0, _ = gae(rewards, values, live, gamma=0.5, lam=0.0)  # lambda = 0: one-step TD errors
    assert adv0[0, 0].item() == pytest.approx(0.0 + 0.5 * 0.5 - 0.5)


def test_collected_data_has_value_targets_and_matching_log_probs():
    trainer = _trainer()
    data = trainer.collect(random_starts(3), seed=0)
    assert data.returns.shape == (6,)
    assert data.extras["value_inputs"].shape == (len(data), 32 + 1)
    assert data.extras["value_targets"].shape == (len(data),)
    # The last input column is the share of the horizon used when the decision was taken.
    assert data.extras["value_inputs"][:, -1].min() == 0 and data.extras["value_inputs"][:, -1].max() < 1
    _, _, log_probs = trainer._transitions(trainer.policy, data.batch(torch.arange(len(data))), data.chain)
    torch.testing.assert_close(log_probs, data.old_log_probs, atol=1e-3, rtol=1e-5)


def test_one_iteration_changes_the_policy_and_is_reproducible():
    starts = random_starts(3, seed=3)
    a, b = _trainer(seed=7), _trainer(seed=7)
    before, value_before = flat_params(a.policy), flat_params(a.value)
    logs_a, logs_b = a.step(starts), b.step(starts)
    assert (flat_params(a.policy) - before).abs().max() > 1e-5
    assert (flat_params(a.value) - value_before).abs().max() > 1e-5
    assert torch.equal(flat_params(a.policy), flat_params(b.policy)) and torch.equal(
        flat_params(a.value), flat_params(b.value)
    )
    assert logs_a == logs_b and "loss/value" in logs_a
    c = _trainer(seed=8)
    c.step(starts)
    assert not torch.equal(flat_params(c.policy), flat_params(a.policy))


@pytest.mark.parametrize("value_clip", [0.0, 0.05])
def test_value_loss_decreases_on_a_fixed_batch(value_clip):
    trainer = _trainer(cfg=PPOConfig(**{**CFG.__dict__, "value_clip": value_clip}))
    data = trainer.collect(random_starts(3), seed=1)
    everything = torch.arange(len(data))
    with torch.no_grad():
        first = trainer.value_loss(data, everything).item()
    for _ in range(30):
        trainer.auxiliary_update(data, everything)
    with torch.no_grad():
        last = trainer.value_loss(data, everything).item()
    # The clip takes the gradient away once the value has moved past old value +- clip towards its
    # target, so the clipped loss falls more slowly.
    assert last < (first if value_clip else 0.5 * first)


def test_state_dict_round_trip_includes_the_value_head():
    a = _trainer(seed=1)
    a.step(random_starts(3))
    b = _trainer(seed=2)
    b.load_state_dict(a.state_dict())
    assert torch.equal(flat_params(a.value), flat_params(b.value)) and b.iteration == 1


def test_training_steps_the_simulator_zero_times():
    trainer = _trainer()
    with count_sim_steps() as counter:
        trainer.step(random_starts(3))
    assert counter.steps == 0


def test_bad_config_and_non_flow_policy_are_refused():
    with pytest.raises(ValueError, match="gae_lambda"):
        PPOConfig(gae_lambda=1.5).validate()
    with pytest.raises(TypeError, match="PPO needs a flow-matching policy"):
        PPOTrainer(torch.nn.Linear(2, 2), WorldModelEnv(tiny_world_model()), CFG)


def test_finetune_with_ppo_runs_without_sim_steps_and_resumes_its_value_head(tmp_path):
    from worldloop.common.checkpoint import load_torch
    from worldloop.rl_finetune.policy_rl.finetune import finetune, make_trainer

    algorithm = PPOConfig(starts_per_iteration=2, rollouts_per_start=1, epochs=1, minibatch_size=8, lr=1e-3)
    cfg = tiny_finetune_config(tmp_path, algorithm)
    summary = finetune(cfg)
    assert summary["algorithm"] == "ppo" and summary["iterations_run"] == 2
    assert summary["train_sim_steps"] == 0 and summary["eval_sim_steps"] > 0
    assert summary["imagined_env_steps_per_iteration"] == 2 * 1 * 4
    state = load_torch(tmp_path / "ft" / "checkpoints" / "000002" / "trainer_state.pt")
    assert state["iteration"] == 2 and "value" in state
    trainer = make_trainer(cfg, tiny_policy(), WorldModelEnv(mixed_outcome_world_model()))
    trainer.load_state_dict(state)
    assert all(torch.equal(a, state["value"][k]) for k, a in trainer.value.state_dict().items())
