"""NFT in imagination: optimality weights per group, one iteration changes the policy reproducibly, the
old policy follows softly, equal rewards leave the policy where it is, resume, zero simulator steps."""

from __future__ import annotations

import pytest
import torch
from imagination_fixtures import random_starts
from rl_fixtures import flat_params, make_trainer

from worldloop.rl_finetune.policy_rl.flow_policy_gradient import imagine_chunks
from worldloop.rl_finetune.policy_rl.nft.configuration_nft import PolicyNFTConfig
from worldloop.rl_finetune.policy_rl.nft.nft import PolicyNFTTrainer
from worldloop.rl_finetune.sim_steps import count_sim_steps

CFG = PolicyNFTConfig(
    group_size=4, starts_per_iteration=2, epochs=1, minibatch_size=16, lr=1e-3, reference_weight=0.0
)


def _trainer(seed=0, cfg=CFG):
    return make_trainer(PolicyNFTTrainer, cfg, horizon=4, seed=seed)


def test_collected_weights_are_group_optimality_probabilities():
    trainer = _trainer()
    data = trainer.collect(random_starts(2), seed=0)
    assert data.returns.shape == (8,) and data.returns.std() > 0
    assert data.advantages.min() >= 0 and data.advantages.max() <= 1
    # every episode is live at its first decision: the first 8 weights are the episodes' own, in order
    r, returns = data.advantages[:8].view(2, 4), data.returns.view(2, 4)
    for group in range(2):
        assert torch.equal(r[group].argsort(), returns[group].argsort())  # better return, higher weight
    # |advantage| <= (G - 1) / sqrt(G) = 1.5 < advantage_clip: nothing saturates, the weights average 1/2
    torch.testing.assert_close(r.mean(1), torch.full((2,), 0.5))


def test_one_iteration_changes_the_policy_and_is_reproducible():
    starts = random_starts(2, seed=3)
    a, b = _trainer(seed=7), _trainer(seed=7)
    before = flat_params(a.policy)
    logs_a, logs_b = a.step(starts), b.step(starts)
    after_a = flat_params(a.policy)
    assert (after_a - before).abs().max() > 1e-5
    assert torch.equal(after_a, flat_params(b.policy)) and logs_a == logs_b
    assert logs_a["loss/nft"] > 0 and logs_a["gradient_steps"] == 1


def test_the_old_policy_follows_softly():
    half = _trainer(cfg=PolicyNFTConfig(**{**CFG.__dict__, "old_decay": 0.5}))
    before = flat_params(half.old)
    half.step(random_starts(2, seed=1))
    now = flat_params(half.policy)
    torch.testing.assert_close(flat_params(half.old), 0.5 * before + 0.5 * now)
    on_policy = _trainer(cfg=PolicyNFTConfig(**{**CFG.__dict__, "old_decay": 0.0}))
    on_policy.step(random_starts(2, seed=1))
    assert torch.equal(flat_params(on_policy.old), flat_params(on_policy.policy))


def test_equal_rewards_leave_the_policy_in_place():
    trainer = _trainer()
    data = trainer.collect(random_starts(2, seed=2), seed=0)
    data.advantages = torch.full_like(data.advantages, 0.5)  # every chunk neither good nor bad
    before = flat_params(trainer.policy)
    # plain SGD so that the step is the gradient (Adam's first step has size lr whatever the gradient)
    trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=1.0)
    trainer.update(data, seed=0)
    # at theta = old the NFT loss's gradient is zero: the policy does not move
    assert (flat_params(trainer.policy) - before).abs().max() < 1e-5
    data.advantages = torch.ones_like(data.advantages)  # every chunk good: it moves
    trainer.update(data, seed=0)
    assert (flat_params(trainer.policy) - before).abs().max() > 1e-3


def test_state_round_trip_resumes_the_old_policy():
    a = _trainer(cfg=PolicyNFTConfig(**{**CFG.__dict__, "old_decay": 0.5}))
    a.step(random_starts(2, seed=4))
    b = _trainer(cfg=PolicyNFTConfig(**{**CFG.__dict__, "old_decay": 0.5}))
    b.load_state_dict(a.state_dict())
    assert torch.equal(flat_params(b.old), flat_params(a.old)) and b.iteration == 1


