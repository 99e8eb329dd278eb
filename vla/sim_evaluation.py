"""Closed-loop evaluation of a policy in the MuJoCo tabletop envs: success with a Wilson 95% interval,
mean final progress, episode videos and a JSON summary.

Several envs run in lock-step so that one batched policy call serves all of them; an env whose episode
has ended keeps feeding its last observation (its actions are dropped) until the group is done.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.features import STATE, TASK, image_key
from vla.policy import Policy


@dataclass
class SimEvalConfig:
    task: str = "reach"  # reach | push (worldloop/Tabletop<Task>-v0)
    max_steps: int = 50  # env steps per episode (10 fps)
    batch_envs: int = 10  # envs stepped together, one batched policy call per step
    videos: int = 4  # episodes recorded as mp4 (front | wrist side by side); 0 for none
    init_joint_noise: float = 0.1  # rad, as the env default
    backend: str = "mujoco"  # physics/rendering: mujoco | genesis (pip install 'worldloop[genesis]')


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0 and n successes, unlike Wald's)."""
    if n <= 0:
        raise ValueError(f"wilson_interval needs n > 0 trials, got {n}")
    p = successes / n
    denom = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _policy_batch(observations: list[dict], tasks: list[str], cameras: tuple[str, ...], device) -> dict:
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


def _video_frame(obs: dict, cameras: tuple[str, ...]) -> np.ndarray:
    return np.concatenate([obs[image_key(c)] for c in cameras], axis=1)


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

    import sim  # registers the envs

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    cameras = tuple(policy.config.cameras)
    h, w = policy.config.image_size
    if h != w:
        raise ValueError(f"the tabletop envs render square frames; the policy expects {h}x{w}")
    n_envs = min(cfg.batch_envs, episodes)
    envs = [
        gym.make(
            sim.ENV_IDS[cfg.task],
            image_size=h,
            cameras=cameras,
            max_steps=cfg.max_steps,
            init_joint_noise=cfg.init_joint_noise,
            backend=cfg.backend,
        )
        for _ in range(n_envs)
    ]
    policy.eval()
    results: list[dict] = []
    start = time.perf_counter()
    bar = tqdm(total=episodes, desc=f"eval {cfg.task}", disable=not progress_bar)
    try:
        for first in range(0, episodes, n_envs):
            group = list(range(first, min(first + n_envs, episodes)))
            results += _run_group(
                policy,
                envs[: len(group)],
                [seed + i for i in group],
                cameras,
                cfg,
                device,
                video_dir,
                record=[i < cfg.videos and video_dir is not None for i in group],
            )
            bar.update(len(group))
            bar.set_postfix(success=f"{np.mean([r['success'] for r in results]):.0%}")
    finally:
        bar.close()
        for env in envs:
            env.close()
    successes = sum(r["success"] for r in results)
    lo, hi = wilson_interval(successes, len(results))
    summary = {
        "backend": "sim",
        "sim_backend": cfg.backend,
        "task": cfg.task,
        "episodes": len(results),
        "successes": successes,
        "success_rate": successes / len(results),
        "success_ci95": [lo, hi],
        "mean_progress": float(np.mean([r["progress"] for r in results])),
        "mean_length": float(np.mean([r["length"] for r in results])),
        "seed": seed,
        "max_steps": cfg.max_steps,
        "seconds": time.perf_counter() - start,
        "per_episode": results,
    }
    return summary


@torch.no_grad()
def _run_group(policy, envs, seeds, cameras, cfg, device, video_dir, record) -> list[dict]:
    observations, tasks = [], []
    for env, s in zip(envs, seeds):
        obs, info = env.reset(seed=s)
        observations.append(obs)
        tasks.append(info["task"])
    frames = [[_video_frame(o, cameras)] if rec else [] for o, rec in zip(observations, record)]
    done = [False] * len(envs)
    out = [
        {"seed": s, "task": t, "success": False, "progress": 0.0, "length": 0} for s, t in zip(seeds, tasks)
    ]
    policy.reset()
    while not all(done):
        actions = policy.select_action(_policy_batch(observations, tasks, cameras, device)).cpu().numpy()
        for i, env in enumerate(envs):
            if done[i]:
                continue
            obs, _, terminated, truncated, info = env.step(actions[i])
            observations[i] = obs
            out[i]["length"] += 1
            out[i]["success"] = out[i]["success"] or bool(info["success"])
            out[i]["progress"] = float(info["progress"])
            if record[i]:
                frames[i].append(_video_frame(obs, cameras))
            done[i] = terminated or truncated
    if any(record):
        import imageio.v2 as imageio

        for i, clip in enumerate(frames):
            if clip:
                tag = "success" if out[i]["success"] else "failure"
                path = Path(video_dir) / "videos" / f"episode_seed{seeds[i]}_{tag}.mp4"
                path.parent.mkdir(parents=True, exist_ok=True)
                imageio.mimwrite(
                    path, clip, fps=int(envs[i].metadata.get("render_fps", 10)), macro_block_size=1
                )
                out[i]["video"] = str(path)
    return out
