"""Latent steering (`--algorithm.type=steer`): a fresh head leaves the policy as it was, the collected x_0 are
scored as they were drawn, an update moves the head alone, and the fine-tuned policy keeps its head when
saved, loaded and fine-tuned again."""

from __future__ import annotations

import pytest
import torch
import vla_fixtures
from imagination_fixtures import random_starts, tiny_policy, tiny_world_model
from rl_fixtures import flat_params, make_trainer, mixed_outcome_world_model, tiny_finetune_config

from worldloop.rl_finetune.policy_rl.steer.configuration_steer import SteerConfig
from worldloop.rl_finetune.policy_rl.steer.steer import SteerTrainer, steered_sample
from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy, flow_matching
from worldloop.world_model.world_model_env import WorldModelEnv

CFG = SteerConfig(starts_per_iteration=3, rollouts_per_start=2, epochs=2, minibatch_size=8, lr=1e-2)


def _trainer(seed=0, cfg=CFG):
    return make_trainer(SteerTrainer, cfg, horizon=6, seed=seed)


def _batch(b: int = 3, seed: int = 0) -> dict:
    env = WorldModelEnv(tiny_world_model())
    return env.reset(random_starts(b, seed=seed), seed=0)


def _chunks(policy, batch: dict, seed: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    plain = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(seed))
    noisy = policy.sample_stochastic(batch, generator=torch.Generator().manual_seed(seed)).chain
    return plain, noisy


def test_a_fresh_head_leaves_the_policy_as_it_was():
    policy, batch = tiny_policy(), _batch()
    before = _chunks(policy, batch)
    policy.enable_latent_steering(hidden=16)
    assert policy.config.steering_hidden == 16 and policy.latent_steering is not None
    after = _chunks(policy, batch)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    with pytest.raises(ValueError, match="already has a latent steering head"):
        policy.enable_latent_steering(hidden=16)


def test_the_head_moves_the_noise_and_so_the_chunk():
    policy, batch = tiny_policy(), _batch()
    policy.enable_latent_steering(hidden=16)
    torch.nn.init.normal_(policy.latent_steering.net[-1].weight, std=1.0)
    obs = policy.encode_observation(batch)
    mean = policy.noise_mean(obs)
    assert mean.shape == (3, 4, 4) and mean.abs().max() > 0.1
    # the same generator draws the same eps: x_0 is the BC policy's x_0 shifted by the head's mean
    shifted = policy.initial_noise(obs, generator=torch.Generator().manual_seed(1))
    plain = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(shifted, mean + plain)
    assert not torch.equal(
        policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(1)),
        tiny_policy().predict_action_chunk(batch, generator=torch.Generator().manual_seed(1)),
    )
    # a chain's log-probability scores its x_0 under the steered mean, the denoising steps as before
    chain = policy.sample_stochastic(batch, generator=torch.Generator().manual_seed(2)).chain
    with torch.no_grad():
        shift = policy.log_prob(batch, chain) - tiny_policy().log_prob(batch, chain)
    x0 = chain[:, 0]
    expected = flow_matching.gaussian_log_prob(x0, mean, 1.0) - flow_matching.gaussian_log_prob(x0, 0.0, 1.0)
    torch.testing.assert_close(shift, expected, atol=1e-4, rtol=1e-5)


def test_a_steered_sample_is_the_deterministic_chunk_of_its_noise_scored_as_drawn():
    trainer = _trainer()
    batch = _batch()
    drawn = steered_sample(trainer.policy, batch, generator=torch.Generator().manual_seed(2))
    assert drawn.chain.shape == (3, 2, 4, 4) and drawn.step_log_probs.shape == (3, 1)
    x0 = drawn.chain[:, 0]
    expected = trainer.policy.normalizer.normalize(
        "action", trainer.policy.predict_action_chunk(batch, noise=x0)
    )
    torch.testing.assert_close(drawn.actions, expected)
    _, _, log_probs = trainer._transitions(trainer.policy, batch, drawn.chain)
    torch.testing.assert_close(log_probs, drawn.step_log_probs)
    torch.testing.assert_close(log_probs[:, 0], flow_matching.gaussian_log_prob(x0, 0.0, 1.0))


def test_one_iteration_moves_the_head_alone_and_is_reproducible():
    starts = random_starts(3, seed=3)
    a, b = _trainer(seed=7), _trainer(seed=7)
    head = flat_params(a.policy.latent_steering)
    rest = {
        n: p.detach().clone() for n, p in a.policy.named_parameters() if not n.startswith("latent_steering")
    }
    logs_a, logs_b = a.step(starts), b.step(starts)
    assert (flat_params(a.policy.latent_steering) - head).abs().max() > 1e-5
    assert all(torch.equal(p, rest[n]) for n, p in a.policy.named_parameters() if n in rest)
    assert torch.equal(flat_params(a.policy), flat_params(b.policy)) and logs_a == logs_b
    assert logs_a["gradient_steps"] > 0 and "loss/value" in logs_a


