"""Closed-loop evaluation of a policy in the MuJoCo tabletop envs: success with a Wilson 95% interval,
mean final progress, episode videos and a JSON summary. Episodes run through `vla.episode_runner`
(envs in lock-step, one batched policy call per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from worldloop.data.features import STATE, TASK, image_key
from worldloop.vla.episode_runner import closing_all, run_episodes, success_summary
from worldloop.vla.policy import Policy


@dataclass
class SimEvalConfig:
    task: str = "reach"  # reach | push (worldloop/Tabletop<Task>-v0)
    max_steps: int = 50  # env steps per episode (10 fps)
    batch_envs: int = 10  # envs stepped together, one batched policy call per step
    videos: int = 4  # episodes recorded as mp4 (front | wrist side by side); 0 for none
    init_joint_noise: float = 0.1  # rad, as the env default
    backend: str = "mujoco"  # physics/rendering: mujoco | genesis (pip install 'worldloop[genesis]')

    def env_config(self, image_size: int, cameras: tuple[str, ...], terminate_on_success: bool = True):
        """The `TabletopEnvConfig` of these episodes, rendering `cameras` at `image_size`."""
        from worldloop.sim.tabletop_env import TabletopEnvConfig  # here: importing the sim loads MuJoCo

        return TabletopEnvConfig(
            task=self.task,
            image_size=image_size,
            cameras=tuple(cameras),
            max_steps=self.max_steps,
            terminate_on_success=terminate_on_success,
            init_joint_noise=self.init_joint_noise,
            backend=self.backend,
        )


def policy_batch(observations: list[dict], tasks: list[str], cameras: tuple[str, ...], device) -> dict:
    """The policy's batch of tabletop observations (uint8 HxWx3 images, joint state), one per episode."""
    batch = {
        image_key(c): torch.from_numpy(np.stack([o[image_key(c)] for o in observations]))
        .to(device)
        .permute(0, 3, 1, 2)
        .float()
        .div_(255.0)
        for c in cameras
    }
    batch[STATE] = torch.from_numpy(np.stack([o[STATE] for o in observations])).to(device).float()
    batch[TASK] = list(tasks)
    return batch


@dataclass
class TabletopEpisodes:
    """`EpisodeAdapter` of the tabletop envs: the task comes from reset, success and progress from info."""

    cameras: tuple[str, ...]
    device: str | torch.device

    def first_record(self, seed: int, reset_info: dict) -> dict:
        return {"seed": seed, "task": reset_info["task"], "success": False, "progress": 0.0, "length": 0}

    def policy_batch(self, observations: list[dict], records: list[dict]) -> dict:
        return policy_batch(observations, [r["task"] for r in records], self.cameras, self.device)

    def update(self, record: dict, reward: float, info: dict) -> None:
        record["success"] = record["success"] or bool(info["success"])
        record["progress"] = float(info["progress"])

    def video_frame(self, observation: dict) -> np.ndarray:
        return np.concatenate([observation[image_key(c)] for c in self.cameras], axis=1)


def evaluate_in_sim(
    policy: Policy,
    cfg: SimEvalConfig,
    episodes: int,
    seed: int,
    video_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    progress_bar: bool = True,
) -> dict:
    """Run `episodes` episodes (env seeds seed, seed+1, ...) and return the summary; the first
    `cfg.videos` episodes are written to `video_dir/videos/` when it is given."""
    import gymnasium as gym

    from worldloop import sim  # registers the envs

    cameras = tuple(policy.config.cameras)
    h, w = policy.config.image_size
    if h != w:
        raise ValueError(f"the tabletop envs render square frames; the policy expects {h}x{w}")
    n_envs = min(cfg.batch_envs, episodes)
    with closing_all(
        [gym.make(sim.ENV_IDS[cfg.task], config=cfg.env_config(h, cameras)) for _ in range(n_envs)]
    ) as envs:
        results, seconds = run_episodes(
            policy,
            envs,
            TabletopEpisodes(cameras, device),
            episodes,
            seed,
            cfg.videos,
            video_dir,
            desc=f"eval {cfg.task}",
            progress_bar=progress_bar,
        )
    return {
        "backend": "sim",
        "sim_backend": cfg.backend,
        "task": cfg.task,
        **success_summary(results),
        "mean_length": float(np.mean([r["length"] for r in results])),
        "seed": seed,
        "max_steps": cfg.max_steps,
        "seconds": seconds,
        "per_episode": results,
    }
