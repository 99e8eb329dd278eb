"""LeRobot policies saved by LeRobot itself (config.json, model.safetensors, processor pipelines), tiny and
random-weight, for the tests of vla/lerobot_pretrained.py and the lerobot_env evaluation backend."""

from __future__ import annotations

from pathlib import Path

import torch

ACTION_MEAN = 5.0  # far from 0, so unnormalised actions are told apart from normalised ones
ACTION_STD = 0.1


def save_lerobot_policy(
    kind: str,
    path: Path,
    images: dict[str, tuple[int, int]],
    state_dim: int = 4,
    action_dim: int = 4,
    action_mean: float = ACTION_MEAN,
    action_std: float = ACTION_STD,
) -> Path:
    """Write a random-weight LeRobot `kind` (act | diffusion) policy with image inputs `images` (feature key ->
    (H, W)) the way LeRobot's training does: policy.save_pretrained plus both processors' save_pretrained."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    inputs = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, *hw)) for k, hw in images.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    common = dict(
        input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None
    )
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        config = ACTConfig(
            **common, chunk_size=6, n_action_steps=3, dim_model=32, n_heads=2, dim_feedforward=64,
            n_encoder_layers=1, n_decoder_layers=1, latent_dim=8, n_vae_encoder_layers=1,
        )  # fmt: skip
    elif kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        config = DiffusionConfig(
            **common, n_obs_steps=2, horizon=8, n_action_steps=4, drop_n_last_frames=3, crop_shape=None,
            down_dims=(16, 32), diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8,
            num_train_timesteps=10, noise_scheduler_type="DDIM", num_inference_steps=2,
        )  # fmt: skip
    else:
        raise ValueError(f"kind: expected act or diffusion, got {kind!r}")
    torch.manual_seed(0)
    policy = get_policy_class(kind)(config)
    stats = {k: {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)} for k in images}
    # mean/std for ACT, min/max for Diffusion's state and action normalisation.
    stats["observation.state"] = _stats(state_dim, 0.0, 1.0)
    stats["action"] = _stats(action_dim, action_mean, action_std)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(path)
    preprocessor.save_pretrained(path)
    postprocessor.save_pretrained(path)
    return path


def _stats(dim: int, mean: float, std: float) -> dict:
    full = lambda v: torch.full((dim,), v)  # noqa: E731
    return {"mean": full(mean), "std": full(std), "min": full(mean - 2 * std), "max": full(mean + 2 * std)}
