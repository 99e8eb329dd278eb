"""Where imagined episodes start: live frames from the simulator (`sim_starts`, `from_sim_resets`) or the
first frames of a dataset's episodes (`dataset_starts`), as `InitialStates` at the world model's size and
cameras. Policy fine-tuning draws its training and held-out starts here, evaluation in imagination its
episodes' starts.

The same holds for LeRobot's gym envs (`lerobot_env_starts`: gym-pusht, ...), whose reset frames are
resized to the world model's frame size.

Starting imagination from a simulator reset renders the first observation and never steps the physics;
the same seeds then give the simulator evaluation the very same initial states, which is what comparing
imagined and simulated success per policy needs.
"""

from __future__ import annotations

import numpy as np
import torch

from worldloop.common.config import ConfigError
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import STATE, image_key
from worldloop.data.images import resize_frames
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, first_observations
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.checkpoint_inputs import dataset_config_for
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
    starts = from_sim_observations(observations, tasks, cameras)
    starts.seeds = [int(s) for s in seeds]
    return starts


def check_sim_arm(env: WorldModelEnv, hint: str) -> None:
    """The MuJoCo simulator has one arm: a world model for another robot cannot start or be checked there
    (`hint`: what to do instead)."""
    if env.embodiment.joint_names != TABLETOP_ARM.joint_names:
        raise ConfigError(
            f"the world model acts for {env.embodiment.name!r} (joints {list(env.embodiment.joint_names)}), "
            f"but the MuJoCo simulator has only the {TABLETOP_ARM.name!r} arm "
            f"({list(TABLETOP_ARM.joint_names)}): {hint}"
        )


def sim_starts(
    env: WorldModelEnv, sim_cfg: SimEvalConfig, episodes: int, seed: int, hint: str = "start from a dataset"
) -> InitialStates:
    """First observations of the sim episodes that `evaluate_in_sim(..., seed)` runs (same env settings)."""
    import gymnasium as gym

    from worldloop import sim

    check_sim_arm(env, hint)
    size = env.world_model.cfg.frame_size
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
    """First frames of the dataset's first `episodes` episodes, at the world model's size and cameras
    (resized as `resize` says, else as the world model's training data was)."""
    dataset = EpisodeDataset(dataset_config_for(env.world_model.cfg, DatasetConfig(root=root, resize=resize)))
    available = dataset.episode_indices
    if len(available) < episodes:
        raise ConfigError(
            f"dataset {root} has {len(available)} episodes; {episodes} start states were asked for"
        )
    return from_dataset(dataset, available[:episodes], env.cameras, context=1)


def lerobot_env_starts(
    env: WorldModelEnv, env_cfg: LeRobotEnvEvalConfig, episodes: int, seed: int, resize: str = ""
) -> InitialStates:
    """First observations of the LeRobot env episodes that `evaluate_in_lerobot_env(..., seed)` runs,
    resized to the world model's frame size as `resize` says (else as its training data was)."""
    observations, task = first_observations(env_cfg, [seed + i for i in range(episodes)], env.cameras)
    starts = from_sim_observations(observations, [task] * episodes, env.cameras)
    size = env.world_model.cfg.frame_size
    mode = resize or env.world_model.cfg.dataset_resize
    try:
        starts.frames = {c: resize_frames(f, (size, size), mode) for c, f in starts.frames.items()}
    except ValueError as e:
        raise ConfigError(
            f"env {env_cfg.type or env_cfg.gym_id} renders frames of another size than the world model's "
            f"{size}x{size}: {e}; set the starts' resize to crop or stretch"
        ) from e
    return starts
