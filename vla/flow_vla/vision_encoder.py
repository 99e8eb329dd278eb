"""Per-camera image encoders that turn [B, 3, H, W] images in [0, 1] into a grid of tokens [B, N, dim]."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.common.checkpoint import load_tensors, load_torch
from worldloop.vla.flow_vla.configuration_flow_vla import VisionConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels // 4), channels)


class ConvBackbone(nn.Module):
    """A small CNN trained from scratch: each stage halves the resolution.

    With `film` [B, 2 * sum(channels)] each stage's normalised features are scaled and shifted (FiLM)
    before its last activation.
    """

    LAYERS_PER_STAGE = 6

    def __init__(self, channels: tuple[int, ...]):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [
                nn.Conv2d(c_in, c, 3, stride=2, padding=1),
                _group_norm(c),
                nn.SiLU(),
                nn.Conv2d(c, c, 3, padding=1),
                _group_norm(c),
                nn.SiLU(),
            ]
            c_in = c
        self.net = nn.Sequential(*layers)
        self.channels = tuple(channels)
        self.out_channels = c_in
        self.stride = 2 ** len(channels)

    def forward(self, images: torch.Tensor, film: torch.Tensor | None = None) -> torch.Tensor:
        x = images * 2.0 - 1.0
        if film is None:
            return self.net(x)
        offset = 0
        for i, layer in enumerate(self.net):
            stage, pos = divmod(i, self.LAYERS_PER_STAGE)
            if pos == self.LAYERS_PER_STAGE - 1:  # before the stage's last activation
                c = self.channels[stage]
                scale, shift = film[:, offset : offset + c], film[:, offset + c : offset + 2 * c]
                x = x * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
                offset += 2 * c
            x = layer(x)
        return x


class ResNet18Backbone(nn.Module):
    """torchvision ResNet-18 up to layer3 (stride 16), initialised from a local weights file."""

    def __init__(self, weights_path: str | None):
        super().__init__()
        import torchvision

        if weights_path is None:
            raise ValueError(
                "FlowVLAConfig.vision.backbone_weights: the resnet18 backbone needs a local weights file "
                "(ImageNet resnet18 state dict, .pth or .safetensors); nothing is downloaded"
            )
        net = torchvision.models.resnet18(weights=None)
        path = Path(weights_path)
        state = load_tensors(path) if path.suffix == ".safetensors" else load_torch(path)
        net.load_state_dict(state)
        self.net = nn.Sequential(
            net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3
        )
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.out_channels = 256
        self.stride = 16

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net((images - self.mean) / self.std)


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each image of [B, C, H, W] by its own random offset in [-pad, pad] pixels (edges repeated)."""
    if pad == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    dy, dx = torch.randint(0, 2 * pad + 1, (2, b), device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device))[:, None, :, None]  # [B, 1, H, 1]
    cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, None, :]  # [B, 1, 1, W]
    batch = torch.arange(b, device=images.device)[:, None, None, None]
    channel = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


class ImageTokenizer(nn.Module):
    """One backbone per camera, projected to `dim` with a learned position embedding per camera and cell.

    With `cfg.film`, `forward` takes a condition vector [B, dim] (the pooled instruction) that modulates
    every conv stage of every camera; the modulation starts at zero, i.e. as the unconditioned encoder.
    """

    def __init__(self, cfg: VisionConfig, num_cameras: int, image_size: tuple[int, int], dim: int):
        super().__init__()

        def backbone() -> nn.Module:
            if cfg.backbone == "conv":
                return ConvBackbone(tuple(cfg.channels))
            return ResNet18Backbone(cfg.backbone_weights)

        self.backbones = nn.ModuleList(backbone() for _ in range(num_cameras))
        if cfg.freeze_backbone:
            self.backbones.requires_grad_(False)
        first = self.backbones[0]
        h, w = image_size
        if h % first.stride or w % first.stride:
            raise ValueError(
                f"image_size {image_size} must be divisible by the backbone stride {first.stride}"
            )
        self.image_size = (h, w)
        self.num_tokens = (h // first.stride) * (w // first.stride)
        self.proj = nn.Linear(first.out_channels, dim)
        self.pos = nn.Parameter(torch.randn(num_cameras, self.num_tokens, dim) * 0.02)
        self.film = None
        if cfg.film:
            self.film_size = 2 * sum(first.channels)
            self.film = nn.Linear(dim, num_cameras * self.film_size)
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)

    def forward(self, images: list[torch.Tensor], condition: torch.Tensor | None = None) -> torch.Tensor:
        if (self.film is None) != (condition is None):
            raise ValueError(
                "ImageTokenizer: pass a condition exactly when the encoder was built with vision.film=true"
            )
        film = None if self.film is None else self.film(condition).chunk(len(self.backbones), dim=-1)
        tokens = []
        for cam, (backbone, image) in enumerate(zip(self.backbones, images)):
            if tuple(image.shape[-2:]) != self.image_size:
                raise ValueError(
                    f"camera {cam}: image of size {tuple(image.shape[-2:])}, the policy was built for {self.image_size}"
                )
            feat = backbone(image) if film is None else backbone(image, film[cam])
            feat = feat.flatten(2).transpose(1, 2)  # [B, N, C]
            tokens.append(self.proj(feat) + self.pos[cam])
        return torch.cat(tokens, dim=1)
