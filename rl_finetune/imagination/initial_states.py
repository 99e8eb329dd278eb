"""Where imagined episodes start: live frames from the simulator (`sim_starts`, `from_sim_resets`) or the
first frames of a dataset's episodes (`dataset_starts`), as `InitialStates` at the world model's size and
cameras. Policy fine-tuning draws its training and held-out starts here, evaluation in imagination its
episodes' starts.

Starting imagination from a simulator reset renders the first observation and never steps the physics;
the same seeds then give the simulator evaluation the very same initial states, which is what comparing
imagined and simulated success per policy needs.
"""

from __future__ import annotations

import numpy as np
import torch

from worldloop.common.config import ConfigError
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import STATE, image_key
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv, from_dataset


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


def sim_starts(env: WorldModelEnv, sim_cfg: SimEvalConfig, episodes: int, seed: int) -> InitialStates:
    """First observations of the sim episodes that `evaluate_in_sim(..., seed)` runs (same env settings)."""
    import gymnasium as gym

    from worldloop import sim

    size = env.world_model.cfg.dit.image_size
    sim_env = gym.make(sim.ENV_IDS[sim_cfg.task], config=sim_cfg.env_config(size, env.cameras))
    try:
        with count_sim_steps() as counter:
            starts = from_sim_resets(sim_env, [seed + i for i in range(episodes)], env.cameras)
        if counter.steps:
            raise RuntimeError(f"rendering initial states stepped the simulator {counter.steps} times")
    finally:
        sim_env.close()
    return starts


def dataset_starts(env: WorldModelEnv, root: str, episodes: int, resize: str = "") -> InitialStates:
    """First frames of the dataset's first `episodes` episodes, at the world model's size and cameras."""
    size = env.world_model.cfg.dit.image_size
    dataset = EpisodeDataset(
        DatasetConfig(
            root=root,
            cameras=list(env.cameras),
            image_size=[size, size],
            resize=resize,
            state_dim=env.embodiment.num_joints,
            action_dim=env.embodiment.num_joints,
        )
    )
    available = dataset.episode_indices
    if len(available) < episodes:
        raise ConfigError(
            f"dataset {root} has {len(available)} episodes; {episodes} start states were asked for"
        )
    return from_dataset(dataset, available[:episodes], env.cameras, context=1)