def test_training_steps_the_simulator_zero_times():
    trainer = _trainer()
    with count_sim_steps() as counter:
        trainer.step(random_starts(2))
    assert counter.steps == 0


def test_config_is_checked_and_parses_from_the_cli():
    from worldloop.common.config import parse_cli
    from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig

    with pytest.raises(ValueError, match="algorithm.group_size"):
        PolicyNFTConfig(group_size=1).validate()
    with pytest.raises(ValueError, match="nft.beta"):
        PolicyNFTConfig(beta=0.0).validate()
    cfg = parse_cli(
        FinetunePolicyConfig,
        [
            "--config",
            "configs/finetune/tiny.yaml",
            "--algorithm.type=nft",
            "--algorithm.beta=0.5",
            "--algorithm.group_size=6",
        ],
    )
    assert isinstance(cfg.algorithm, PolicyNFTConfig) and (cfg.algorithm.beta, cfg.algorithm.group_size) == (
        0.5,
        6,
    )
    assert cfg.episodes_per_iteration == cfg.algorithm.starts_per_iteration * 6


def test_hindsight_judged_under_the_own_instruction_is_the_episode_success():
    trainer = _trainer()
    starts = random_starts(2, seed=5).repeat(4)
    own = sorted(set(starts.task))
    chunks = imagine_chunks(trainer.old, trainer.env, starts, 0, trainer.sampler(trainer.old), CFG, own)
    column = torch.tensor([own.index(t) for t in starts.task])
    judged_own = chunks.hindsight.gather(1, column[:, None])[:, 0]
    assert torch.equal(judged_own >= 0, chunks.success.bool())
    plain = imagine_chunks(trainer.old, trainer.env, starts, 0, trainer.sampler(trainer.old), CFG)
    assert plain.hindsight is None and torch.equal(plain.returns, chunks.returns)  # judging changes nothing


def test_hindsight_adds_failed_episodes_relabelled_with_what_they_achieved():
    cfg = PolicyNFTConfig(**{**CFG.__dict__, "hindsight": True})
    starts = random_starts(2, seed=5)
    with_hindsight, without = _trainer(cfg=cfg), _trainer()
    data, base = with_hindsight.collect(starts, seed=0), without.collect(starts, seed=0)
    n = len(base)
    assert torch.equal(data.chain[:n], base.chain[:n]) and torch.equal(data.advantages[:n], base.advantages)
    extra = len(data) - n
    assert extra > 0 and 0 < with_hindsight.relabelled < 1
    assert torch.equal(data.advantages[n:], torch.ones(extra))  # relabelled: a success under its label
    # every relabelled decision is one the policy took under the other instruction
    for i in range(n, len(data)):
        same = (base.chain == data.chain[i]).flatten(1).all(1).nonzero().flatten().tolist()
        assert same and all(base.task[j] != data.task[i] for j in same)
    assert "hindsight/relabelled" in with_hindsight.step(starts)


def test_success_weights_learn_the_successes_and_leave_the_failures():
    cfg = PolicyNFTConfig(**{**CFG.__dict__, "weights": "success"})
    data = _trainer(cfg=cfg).collect(random_starts(2), seed=0)
    assert 0 < data.success.mean() < 1
    torch.testing.assert_close(
        data.advantages[:8], 0.5 + 0.5 * data.success
    )  # first decision of each episode
    with pytest.raises(ValueError, match="algorithm.weights='best'"):
        PolicyNFTConfig(weights="best").validate()


def test_a_frozen_observation_encoder_keeps_its_weights_and_the_action_expert_learns():
    trainer = _trainer(cfg=PolicyNFTConfig(**{**CFG.__dict__, "train_observation_encoder": False}))
    encoder, expert = (
        flat_params(trainer.policy.observation_encoder),
        flat_params(trainer.policy.action_expert),
    )
    trainer.step(random_starts(2, seed=3))
    assert torch.equal(flat_params(trainer.policy.observation_encoder), encoder)
    assert (flat_params(trainer.policy.action_expert) - expert).abs().max() > 1e-5
