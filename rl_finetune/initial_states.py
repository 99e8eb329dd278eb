"""Where imagined episodes start: live frames from the simulator (dataset episodes' first frames:
`world_model.world_model_env.from_dataset`).

Starting imagination from a simulator reset renders the first observation and never steps the physics;
the same seeds then give the simulator evaluation the very same initial states, which is what comparing
imagined and simulated success per policy needs.
"""

from __future__ import annotations

import numpy as np
import torch

from worldloop.data.features import STATE, image_key
from worldloop.world_model.world_model_env import InitialStates


def from_sim_observations(
    observations: list[dict], tasks: list[str], cameras: tuple[str, ...]
) -> InitialStates:
    """One live frame per episode from simulator observations (uint8 HxWx3 images, joint state)."""
    if len(observations) != len(tasks):
        raise ValueError(f"got {len(observations)} observations but {len(tasks)} tasks")
    frames = {}
    for cam in cameras:
        key = image_key(cam)
        if key not in observations[0]:
            raise KeyError(f"sim observations lack {key!r} (have {sorted(observations[0])})")
        stacked = np.stack([o[key] for o in observations])  # [B, H, W, 3]
        frames[cam] = torch.from_numpy(stacked).permute(0, 3, 1, 2)[:, None].contiguous()
    state = torch.from_numpy(np.stack([o[STATE] for o in observations])).float()
    return InitialStates(frames, torch.zeros(len(tasks), 0, state.shape[1]), state, list(tasks))


def from_sim_resets(env, seeds: list[int], cameras: tuple[str, ...]) -> InitialStates:
    """Reset a `sim.tabletop_env.TabletopEnv` with each seed and take its first observation (no physics step)."""
    observations, tasks = [], []
    for seed in seeds:
        obs, info = env.reset(seed=int(seed))
        observations.append(obs)
        tasks.append(info["task"])
    return from_sim_observations(observations, tasks, cameras)
