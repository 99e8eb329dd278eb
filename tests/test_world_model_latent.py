"""Latent-space world model through a (tiny, locally built) diffusers AutoencoderKL."""

from __future__ import annotations

import pytest
import torch

from worldloop.world_model.codec import AutoencoderConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.model import WorldModel


@pytest.fixture
def tiny_autoencoder(tmp_path):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    )
    vae.save_pretrained(tmp_path / "vae")
    return tmp_path / "vae"


def latent_config(path, **dit) -> WorldModelConfig:
    base = dict(image_size=8, channels=4, patch_size=2, width=32, depth=1, heads=2, context_frames=2)
    return WorldModelConfig(
        dit=VideoDiTConfig(**{**base, **dit}), autoencoder=AutoencoderConfig(path=str(path), image_size=16)
    )


def test_latent_world_model_trains_and_rolls_out_in_pixels(tiny_autoencoder, tmp_path):
    model = WorldModel(latent_config(tiny_autoencoder))
    frames = torch.rand(2, 3, 3, 16, 16)
    loss, logs = model.compute_loss(frames, torch.randn(2, 3, 4))
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is None for p in model.codec.parameters())  # the autoencoder stays frozen
    out, rewards, _ = model.eval().rollout(
        frames[:, :2], torch.randn(2, 1, 4), torch.randn(2, 3, 4), future_state=torch.randn(2, 3, 4)
    )
    assert out.shape == (2, 3, 3, 16, 16) and rewards.shape == (2, 3)
    assert out.min() >= 0 and out.max() <= 1
    model.save_pretrained(tmp_path / "wm")
    loaded = WorldModel.from_pretrained(tmp_path / "wm")
    assert loaded.codec.latent


def test_latent_shape_mismatch_names_the_fields(tiny_autoencoder, tmp_path):
    with pytest.raises(ValueError, match=r"dit.channels=4 and dit.image_size=8"):
        WorldModel(latent_config(tiny_autoencoder, image_size=16))
    with pytest.raises(FileNotFoundError, match="autoencoder.path"):
        WorldModel(latent_config(tmp_path / "missing"))
