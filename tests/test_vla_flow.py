"""FlowVLA: interface, flow-matching samplers, log-probs, RTC inpainting, save/load, BC learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import vla_fixtures

from worldloop.data.features import ACTION, STATE, image_key
from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy, VisionConfig
from worldloop.vla.flow_vla import flow_matching as fm
from worldloop.vla.policy import Policy

STATS = vla_fixtures.make_stats()
ACTION_MEAN = torch.tensor(STATS[ACTION]["mean"], dtype=torch.float32)
ACTION_STD = torch.tensor(STATS[ACTION]["std"], dtype=torch.float32)


def tiny_config(**kw) -> FlowVLAConfig:
    base = dict(
        image_size=(16, 16),
        vision=VisionConfig(channels=(8, 16)),
        dim=32,
        heads=2,
        obs_layers=1,
        action_layers=1,
        chunk_size=6,
        n_action_steps=3,
    )
    base.update(kw)
    return FlowVLAConfig(**base)


def make_batch(b: int = 3, cfg: FlowVLAConfig | None = None, seed: int = 0) -> dict:
    cfg = cfg or tiny_config()
    return vla_fixtures.make_batch(b, cfg.cameras, cfg.image_size, cfg.chunk_size, seed)


@pytest.fixture
def policy() -> FlowVLAPolicy:
    torch.manual_seed(0)
    p = FlowVLAPolicy(tiny_config(), STATS)
    # A random (not zero) action head, so that the velocity depends on the observation and on x_t.
    torch.nn.init.normal_(p.action_expert.out_proj.weight, std=0.2)
    return p.eval()


def test_interface_shapes_and_action_queue(policy):
    assert isinstance(policy, Policy)
    batch = make_batch()
    chunk = policy.predict_action_chunk(batch)
    assert chunk.shape == (3, 6, 4)
    calls = []
    original = policy.predict_action_chunk
    policy.predict_action_chunk = lambda b: calls.append(1) or original(b)
    policy.reset()
    actions = [policy.select_action(batch) for _ in range(7)]
    assert all(a.shape == (3, 4) for a in actions)
    assert len(calls) == 3  # 7 actions at 3 per chunk: refilled at steps 0, 3 and 6
    policy.reset()
    policy.select_action(batch)
    assert len(calls) == 4


def test_missing_batch_key_is_a_clear_error(policy):
    batch = make_batch()
    del batch[image_key("wrist")]
    with pytest.raises(KeyError, match="observation.images.wrist"):
        policy.predict_action_chunk(batch)


def test_bad_stats_name_the_field():
    with pytest.raises(ValueError, match="observation.state.*mean.*expected 4"):
        FlowVLAPolicy(tiny_config(), {**STATS, STATE: {**STATS[STATE], "mean": np.zeros(1)}})


def test_actions_are_unnormalised_with_the_stats(policy):
    # With a zero velocity field the sampler returns its noise: the chunk is mean + std * noise.
    torch.nn.init.zeros_(policy.action_expert.out_proj.weight)
    noise = torch.randn(3, 6, 4)
    chunk = policy.predict_action_chunk(make_batch(), noise=noise)
    torch.testing.assert_close(chunk, ACTION_MEAN + ACTION_STD * noise, atol=1e-5, rtol=1e-5)


def gaussian_velocity(m: float, s: float):
    """Exact flow velocity for data a ~ N(m, s^2) under x_t = (1 - t) eps + t a."""

    def v(x, t):
        t = t.view(-1, 1, 1)
        var = (1 - t) ** 2 + t**2 * s**2
        expected_a = m + t * s**2 / var * (x - t * m)
        return (expected_a - x) / (1 - t).clamp(min=1e-6)

    return v


def test_euler_and_stochastic_samplers_reach_the_data_distribution():
    m, s = 1.5, 0.4
    noise = torch.randn(20000, 1, 1, generator=torch.Generator().manual_seed(0))
    x = fm.euler_sample(gaussian_velocity(m, s), noise, 50)
    assert abs(x.mean() - m) < 0.02 and abs(x.std() - s) < 0.02
    # The score correction keeps the marginals: injected noise must not widen the result.
    out = fm.stochastic_sample(gaussian_velocity(m, s), noise, 50, 0.8, torch.Generator().manual_seed(1))
    assert abs(out.actions.mean() - m) < 0.03 and abs(out.actions.std() - s) < 0.03


def test_stochastic_log_prob_is_finite_and_recomputable(policy):
    batch = make_batch()
    out = policy.sample_stochastic(batch, generator=torch.Generator().manual_seed(0))
    assert out.chain.shape == (3, policy.config.num_inference_steps + 1, 6, 4)
    assert torch.isfinite(out.log_prob).all()
    again = policy.log_prob(batch, out.chain)
    torch.testing.assert_close(again, out.log_prob, atol=1e-3, rtol=1e-4)
    again.sum().backward()  # differentiable for policy gradients
    assert policy.action_expert.out_proj.weight.grad.abs().sum() > 0


def test_log_prob_prefers_the_mean_chunk_over_far_off_chunks(policy):
    batch = make_batch()
    out = policy.sample_stochastic(batch, generator=torch.Generator().manual_seed(0))
    steps = policy.config.num_inference_steps
    with torch.no_grad():
        velocity = policy.velocity_fn(policy.encode_observation(batch))
        t_last = torch.full((3,), (steps - 1) / steps)
        mean, std = fm.sde_transition(
            velocity, out.chain[:, -2], t_last, 1 / steps, policy.config.sde_noise_level
        )
        scores = []
        for offset in (0.0, 1.0, 3.0):
            chain = out.chain.clone()
            chain[:, -1] = mean + offset * std
            scores.append(policy.log_prob(batch, chain))
    assert (scores[0] > scores[1]).all() and (scores[1] > scores[2]).all()
    # Shifting all H*A entries by k std costs exactly k^2/2 nats each.
    torch.testing.assert_close(scores[0] - scores[1], torch.full((3,), 0.5 * 6 * 4), atol=1e-2, rtol=1e-4)


def test_rtc_weights_shape():
    w = fm.rtc_prefix_weights(10, 6, 2, torch.device("cpu"))
    assert w[:2].tolist() == [1.0, 1.0] and (w[6:] == 0).all()
    assert all(w[i] > w[i + 1] for i in range(2, 6)) and 0 < w[5] < 1
    with pytest.raises(ValueError, match="inference_delay"):
        fm.rtc_prefix_weights(10, 3, 5, torch.device("cpu"))


def test_rtc_inpainting_keeps_the_prefix(policy):
    # A gentler random field than the fixture's, closer to a trained one (guidance relies on the Jacobian
    # of the clean-chunk estimate being near the identity).
    torch.nn.init.normal_(policy.action_expert.out_proj.weight, std=0.05)
    batch = make_batch()
    prefix = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(1))[:, 2:]  # a tail
    prefix = prefix + 0.3  # and somewhere the free sampler would not go by itself
    delay = 2
    free = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(2))
    guided = policy.predict_action_chunk_with_prefix(
        batch, prefix, delay, generator=torch.Generator().manual_seed(2)
    )
    err_guided = ((guided[:, :delay] - prefix[:, :delay]) / ACTION_STD).abs().max()
    err_free = ((free[:, :delay] - prefix[:, :delay]) / ACTION_STD).abs().max()
    assert err_guided < 0.05, f"prefix error {err_guided:.3f} (normalised units)"
    assert err_free > 20 * err_guided


def test_padded_steps_are_left_out_of_the_loss(policy):
    batch = make_batch()
    pad = torch.zeros(3, 6, dtype=torch.bool)
    batch["action_is_pad"] = pad
    assert policy(batch)[0] > 0
    batch["action_is_pad"] = ~pad
    assert policy(batch)[0] == 0


def test_save_load_round_trip_gives_identical_actions(policy, tmp_path):
    batch = make_batch()
    policy.save_pretrained(tmp_path / "ckpt")
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {
        "config.yaml",
        "model.safetensors",
        "stats.json",
    }
    loaded = FlowVLAPolicy.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == policy.config
    a = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(5))
    b = loaded.predict_action_chunk(batch, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_bc_loss_decreases_on_a_tiny_set():
    torch.manual_seed(0)
    cfg = tiny_config()
    policy = FlowVLAPolicy(cfg, STATS).train()
    batch = make_batch(8, cfg, seed=1)
    # Actions that depend on the observation: a smooth ramp from the state.
    ramp = torch.linspace(0, 1, cfg.chunk_size)[None, :, None]
    batch[ACTION] = batch[STATE][:, None] + ramp
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(120):
        torch.manual_seed(len(losses))
        loss, _ = policy(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert math.isfinite(last) and last < 0.3 * first, (first, last)


def test_resnet18_backbone_reads_local_weights(tmp_path):
    import torchvision

    from worldloop.common.checkpoint import save_tensors

    weights = tmp_path / "resnet18.safetensors"
    save_tensors(torchvision.models.resnet18(weights=None).state_dict(), weights)
    cfg = tiny_config(
        image_size=(32, 32), vision=VisionConfig(backbone="resnet18", backbone_weights=str(weights))
    )
    policy = FlowVLAPolicy(cfg, STATS)
    assert policy.observation_encoder.images.num_tokens == 4  # stride 16 on 32x32
    loss, _ = policy(make_batch(2, cfg))
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="backbone_weights"):
        FlowVLAPolicy(tiny_config(vision=VisionConfig(backbone="resnet18")), STATS)


def test_film_makes_image_features_depend_on_the_condition():
    from worldloop.vla.flow_vla.vision_encoder import ImageTokenizer

    torch.manual_seed(0)
    images = [torch.rand(2, 3, 16, 16)]
    plain = ImageTokenizer(VisionConfig(channels=(8, 16)), 1, (16, 16), 32)
    with pytest.raises(ValueError, match="film"):
        plain(images, torch.randn(2, 32))
    film = ImageTokenizer(VisionConfig(channels=(8, 16), film=True), 1, (16, 16), 32)
    film.load_state_dict(plain.state_dict(), strict=False)
    # Zero-initialised modulation: before training it is the unconditioned encoder.
    assert torch.allclose(film(images, torch.randn(2, 32)), plain(images), atol=1e-6)
    torch.nn.init.normal_(film.film.weight, std=0.5)
    a, b = torch.randn(2, 2, 32)
    assert (film(images, a) - film(images, b)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="film"):
        film(images)


def test_film_policy_trains_and_round_trips(tmp_path):
    torch.manual_seed(0)
    policy = FlowVLAPolicy(tiny_config(vision=VisionConfig(channels=(8, 16), film=True)), STATS)
    loss, _ = policy(make_batch(2))
    loss.backward()
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = FlowVLAPolicy.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.vision.film
    batch = make_batch(2)
    a = policy.eval().predict_action_chunk(batch, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, loaded.predict_action_chunk(batch, generator=torch.Generator().manual_seed(1)))


def test_film_needs_the_conv_backbone():
    with pytest.raises(ValueError, match="film"):
        tiny_config(vision=VisionConfig(backbone="resnet18", backbone_weights="w.pth", film=True))


def test_random_shift_translates_each_image_within_the_pad():
    from worldloop.vla.flow_vla.vision_encoder import random_shift

    images = torch.rand(6, 3, 12, 12)
    assert torch.equal(random_shift(images, 0), images)
    torch.manual_seed(0)
    shifted = random_shift(images, 2)
    assert shifted.shape == images.shape
    for img, out in zip(images, shifted):
        # The centre 8x8 of the output is the input's 8x8 block at one offset in [0, 4]^2.
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(out[:, 2:10, 2:10], img[:, dy : dy + 8, dx : dx + 8])
        ]
        assert matches, "the output is not a translated copy of the input"
    with pytest.raises(ValueError, match="augment_shift"):
        tiny_config(augment_shift=-1)
