"""The judge's upper bound: the policy acts in the simulator and the world model's judge reads the sim's frames.

Imagination's verdict on a policy mixes two errors: the world model drawing the wrong future, and the judge
(the outcome heads) misreading what was drawn. Here the future is the real one, so what is left is the judge's
own error: an imagination ranking cannot beat the ranking this evaluation gives (`--observe=sim`).

Episodes start from the same sim resets as imagination's (seeds seed..) and run to the horizon (the sim does
not end them at its own success, so the judge sees as many frames as in imagination). An episode succeeds
when the judge's success probability crosses the threshold at any step, as in `WorldModelEnv`; the sim's
own verdict is kept beside it as `sim_success`, and as `sim_success_judged` over the steps the judge read
(up to the one it passed the episode on: what the actions it was paid for did).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn.functional as F

from worldloop.data.features import STATE, image_key
from worldloop.vla.episode_runner import closing_all, run_episodes, success_summary
from worldloop.vla.policy import Policy
from worldloop.vla.sim_evaluation import SimEvalConfig, TabletopEpisodes
from worldloop.world_model.model import WorldModel


class JudgedSimEnv(gym.Wrapper):
    """A tabletop env whose every step is also judged by a world model's outcome heads from its frames.

    info gains `judge_success_prob` and `judge_progress` (the reward head clipped to [0, 1]), computed from
    the world model's cameras, resized to its frame size, with the joint state and the reset frame.
    """

    def __init__(self, env: gym.Env, world_model: WorldModel):
        super().__init__(env)
        self.world_model = world_model.eval()
        self.cameras = tuple(world_model.cfg.cameras)
        self.size = world_model.cfg.dit.image_size
        self.device = next(world_model.parameters()).device

    def _pixels(self, obs: dict) -> torch.Tensor:
        """The world model's views of one observation: [1, V, 3, H, W] in [-1, 1]."""
        views = []
        for cam in self.cameras:
            frame = torch.from_numpy(obs[image_key(cam)]).permute(2, 0, 1)[None].float().div_(255)
            if frame.shape[-1] != self.size or frame.shape[-2] != self.size:
                frame = F.interpolate(frame, size=(self.size, self.size), mode="area")
            views.append(frame)
        return WorldModel.frames_in(torch.stack(views, 1).to(self.device))

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._first = self._pixels(obs)
        self._task = [info["task"]]
        return obs, info

    @torch.no_grad()
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        state = torch.as_tensor(obs[STATE], dtype=torch.float32, device=self.device)[None, None]
        out = self.world_model.outcomes(self._pixels(obs)[:, None], self._task, state, self._first)
        info = {
            **info,
            "judge_success_prob": float(torch.sigmoid(out["success_logit"]).flatten()[0]),
            "judge_progress": float(out["reward"].flatten()[0].clamp(0, 1)),
        }
        return obs, reward, terminated, truncated, info


class JudgedEpisodes(TabletopEpisodes):
    """Episode records whose success and progress are the judge's; the sim's own stay as sim_success and
    sim_progress."""

    def __init__(self, cameras: tuple[str, ...], device, threshold: float):
        super().__init__(cameras, device)
        self.threshold = threshold

    def first_record(self, seed: int, reset_info: dict) -> dict:
        record = super().first_record(seed, reset_info)
        record.update(
            {"sim_success": False, "sim_success_judged": False, "sim_progress": 0.0, "max_success_prob": 0.0}
        )
        return record

    def update(self, record: dict, reward: float, info: dict) -> None:
        record["sim_success"] = record["sim_success"] or bool(info["success"])
        record["sim_progress"] = float(info["progress"])
        if record["success"]:  # as in imagination: an episode the judge passed stops being judged
            return
        record["sim_success_judged"] = record["sim_success"]
        prob = info["judge_success_prob"]
        record["max_success_prob"] = max(record["max_success_prob"], prob)
        record["success"] = prob > self.threshold
        record["progress"] = 1.0 if record["success"] else info["judge_progress"]


def evaluate_judged_in_sim(
    policy: Policy,
    world_model: WorldModel,
    threshold: float,
    cfg: SimEvalConfig,
    episodes: int,
    seed: int,
    video_dir: str | Path | None = None,
    device: str = "cpu",
    env_seeds: Sequence[int] | None = None,
) -> dict:
    """`episodes` sim episodes (seeds seed.., or `env_seeds` as `run_episodes`) judged by `world_model`'s heads
    at `threshold`; a summary in the shape of `evaluate_in_sim`'s, with backend "sim_judged"."""
    from worldloop import sim  # registers the envs

    policy_cameras = tuple(policy.config.cameras)
    size = policy.config.image_size[0]
    cameras = tuple(dict.fromkeys(policy_cameras + tuple(world_model.cfg.cameras)))
    config = cfg.env_config(size, cameras, terminate_on_success=False)
    n_envs = min(cfg.batch_envs, episodes)
    with closing_all(
        [JudgedSimEnv(gym.make(sim.ENV_IDS[cfg.task], config=config), world_model) for _ in range(n_envs)]
    ) as envs:
        results, seconds = run_episodes(
            policy,
            envs,
            JudgedEpisodes(policy_cameras, device, threshold),
            episodes,
            seed,
            cfg.videos,
            video_dir,
            desc=f"judged sim {cfg.task}",
            env_seeds=env_seeds,
        )
    return {
        "backend": "sim_judged",
        "task": cfg.task,
        **success_summary(results),
        "sim_success_rate": sum(r["sim_success"] for r in results) / len(results),
        "seconds": seconds,
        "per_episode": results,
    }
