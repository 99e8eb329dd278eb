"""Per-camera image encoders that turn [B, 3, H, W] images in [0, 1] into a grid of tokens [B, N, dim]."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from common.checkpoint import load_tensors, load_torch
from vla.flow_vla.configuration_flow_vla import VisionConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels // 4), channels)


class ConvBackbone(nn.Module):
    """A small CNN trained from scratch: each stage halves the resolution."""

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
        self.out_channels = c_in
        self.stride = 2 ** len(channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images * 2.0 - 1.0)


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


class ImageTokenizer(nn.Module):
    """One backbone per camera, projected to `dim` with a learned position embedding per camera and cell."""

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

    def forward(self, images: list[torch.Tensor]) -> torch.Tensor:
        tokens = []
        for cam, (backbone, image) in enumerate(zip(self.backbones, images)):
            if tuple(image.shape[-2:]) != self.image_size:
                raise ValueError(
                    f"camera {cam}: image of size {tuple(image.shape[-2:])}, the policy was built for {self.image_size}"
                )
            feat = backbone(image).flatten(2).transpose(1, 2)  # [B, N, C]
            tokens.append(self.proj(feat) + self.pos[cam])
        return torch.cat(tokens, dim=1)
