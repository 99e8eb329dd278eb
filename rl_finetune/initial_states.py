"""Where imagined episodes start: the first frames of dataset episodes, or live frames from the simulator.

Starting imagination from a simulator reset renders the first observation and never steps the physics;
the same seeds then give the simulator evaluation the very same initial states, which is what comparing
imagined and simulated success per policy needs.
"""

from __future__ import annotations

import numpy as np
import torch

from data.dataset import EpisodeDataset
from data.features import STATE, image_key
from world_model.world_model_env import InitialStates


def from_dataset(
    dataset: EpisodeDataset, episodes: list[int], cameras: tuple[str, ...], context: int = 1
) -> InitialStates:
    """The first `context` frames of each episode (and the `context - 1` actions between them)."""
    if context < 1:
        raise ValueError(f"context={context} must be >= 1")
    missing = [c for c in cameras if c not in dataset.cameras]
    if missing:
        raise ValueError(
            f"dataset {dataset.root} was opened with cameras {dataset.cameras}; initial states need {missing}"
        )
    table = dataset.frame_table()
    rows, tasks = [], []
    for ep in dataset.select_episodes(episodes):
        if ep.length < context:
            raise ValueError(
                f"dataset {dataset.root}: episode {ep.index} has {ep.length} frames < context {context}"
            )
        rows.append(torch.arange(ep.start, ep.start + context))
        tasks.append(table.task[ep.start + context - 1])
    idx = torch.stack(rows)  # [B, C]
    return InitialStates(
        frames={c: table.images[c][idx] for c in cameras},  # uint8 [B, C, 3, H, W]
        actions=table.action[idx[:, :-1]],
        state=table.state[idx[:, -1]],
        task=tasks,
    )


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
