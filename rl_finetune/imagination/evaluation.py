"""Policy evaluation in imagination: success and progress from the world model's heads, with intervals.

Episodes start from real first observations (simulator resets rendered without stepping the physics, or
dataset episodes) and then run only in the world model: the policy reads imagined frames and the servo
state model (see `world_model.world_model_env`), its chunks drive the next frames. An episode succeeds
when the success head crosses the env's threshold before the horizon; progress is the reward head's last
value (trained on the simulator's dense progress).

Sampling is seeded per group of episodes, so a result is reproducible from (policy, world model, starts,
seed), and the policy's own noise is drawn from a forked RNG that leaves the caller's untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldloop.common.rng import torch_seeded
from worldloop.common.stats import wilson_interval
from worldloop.data.features import image_key
from worldloop.vla.policy import Policy
from worldloop.world_model.world_model_env import (
    OBSERVE_MODES,
    InitialStates,
    WorldModelEnv,
    WorldModelEnvConfig,
)


@dataclass
class ImaginationEvalConfig:
    world_model: str = ""  # a pretrained world-model directory (config.yaml, model.safetensors, stats.json)
    horizon: int = 0  # imagined steps per episode; 0 -> the simulator evaluation's max_steps
    sampler_steps: int = 0  # denoising steps per frame; 0 -> the world model's own config
    success_threshold: float = 0.0  # 0 -> the world model's calibrated heads.success_threshold
    batch_envs: int = 10  # episodes imagined together
    videos: int = 4  # episodes written as mp4; 0 for none
    # The robot whose limits the imagined servo state keeps: "" -> the one the world model's checkpoint
    # stores; a built-in name or YAML file must agree with it (or name it for an older checkpoint).
    embodiment: str = ""
    # "" -> episodes start from simulator resets (the tabletop arm only); else a LeRobotDataset v3 directory
    # whose first `episodes` episodes give the first frames (no simulator: --compare-sim is not possible).
    starts_dataset: str = ""
    starts_resize: str = ""  # dataset frames of another size than the world model's: crop | stretch
    # What the policy sees: drawn (the imagined frames) | first_frame (the start frame held: the ablation
    # that measures what the drawn video adds; the judge reads the drawn frames either way) | sim (ranking
    # only: the policy acts in the simulator and the judge reads its frames, the judge's upper bound).
    observe: str = "drawn"

    def env_config(self, sim_max_steps: int) -> WorldModelEnvConfig:
        if self.observe not in (*OBSERVE_MODES, "sim"):
            raise ValueError(
                f"imagination.observe={self.observe!r}: expected one of {(*OBSERVE_MODES, 'sim')}"
            )
        return WorldModelEnvConfig(
            horizon=self.horizon or sim_max_steps,
            sampler_steps=self.sampler_steps,
            success_threshold=self.success_threshold,
            observe="drawn" if self.observe == "sim" else self.observe,
        )


def check_cameras(policy: Policy, env: WorldModelEnv) -> None:
    """A policy can only be imagined with cameras the world model draws."""
    cameras = tuple(getattr(policy.config, "cameras", ()))
    missing = [c for c in cameras if c not in env.cameras]
    if missing:
        raise ValueError(
            f"the policy reads cameras {list(cameras)} but the world model draws only {list(env.cameras)} "
            f"(missing {missing}): train the world model on those cameras (model.cameras, dit.num_views) or "
            f"the policy on the world model's"
        )


def to_video_frame(images: dict[str, torch.Tensor], cameras: tuple[str, ...], row: int) -> np.ndarray:
    """Cameras of one batch row side by side as uint8 HxWx3 (images: camera -> [B, 3, H, W] in [0, 1])."""
    parts = [
        (images[c][row].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy() for c in cameras
    ]
    return np.concatenate(parts, axis=1)


@torch.no_grad()
def imagine_episodes(
    policy: Policy, env: WorldModelEnv, starts: InitialStates, seed: int, record: int = 0
) -> tuple[list[dict], list[list[np.ndarray]]]:
    """Run one batch of imagined episodes to the horizon (or until all succeed).

    Returns per-episode results (success, progress, length, max success probability, the heads' success
    probability at every imagined step, the commanded actions and the imagined joint states from the start,
    all to the end of the batch) and, for the first
    `record` rows, the video frames (initial frame + one per imagined step, cameras side by side).
    """
    check_cameras(policy, env)
    policy.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy.reset()
        obs = env.reset(starts, seed=seed)
        b = starts.batch_size
        first = {c: obs[image_key(c)] for c in env.cameras}
        clips = [[to_video_frame(first, env.cameras, i)] for i in range(min(record, b))]
        length = torch.zeros(b, dtype=torch.long)
        max_prob = torch.zeros(b)
        max_reward = torch.zeros(b)  # the reward head, clipped to [0, 1], at its best active step
        # The imagined joint states row by row, also after a row's episode ended: the batch runs on until
        # every row has ended, and where the arm went next is what judging by the state needs (the success
        # head may end an episode before the arm gets there, or wrongly).
        paths = [[row] for row in starts.state.float().cpu()]
        probs = []  # [B, K] per step, likewise to the end of the batch
        actions = []  # [B, K, A]: the joint targets each step was imagined under, likewise
        while not env.done.all():
            chunk = policy.predict_action_chunk(obs)[:, : policy.n_action_steps]
            obs, _, _, _, info = env.step(chunk)
            active, state = info["active"].cpu(), info["state"].cpu()
            actions.append(chunk[:, : active.shape[1]].float().cpu())
            for path, row in zip(paths, state):
                path += list(row)
            length += active.sum(1)
            prob = info["success_prob"].cpu()
            probs.append(prob)
            max_prob = torch.maximum(max_prob, (prob * active).max(1).values)
            max_reward = torch.maximum(max_reward, (info["rewards"].cpu().clamp(0, 1) * active).max(1).values)
            frames = info["frames"]
            for i, clip in enumerate(clips):
                steps = frames[env.cameras[0]].shape[1]
                clip += [
                    to_video_frame({c: frames[c][:, k] for c in env.cameras}, env.cameras, i)
                    for k in range(steps)
                ]
    step_probs, step_actions = torch.cat(probs, 1), torch.cat(actions, 1)
    results = [
        {
            "task": starts.task[i],
            "success": bool(env.succeeded[i]),
            "progress": float(env.progress[i]),
            "length": int(length[i]),
            "max_success_prob": float(max_prob[i]),
            "max_reward": float(max_reward[i]),  # LeRobot's episode metric, from the reward head
            "joint_states": torch.stack(paths[i]).tolist(),  # [batch steps + 1, J]: where the arm went
            "success_probs": step_probs[i].tolist(),  # [batch steps]: the heads' verdict on each
            "actions": step_actions[i].tolist(),  # [batch steps, A]: the commanded joint targets
        }
        for i in range(b)
    ]
    return results, clips


def summarize(results: list[dict], backend: str, seconds: float) -> dict:
    successes = sum(r["success"] for r in results)
    lo, hi = wilson_interval(successes, len(results))
    progress = np.array([r["progress"] for r in results])
    half = 1.96 * progress.std(ddof=1) / np.sqrt(len(progress)) if len(progress) > 1 else float("nan")
    return {
        "backend": backend,
        "episodes": len(results),
        "successes": successes,
        "success_rate": successes / len(results),
        "success_ci95": [lo, hi],
        "mean_progress": float(progress.mean()),
        "progress_ci95": [float(progress.mean() - half), float(progress.mean() + half)],
        "seconds": seconds,
        "per_episode": results,
    }


def evaluate_in_imagination(
    policy: Policy,
    env: WorldModelEnv,
    starts: InitialStates,
    seed: int,
    batch_envs: int = 10,
    video_dir: str | Path | None = None,
    videos: int = 0,
    progress_bar: bool = True,
) -> tuple[dict, list[list[np.ndarray]]]:
    """Imagine one episode per start (groups of `batch_envs`); returns the summary and recorded clips.

    Group g is seeded `seed + g` (the world model's draws and the policy's); with `video_dir` the first
    `videos` clips are written there as mp4.
    """
    n = starts.batch_size
    start_time = time.perf_counter()
    results: list[dict] = []
    clips: list[list[np.ndarray]] = []
    bar = tqdm(total=n, desc="imagination eval", disable=not progress_bar)
    for g, first in enumerate(range(0, n, batch_envs)):
        rows = list(range(first, min(first + batch_envs, n)))
        with torch_seeded(seed + g):  # the policy's noise as well as the world model's
            group, group_clips = imagine_episodes(
                policy, env, starts.select(rows), seed + g, record=max(0, min(videos - first, len(rows)))
            )
        results += group
        clips += group_clips
        bar.update(len(rows))
        bar.set_postfix(success=f"{np.mean([r['success'] for r in results]):.0%}")
    bar.close()
    summary = summarize(results, "imagination", time.perf_counter() - start_time)
    summary["imagined_env_steps"] = int(sum(r["length"] for r in results))
    summary["mean_max_reward"] = float(np.mean([r["max_reward"] for r in results]))
    summary["judge"] = env.judge()
    if video_dir is not None:
        for i, clip in enumerate(clips):
            tag = "success" if results[i]["success"] else "failure"
            write_video(Path(video_dir) / "videos" / f"imagined_{i:03d}_{tag}.mp4", clip, env.embodiment.fps)
    return summary, clips


def write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, frames, fps=fps, macro_block_size=1)


def side_by_side(left: list[np.ndarray], right: list[np.ndarray]) -> list[np.ndarray]:
    """Two clips frame by frame (the shorter one holds its last frame), with a 2-pixel white divider."""
    n = max(len(left), len(right))
    out = []
    for k in range(n):
        a, b = left[min(k, len(left) - 1)], right[min(k, len(right) - 1)]
        divider = np.full((a.shape[0], 2, 3), 255, dtype=np.uint8)
        out.append(np.concatenate([a, divider, b], axis=1))
    return out
