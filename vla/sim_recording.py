"""A policy's own simulator episodes, recorded as a LeRobotDataset: failures kept, every frame labelled.

The policy is wrapped as an actor for the sim's episode loop (`sim.recording`), which hands the frames to
the one dataset writer (`data.recording.EpisodeWriter`), as for scripted experts and deployment runs.

This is how robot behaviour flows back into the world model's data: the closed loop records the policy it
is fine-tuning (`rl_finetune/closed_loop.py`), and `record_demos.py --policies=[...]` records earlier
policies. Scripted experts fail in their own ways (a wrong cube, a pause, noise); a learned policy fails
in others (it stops a little short, or passes by the cube). The world model's success head learns what
failure looks like only from the failures it is shown.

    episodes = record_policy_episodes(policy, env_cfg, root, seeds)
    root = record_policies(RecordingConfig(policies=[...], include=[expert_root], root=...))
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from worldloop.data.features import STATE, TASK, image_key
from worldloop.data.recording import grow_dataset, policy_recording_parts, prepare_root, write_recording_meta
from worldloop.sim.recording import RecordingConfig, record_actor_episodes
from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig
from worldloop.vla.factory import load_policy
from worldloop.vla.policy import Policy


class KeepsLastObservation(gym.Wrapper):
    """The env as it is, remembering its last observation for an actor that acts on it."""

    last_observation: dict

    def reset(self, **kwargs):
        self.last_observation, info = self.env.reset(**kwargs)
        return self.last_observation, info

    def step(self, action):
        self.last_observation, *rest = self.env.step(action)
        return self.last_observation, *rest


class PolicyActor:
    """A `Policy` in the sim recording's actor shape (`reset(seed)`, `act()`; `sim.recording`), reading the wrapped env's last
    observation; the sampler's noise is seeded per episode so a recording is reproducible."""

    def __init__(self, policy: Policy, env: KeepsLastObservation, device: str):
        self.policy, self.env, self.device = policy, env, device
        self.cameras = tuple(policy.config.cameras)
        self.task = ""

    def reset(self, seed: int | None = None) -> None:
        self.policy.reset()
        if seed is not None:
            torch.manual_seed(seed)
        self.task = self.env.unwrapped.task_info()["task"]

    @torch.no_grad()
    def act(self) -> np.ndarray:
        obs = self.env.last_observation
        batch = {
            image_key(c): torch.from_numpy(obs[image_key(c)])
            .permute(2, 0, 1)[None]
            .float()
            .div(255)
            .to(self.device)
            for c in self.cameras
        }
        batch[STATE] = torch.from_numpy(obs[STATE])[None].float().to(self.device)
        batch[TASK] = [self.task]
        return self.policy.select_action(batch)[0].cpu().numpy()


def record_policy_episodes(
    policy: Policy,
    env_cfg: TabletopEnvConfig,
    root: str | Path,
    seeds: Sequence[int],
    device: str = "cpu",
    environment_state: bool = False,
) -> list[dict]:
    """One sim episode per seed of `policy` into a new dataset at `root`; per-episode seed, success, length
    (with `environment_state`, the cubes' positions are recorded too: `sim.recording.open_writer`).

    The env records `env_cfg.cameras` at `env_cfg.image_size`; the policy must read a subset of them at
    that size (a clear error otherwise)."""
    missing = [c for c in policy.config.cameras if c not in env_cfg.cameras]
    if missing or tuple(policy.config.image_size) != (env_cfg.image_size, env_cfg.image_size):
        raise ValueError(
            f"the policy reads cameras {list(policy.config.cameras)} at {list(policy.config.image_size)}; "
            f"the recording has {list(env_cfg.cameras)} at {env_cfg.image_size}x{env_cfg.image_size}"
        )
    env = KeepsLastObservation(TabletopEnv(env_cfg))
    try:
        policy.eval()
        return record_actor_episodes(
            env, PolicyActor(policy, env, device), root, seeds, environment_state=environment_state
        )
    finally:
        env.close()


def record_policies(cfg: RecordingConfig, device: str = "cpu") -> Path:
    """`cfg.episodes` sim episodes of each of `cfg.policies`, after the episodes of `cfg.include`, in one new
    dataset at `cfg.root`; `meta/recording.json` lists each policy's episodes. Returns the root."""
    cfg.validate()
    if not cfg.policies:
        raise ValueError("RecordingConfig.policies is empty: name the policies to record")
    root = Path(cfg.root)
    prepare_root(root, cfg.overwrite)
    env_cfg = cfg.env_config()
    parts = policy_recording_parts(root)  # one dataset per policy, merged into root at the end
    shutil.rmtree(parts, ignore_errors=True)
    recorded = []
    bar = tqdm(cfg.policies, desc="recording policies", unit="policy")
    for k, path in enumerate(bar):
        seeds = [cfg.seed + k * cfg.episodes + i for i in range(cfg.episodes)]
        episodes = record_policy_episodes(
            load_policy(path, device), env_cfg, parts / f"{k:03d}", seeds, device, cfg.environment_state
        )
        success = sum(bool(e["success"]) for e in episodes) / len(episodes)
        recorded.append({"policy": path, "success_rate": success, "episodes": episodes})
        bar.write(
            f"{path}: success {success:.0%} over {len(episodes)} episodes (seeds {seeds[0]}..{seeds[-1]})"
        )
    grow_dataset([*cfg.include, *(parts / f"{k:03d}" for k in range(len(cfg.policies)))], root, cfg.repo_id)
    shutil.rmtree(parts)
    write_recording_meta(root, {"config": asdict(cfg), "complete": True, "policies": recorded})
    return root
