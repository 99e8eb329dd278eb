"""The closed-loop episode runner shared by the gymnasium-based evaluation backends (the MuJoCo tabletop in
`vla.sim_evaluation`, LeRobot's gym envs in `vla.lerobot_env_evaluation`).

Several envs run in lock-step so that one batched policy call serves all of them; an env whose episode has
ended keeps feeding its last observation (its actions are dropped) until the group is done. What differs
between backends (how observations become a policy batch, what an episode records, what a video frame is)
comes from an `EpisodeAdapter`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from tqdm import tqdm

from worldloop.common.rng import torch_seeded
from worldloop.common.stats import wilson_interval
from worldloop.vla.policy import Policy


class EpisodeAdapter(Protocol):
    """The backend-specific part of an evaluation episode."""

    def first_record(self, seed: int, reset_info: dict) -> dict:
        """The episode's record before its first step: `seed`, `success`, `progress`, `length` and any
        backend keys, in the order they should appear in the summary."""

    def policy_batch(self, observations: list, records: list[dict]) -> dict:
        """The policy's input for one observation per env (records give per-episode context, e.g. the task)."""

    def update(self, record: dict, reward: float, info: dict) -> None:
        """Fold one env step into the record (`length` is counted by the runner)."""

    def video_frame(self, observation) -> np.ndarray:
        """One uint8 HxWx3 frame of the episode video."""


@contextmanager
def closing_all(envs: list) -> Iterator[list]:
    """`envs`, each closed when the block ends, however it ends (a renderer or a gym env holds native handles)."""
    try:
        yield envs
    finally:
        for env in envs:
            env.close()


def run_episodes(
    policy: Policy,
    envs: list,
    adapter: EpisodeAdapter,
    episodes: int,
    seed: int,
    videos: int,
    video_dir: str | Path | None,
    desc: str,
    progress_bar: bool = True,
    env_seeds: Sequence[int] | None = None,
) -> tuple[list[dict], float]:
    """Run `episodes` episodes (env seeds seed, seed+1, ..., or `env_seeds`, one per episode, which may
    repeat a reset) in groups of `len(envs)`; the first `videos` are written to `video_dir/videos/` when it is
    given. Returns the per-episode records and the seconds taken. The policy's random draws in a group come
    from torch's generators seeded with seed + the group's first episode index: the same seeds and group size
    give the same episodes, whatever ran before."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if env_seeds is not None and len(env_seeds) != episodes:
        raise ValueError(f"env_seeds: {len(env_seeds)} seeds for {episodes} episodes")
    reset_seeds = [seed + i for i in range(episodes)] if env_seeds is None else [int(s) for s in env_seeds]
    policy.eval()
    results: list[dict] = []
    start = time.perf_counter()
    with tqdm(total=episodes, desc=desc, disable=not progress_bar) as bar:
        for first in range(0, episodes, len(envs)):
            group = list(range(first, min(first + len(envs), episodes)))
            with torch_seeded(seed + first):  # the policy's noise, fixed by the group's first seed
                results += _run_group(
                    policy,
                    envs[: len(group)],
                    adapter,
                    [reset_seeds[i] for i in group],
                    video_dir,
                    record=[i < videos and video_dir is not None for i in group],
                )
            bar.update(len(group))
            bar.set_postfix(success=f"{np.mean([r['success'] for r in results]):.0%}")
    return results, time.perf_counter() - start


def success_summary(results: list[dict]) -> dict:
    """Episodes, successes, success rate with its Wilson 95% interval, mean progress."""
    successes = sum(r["success"] for r in results)
    lo, hi = wilson_interval(successes, len(results))
    return {
        "episodes": len(results),
        "successes": successes,
        "success_rate": successes / len(results),
        "success_ci95": [lo, hi],
        "mean_progress": float(np.mean([r["progress"] for r in results])),
    }


@torch.no_grad()
def _run_group(policy, envs, adapter: EpisodeAdapter, seeds, video_dir, record) -> list[dict]:
    observations, out = [], []
    for env, s in zip(envs, seeds):
        obs, info = env.reset(seed=s)
        observations.append(obs)
        out.append(adapter.first_record(s, info))
    frames = [[adapter.video_frame(o)] if rec else [] for o, rec in zip(observations, record)]
    done = [False] * len(envs)
    policy.reset()
    while not all(done):
        actions = policy.select_action(adapter.policy_batch(observations, out)).cpu().numpy()
        for i, env in enumerate(envs):
            if done[i]:
                continue
            obs, reward, terminated, truncated, info = env.step(actions[i])
            observations[i] = obs
            out[i]["length"] += 1
            adapter.update(out[i], float(reward), info)
            if record[i]:
                frames[i].append(adapter.video_frame(obs))
            done[i] = terminated or truncated
    if any(record):
        _write_videos(frames, out, envs, video_dir)
    return out


def _write_videos(frames, out, envs, video_dir) -> None:
    import imageio.v2 as imageio

    for i, clip in enumerate(frames):
        if clip:
            tag = "success" if out[i]["success"] else "failure"
            path = Path(video_dir) / "videos" / f"episode_seed{out[i]['seed']}_{tag}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            fps = int(envs[i].metadata.get("render_fps", 10))
            imageio.mimwrite(path, clip, fps=fps, macro_block_size=1)
            out[i]["video"] = str(path)
