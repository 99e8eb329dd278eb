"""LeRobot's ACT and Diffusion policies behind worldloop's `Policy` interface, trained from scratch.

The LeRobot model is built from its own config class with our features (no pretrained backbone, nothing
downloaded). LeRobot >= 0.4 normalises in a separate processor pipeline, so the adapter does it: raw state
and actions in, normalised ones to the LeRobot model, unnormalised joint targets out. Only APIs that
LeRobot 0.4 and 0.6 share are used: the config classes, `PolicyFeature`/`FeatureType`, `forward` (loss)
and `predict_action_chunk` (ACT) / `diffusion.generate_actions` (Diffusion).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import ACTION, DEFAULT_CAMERAS, STATE, image_key
from worldloop.data.stats import Stats
from worldloop.vla.pretrained import PretrainedPolicy


@dataclass
class ACTAdapterConfig:
    type: str = "act"
    cameras: tuple[str, ...] = DEFAULT_CAMERAS
    image_size: tuple[int, int] = (64, 64)
    state_dim: int = TABLETOP_ARM.num_joints
    action_dim: int = TABLETOP_ARM.num_joints
    chunk_size: int = 10
    n_action_steps: int = 5
    # CPU-sized defaults; LeRobot's own are 512 / 8 / 3200 / 4 layers.
    dim_model: int = 128
    n_heads: int = 4
    dim_feedforward: int = 512
    n_encoder_layers: int = 2
    n_decoder_layers: int = 1
    use_vae: bool = True
    latent_dim: int = 16
    n_vae_encoder_layers: int = 2
    kl_weight: float = 10.0
    dropout: float = 0.1


@dataclass
class DiffusionAdapterConfig:
    type: str = "diffusion"
    cameras: tuple[str, ...] = DEFAULT_CAMERAS
    image_size: tuple[int, int] = (64, 64)
    state_dim: int = TABLETOP_ARM.num_joints
    action_dim: int = TABLETOP_ARM.num_joints
    # One observation step: our batches carry the current observation only.
    horizon: int = 16  # actions denoised per chunk (the training window)
    n_action_steps: int = 8  # actions returned per chunk and executed
    down_dims: tuple[int, ...] = (64, 128, 256)
    diffusion_step_embed_dim: int = 64
    spatial_softmax_num_keypoints: int = 32
    num_train_timesteps: int = 100
    noise_scheduler_type: str = "DDIM"
    num_inference_steps: int = 10
    # Our windows repeat the last action past an episode's end (action_is_pad): keep it out of the loss.
    do_mask_loss_for_padding: bool = True


def _features(cfg) -> tuple[dict, dict]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    h, w = cfg.image_size
    inputs = {image_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for c in cfg.cameras}
    inputs[STATE] = PolicyFeature(type=FeatureType.STATE, shape=(cfg.state_dim,))
    outputs = {ACTION: PolicyFeature(type=FeatureType.ACTION, shape=(cfg.action_dim,))}
    return inputs, outputs


def _build_act(cfg: ACTAdapterConfig):
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    inputs, outputs = _features(cfg)
    lerobot_cfg = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        chunk_size=cfg.chunk_size,
        n_action_steps=cfg.n_action_steps,
        pretrained_backbone_weights=None,
        dim_model=cfg.dim_model,
        n_heads=cfg.n_heads,
        dim_feedforward=cfg.dim_feedforward,
        n_encoder_layers=cfg.n_encoder_layers,
        n_decoder_layers=cfg.n_decoder_layers,
        use_vae=cfg.use_vae,
        latent_dim=cfg.latent_dim,
        n_vae_encoder_layers=cfg.n_vae_encoder_layers,
        kl_weight=cfg.kl_weight,
        dropout=cfg.dropout,
    )
    return ACTPolicy(lerobot_cfg)


def _build_diffusion(cfg: DiffusionAdapterConfig):
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    inputs, outputs = _features(cfg)
    lerobot_cfg = DiffusionConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        n_obs_steps=1,
        horizon=cfg.horizon,
        n_action_steps=cfg.n_action_steps,
        drop_n_last_frames=0,
        crop_shape=None,
        pretrained_backbone_weights=None,
        down_dims=tuple(cfg.down_dims),
        diffusion_step_embed_dim=cfg.diffusion_step_embed_dim,
        spatial_softmax_num_keypoints=cfg.spatial_softmax_num_keypoints,
        num_train_timesteps=cfg.num_train_timesteps,
        noise_scheduler_type=cfg.noise_scheduler_type,
        num_inference_steps=cfg.num_inference_steps,
        do_mask_loss_for_padding=cfg.do_mask_loss_for_padding,
    )
    return DiffusionPolicy(lerobot_cfg)


class LeRobotPolicyAdapter(PretrainedPolicy):
    """A LeRobot policy (`inner`) with worldloop's batch, normalisation and checkpoint layout."""

    name: str

    def __init__(self, config, stats: Stats):
        super().__init__(config, stats)
        self.inner = self._build(config)

    @staticmethod
    @abc.abstractmethod
    def _build(config):
        """The LeRobot policy for `config`."""

    def _inputs(self, batch: dict) -> dict:
        missing = [k for k in (*[image_key(c) for c in self.config.cameras], STATE) if k not in batch]
        if missing:
            raise KeyError(f"{type(self).__name__}: batch is missing {missing}; it has {sorted(batch)}")
        out = {image_key(c): batch[image_key(c)].float() for c in self.config.cameras}
        out[STATE] = self.normalizer.normalize(STATE, batch[STATE].float())
        return out

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """BC loss of the LeRobot policy on `batch[action]` [B, training_chunk_size, A] (+ `action_is_pad`)."""
        inputs = self._inputs(batch)
        actions = batch[ACTION]
        if actions.dim() != 3 or actions.shape[1] != self.training_chunk_size:
            raise ValueError(
                f"{ACTION}: expected [B, {self.training_chunk_size}, {self.action_dim}], got {tuple(actions.shape)}"
            )
        inputs[ACTION] = self.normalizer.normalize(ACTION, actions.float())
        pad = batch.get("action_is_pad")
        inputs["action_is_pad"] = (
            pad
            if pad is not None
            else torch.zeros(actions.shape[:2], dtype=torch.bool, device=actions.device)
        )
        loss, info = self.inner.forward(self._to_inner(inputs))
        return loss, {k: float(v) for k, v in (info or {}).items()} | {"loss": float(loss.detach())}

    def _to_inner(self, inputs: dict) -> dict:
        return inputs