def test_the_kl_pulls_towards_the_bc_policys_own_noise():
    trainer = _trainer(cfg=SteerConfig(**{**CFG.__dict__, "kl_coef": 1.0}))
    torch.nn.init.normal_(trainer.policy.latent_steering.net[-1].weight, std=1.0)
    batch = _batch()
    means, std, _ = trainer._transitions(trainer.policy, batch, torch.zeros(3, 2, 4, 4))
    ref_means, _, _ = trainer._transitions(trainer.reference, batch, torch.zeros(3, 2, 4, 4))
    assert ref_means.abs().max() == 0 and means.abs().max() > 0.1 and std.item() == 1.0


def test_the_fine_tuned_policy_keeps_its_head(tmp_path):
    trainer = _trainer()
    trainer.step(random_starts(3, seed=1))
    trainer.policy.save_pretrained(tmp_path / "steered")
    loaded = FlowVLAPolicy.from_pretrained(tmp_path / "steered")
    assert loaded.config.steering_hidden == CFG.steering_hidden and loaded.latent_steering is not None
    batch = _batch()
    torch.testing.assert_close(_chunks(loaded, batch)[0], _chunks(trainer.policy, batch)[0])
    # fine-tuned again: the head is kept (not replaced by a fresh one); a different std is refused
    again = SteerTrainer(loaded, WorldModelEnv(mixed_outcome_world_model()), CFG)
    assert torch.equal(flat_params(again.policy.latent_steering), flat_params(trainer.policy.latent_steering))
    with pytest.raises(ValueError, match="steering_std=1.0; use that"):
        SteerTrainer(loaded, WorldModelEnv(mixed_outcome_world_model()), SteerConfig(steering_std=0.5))


def test_a_reference_without_a_head_is_the_bc_policys_own_noise(tmp_path):
    bc = tiny_policy()
    bc.save_pretrained(tmp_path / "bc")
    trainer = _trainer()
    torch.nn.init.normal_(trainer.reference.latent_steering.net[-1].weight, std=1.0)
    trainer.load_reference(tmp_path / "bc" / "model.safetensors")
    ref_means, _, _ = trainer._transitions(trainer.reference, _batch(), torch.zeros(3, 2, 4, 4))
    assert ref_means.abs().max() == 0
    with pytest.raises(ValueError, match="do not fit"):  # a different policy's weights
        _trainer().load_reference(_save_other(tmp_path))


def _save_other(tmp_path):
    cfg = FlowVLAConfig(cameras=("front",), image_size=(16, 16), chunk_size=4, n_action_steps=2, dim=48, heads=2,
                        obs_layers=1, action_layers=1, num_inference_steps=2)  # fmt: skip
    cfg.vision.channels = (8, 16)
    FlowVLAPolicy(cfg, vla_fixtures.make_stats()).save_pretrained(tmp_path / "other")
    return tmp_path / "other" / "model.safetensors"


@pytest.mark.parametrize(
    "field, value, match",
    [("noise_level", 0.3, "leave noise_level at 0"), ("steering_std", 0.0, "steering_std > 0"),
     ("steering_hidden", 0, "steering_hidden >= 1")],
)  # fmt: skip
def test_bad_settings_are_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        SteerConfig(**{field: value}).validate()


def test_finetune_with_steer_saves_the_bc_policy_with_its_head(tmp_path, capsys):
    from worldloop.rl_finetune.policy_rl.finetune import finetune

    algorithm = SteerConfig(starts_per_iteration=2, rollouts_per_start=1, epochs=1, minibatch_size=8)
    cfg = tiny_finetune_config(tmp_path, algorithm)
    summary = finetune(cfg)
    assert summary["algorithm"] == "steer" and summary["train_sim_steps"] == 0
    assert "steer: starts_per_iteration=2, epochs=1, minibatch_size=8, lr=0.0003" in capsys.readouterr().out
    tuned = FlowVLAPolicy.from_pretrained(tmp_path / "ft" / "pretrained_model")
    bc = FlowVLAPolicy.from_pretrained(cfg.policy.path)
    assert tuned.latent_steering is not None and bc.latent_steering is None
    frozen = {n: p for n, p in tuned.named_parameters() if not n.startswith("latent_steering")}
    assert all(torch.equal(p, frozen[n]) for n, p in bc.named_parameters())
