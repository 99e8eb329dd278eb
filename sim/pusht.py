"""LeRobot's gym-pusht as a data source: a scripted pusher that reads the frame, and its recording.

gym-pusht (`pip install 'worldloop[pusht]'`) is a 2-D task: a round agent, driven to a commanded position
(x, y) in a 512 x 512 world by a PD controller, pushes a grey T towards a fixed green target; the reward is
the T's coverage of the target (clipped at 95%, which is success), at 10 fps. It is the environment nobody
here wrote, so imagination on it is checked against the env itself.

`PushTPusher` is a scripted pusher that sees what a policy sees: it finds the T by its colour in the camera
frame and the agent from `observation.state`, gets behind the T on the far side from the target and pushes
it there (it does not turn the T, so its coverage stays partial). With probability `1 - skill` a step heads
for a random wander point instead, which grades it from purposeful to aimless. Because it reads frames, the
same pusher acts in the env and in imagination (`vla/scripted_pusher.py` wraps it as a policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

PUSHT_GYM_ID = "gym_pusht/PushT-v0"
PUSHT_TASK = "push the T onto the green target"
PUSHT_FPS = 10
WORLD = 512.0  # the env's world is WORLD x WORLD; frames show all of it
GOAL = np.array([256.0, 256.0])  # the target's position (the env's goal pose is fixed)
T_COLOUR = np.array([119, 136, 153])  # LightSlateGray, the T's fill
T_COLOUR_TOLERANCE = (
    40  # summed absolute RGB difference; keeps the fill, drops the green target and the agent
)
MIN_T_PIXELS = 4  # fewer matching pixels: the T is not visible (occluded, or blurred away in a drawn frame)


def locate_t(frame: np.ndarray) -> np.ndarray | None:
    """World position (x, y) of the T's centroid in a uint8 HxWx3 frame of the whole world; None if fewer than
    MIN_T_PIXELS pixels have its colour. The fill's centroid lies within a few world units of the T's centre
    of gravity."""
    diff = np.abs(frame.astype(np.int32) - T_COLOUR).sum(-1)
    ys, xs = np.nonzero(diff < T_COLOUR_TOLERANCE)
    if len(xs) < MIN_T_PIXELS:
        return None
    h, w = frame.shape[:2]
    return np.array([(xs.mean() + 0.5) * WORLD / w, (ys.mean() + 0.5) * WORLD / h])


@dataclass
class PushTPusherConfig:
    skill: float = 1.0  # 1: always pushes; 0: always wanders
    max_step: float = 30.0  # world units the commanded position moves per step
    behind: float = 75.0  # how far behind the T's centre the push starts
    wander_every: int = 15  # steps between new wander points

    def validate(self) -> None:
        if not 0.0 <= self.skill <= 1.0:
            raise ValueError(f"PushTPusherConfig.skill={self.skill} must be in [0, 1]")
        if self.max_step <= 0 or self.behind <= 0 or self.wander_every < 1:
            raise ValueError(
                f"PushTPusherConfig: max_step, behind and wander_every must be positive, got {self}"
            )


class PushTPusher:
    """B pushers stepped together; `reset(batch, rng)` before an episode, then `act` once per step."""

    def __init__(self, config: PushTPusherConfig | None = None):
        self.config = config or PushTPusherConfig()
        self.config.validate()

    def reset(self, batch: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.pushing = np.zeros(batch, dtype=bool)
        self.wander = rng.uniform(40, WORLD - 40, (batch, 2))
        self.steps = 0

    def act(self, frames: np.ndarray, agent: np.ndarray) -> np.ndarray:
        """frames [B, H, W, 3] uint8, agent [B, 2] world positions -> commanded positions [B, 2]."""
        cfg = self.config
        if self.steps and self.steps % cfg.wander_every == 0:
            self.wander = self.rng.uniform(40, WORLD - 40, self.wander.shape)
        self.steps += 1
        targets = np.empty_like(self.wander)
        for i, (frame, pos) in enumerate(zip(frames, agent)):
            t = locate_t(frame)
            targets[i] = self.wander[i] if t is None else self._push_target(i, pos, t)
        aimless = self.rng.random(len(agent)) >= cfg.skill
        targets[aimless] = self.wander[aimless]
        targets = np.clip(targets + self.rng.normal(0, 8, targets.shape), 10, WORLD - 10)
        step = targets - agent
        norm = np.linalg.norm(step, axis=1, keepdims=True)
        step *= np.minimum(1.0, cfg.max_step / np.maximum(norm, 1e-9))
        return (agent + step).astype(np.float32)

    def _push_target(self, i: int, agent: np.ndarray, t: np.ndarray) -> np.ndarray:
        cfg = self.config
        to_goal = GOAL - t
        dist = float(np.linalg.norm(to_goal))
        d = to_goal / dist if dist > 1e-6 else np.array([1.0, 0.0])
        perp = np.array([-d[1], d[0]])
        rel = agent - t
        along, side = float(rel @ d), float(rel @ perp)
        start = np.clip(t - d * cfg.behind, 15, WORLD - 15)
        if self.pushing[i] and (along > -25 or abs(side) > 40):
            self.pushing[i] = False  # slipped off the T: line up again
        if not self.pushing[i]:
            if np.linalg.norm(agent - start) < 20:
                self.pushing[i] = True
            elif along > -60 and np.linalg.norm(rel) < 110:
                # On the target's side of the T: go round it rather than push it the wrong way.
                return t + perp * (1.0 if side >= 0 else -1.0) * 110 - d * 60
            else:
                return start
        return t + d * min(dist, 50.0)


def make_pusht_env(image_size: int):
    """gym-pusht with frames of `image_size` and the agent position: observations {pixels, agent_pos}."""
    import gymnasium as gym

    try:
        import gym_pusht  # noqa: F401  registers gym_pusht/PushT-v0
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("gym-pusht is not installed: pip install 'worldloop[pusht]'") from e
    return gym.make(
        PUSHT_GYM_ID, obs_type="pixels_agent_pos", observation_width=image_size, observation_height=image_size
    )


def record_pusht(cfg, root: Path, skills: np.ndarray) -> Path:
    """`cfg.episodes` episodes of the scripted pusher in gym-pusht (episode i: env seed `cfg.seed + i`, skill
    `skills[i]`) into a new LeRobotDataset at `root`: `observation.images.top` (cfg.image_size square),
    `observation.state` and `action` (x, y in world units), `next.reward` (the env's coverage reward),
    `next.success`, `next.done`, at 10 fps. `cfg` is a `sim.recording.RecordingConfig` with task "pusht"."""
    from dataclasses import asdict

    from worldloop.data.features import STATE, image_key
    from worldloop.data.recording import EpisodeWriter

    env = make_pusht_env(cfg.image_size)
    pusher = PushTPusher()
    size = (cfg.image_size, cfg.image_size)
    writer = EpisodeWriter(
        root, cfg.repo_id, PUSHT_FPS, "pusht", ("x", "y"), ("top",), size, cfg.episodes, asdict(cfg),
        cfg.image_writer_threads,
    )  # fmt: skip
    try:
        with writer:
            bar = tqdm(skills, desc="recording pusht", unit="episode")
            for i, skill in enumerate(bar):
                seed = cfg.seed + i
                obs, info = env.reset(seed=seed)
                pusher.config = PushTPusherConfig(skill=float(skill))
                pusher.reset(1, np.random.default_rng(seed))
                best = 0.0
                for t in range(cfg.max_steps):
                    action = pusher.act(obs["pixels"][None], obs["agent_pos"][None].astype(np.float64))[0]
                    frame = {image_key("top"): obs["pixels"], STATE: obs["agent_pos"].astype(np.float32)}
                    obs, reward, terminated, _, info = env.step(action)
                    done = bool(terminated) or t == cfg.max_steps - 1
                    writer.add_frame(frame, action, float(reward), bool(info["is_success"]), done, PUSHT_TASK)
                    best = max(best, float(info["coverage"]))
                    if done:
                        break
                writer.end_episode(seed=seed, skill=float(skill), max_coverage=best)
                bar.set_postfix(coverage=f"{np.mean([e['max_coverage'] for e in writer.episodes]):.2f}")
    finally:
        env.close()
    return root
