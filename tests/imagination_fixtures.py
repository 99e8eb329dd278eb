"""Helpers shared by tests/test_imagination_*.py and tests/test_grpo.py: tiny random models and starts."""

from __future__ import annotations

import torch
import vla_fixtures

from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.heads import OutcomeHeadsConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import InitialStates

IMAGE_SIZE = 16


def tiny_world_model(
    seed: int = 0,
    cameras: tuple[str, ...] = ("front",),
    context_frames: int = 2,
    heads_use_state: bool = False,
    heads_use_first_frame: bool = False,
    heads_use_frame: bool = True,
) -> WorldModel:
    torch.manual_seed(seed)
    dit = VideoDiTConfig(
        image_size=IMAGE_SIZE,
        patch_size=4,
        width=32,
        depth=1,
        heads=2,
        num_views=len(cameras),
        context_frames=context_frames,
        output_conv_channels=8,
    )
    heads = OutcomeHeadsConfig(
        use_state=heads_use_state, use_first_frame=heads_use_first_frame, use_frame=heads_use_frame
    )
    wm = WorldModel(WorldModelConfig(dit=dit, cameras=cameras, heads=heads))
    # Zero-initialised output layers would draw a constant grey frame: give them weights so frames depend
    # on the noise, the context and the actions.
    with torch.no_grad():
        for p in wm.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(std=0.1)
        # Reward near 0.5 and success logits near 0, so imagined episodes differ in outcome.
        wm.heads.out.weight.normal_(std=0.5)
        wm.heads.out.bias.copy_(torch.tensor([0.5, 0.0, 0.0]))
    return wm.eval()


def tiny_policy(seed: int = 0, cameras: tuple[str, ...] = ("front",)) -> FlowVLAPolicy:
    torch.manual_seed(seed)
    cfg = FlowVLAConfig(
        cameras=cameras,
        image_size=(IMAGE_SIZE, IMAGE_SIZE),
        chunk_size=4,
        n_action_steps=2,
        dim=32,
        heads=2,
        obs_layers=1,
        action_layers=1,
        num_inference_steps=2,
    )
    cfg.vision.channels = (8, 16)
    policy = FlowVLAPolicy(cfg, vla_fixtures.make_stats())
    # The expert's output layer starts at zero (v = 0); randomise it so the policy depends on its input.
    torch.nn.init.normal_(policy.action_expert.out_proj.weight, std=0.3)
    return policy.eval()


def random_starts(
    b: int, context: int = 1, seed: int = 0, cameras: tuple[str, ...] = ("front",)
) -> InitialStates:
    g = torch.Generator().manual_seed(seed)
    frames = {c: torch.rand(b, context, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g) for c in cameras}
    return InitialStates(
        frames,
        torch.rand(b, context - 1, 4, generator=g),
        torch.rand(b, 4, generator=g) * 0.5,
        [f"reach the {'red' if i % 2 else 'blue'} cube" for i in range(b)],
    )