class ACTAdapter(LeRobotPolicyAdapter):
    config_class = ACTAdapterConfig
    name = "act"

    @staticmethod
    def _build(config: ACTAdapterConfig):
        return _build_act(config)

    @property
    def chunk_size(self) -> int:
        return self.config.chunk_size

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        actions = self.inner.predict_action_chunk(self._inputs(batch))
        return self.normalizer.unnormalize(ACTION, actions)


class DiffusionAdapter(LeRobotPolicyAdapter):
    config_class = DiffusionAdapterConfig
    name = "diffusion"

    @staticmethod
    def _build(config: DiffusionAdapterConfig):
        return _build_diffusion(config)

    @property
    def chunk_size(self) -> int:
        return self.config.n_action_steps

    @property
    def training_chunk_size(self) -> int:
        return self.config.horizon

    def _to_inner(self, inputs: dict) -> dict:
        # LeRobot's diffusion model wants an observation-time axis (n_obs_steps = 1) on the state.
        return {**inputs, STATE: inputs[STATE][:, None]}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        from lerobot.utils.constants import OBS_IMAGES

        inputs = self._inputs(batch)
        images = torch.stack([inputs[image_key(c)] for c in self.config.cameras], dim=1)  # [B, cams, 3, H, W]
        obs = {STATE: inputs[STATE][:, None], OBS_IMAGES: images[:, None]}
        actions = self.inner.diffusion.generate_actions(obs)  # [B, n_action_steps, A]
        return self.normalizer.unnormalize(ACTION, actions)
