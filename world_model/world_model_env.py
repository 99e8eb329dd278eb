"""A batched, gymnasium-style imagination env over a trained world model.

    env = WorldModelEnv(world_model, WorldModelEnvConfig(horizon=50))   # the model's own embodiment
    obs = env.reset(initial_states, seed=0)           # from dataset episodes or live sim frames
    obs, reward, terminated, truncated, info = env.step(action_chunk)   # [B, K, A] joint targets

Observations have the batch format every `Policy` reads from real robots and the simulator:
`observation.images.<cam>` float [B, 3, H, W] in [0, 1] for each camera the world model draws,
`observation.state` [B, S], `task` (list of B str).

The world model draws frames, not joint positions. The imagined `observation.state` integrates the
commanded joint targets the way the simulator's servos do (`sim.tabletop_sim.TabletopSim.advance`): each
step the state moves towards the clipped target by at most `velocity_limit / fps` per joint, and stays
within the position limits. This is exact for an unobstructed arm and drifts only when contact stops the
arm, which the frames then show and the policy can see; an inverse-dynamics estimate would instead add
its own error on every step, contact or not.

Each `step` runs `WorldModel.rollout` over the chunk from the last `dit.context_frames` imagined frames: the
KV cache carries the chunk's frames from one frame to the next, and the few-step sampler of the world
model's config (or `sampler_steps`) draws each frame. Randomness comes from one generator seeded at
`reset`, so the same seed, initial states and actions give the same frames, rewards and success.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.data.dataset import EpisodeDataset
from worldloop.data.features import STATE, TASK, image_key
from worldloop.world_model.checkpoint_inputs import embodiment_of
from worldloop.world_model.model import WorldModel

OBSERVE_MODES = ("drawn", "first_frame")


@dataclass
class WorldModelEnvConfig:
    horizon: int = 50  # env steps (frames at the embodiment's fps) per imagined episode
    sampler_steps: int = 0  # denoising steps per frame; 0 -> the world model's own sampler config
    use_cache: bool = True  # KV cache inside each chunk (False: the slow recompute reference path)
    # Success-head probability above which a step counts as a success; 0 -> the world model's calibrated
    # heads.success_threshold.
    success_threshold: float = 0.0
    terminate_on_success: bool = True  # an env that succeeded stops earning reward (as the sim's envs)
    # What the policy sees: "drawn" (the frames the world model draws) or "first_frame" (the start frame,
    # held for the whole episode). The world model draws, and the judge reads, the drawn frames either way:
    # "first_frame" is the ablation that measures what the drawn video adds to the policy's decisions.
    observe: str = "drawn"

    def validate(self) -> None:
        if self.observe not in OBSERVE_MODES:
            raise ValueError(f"WorldModelEnvConfig.observe={self.observe!r}: expected one of {OBSERVE_MODES}")
        if self.horizon < 1:
            raise ValueError(f"WorldModelEnvConfig.horizon={self.horizon} must be >= 1")
        if self.sampler_steps < 0:
            raise ValueError(f"WorldModelEnvConfig.sampler_steps={self.sampler_steps} must be >= 0")
        if not 0 <= self.success_threshold < 1:
            raise ValueError(
                f"WorldModelEnvConfig.success_threshold={self.success_threshold} must be in (0, 1), "
                "or 0 for the world model's own"
            )


@dataclass
class InitialStates:
    """Where B imagined episodes start: C context frames per camera, the C-1 actions between them.

    frames: camera -> [B, C, 3, H, W] float in [0, 1] (or uint8); actions: [B, C-1, A] in dataset units;
    state: [B, S] joint positions at the last context frame; task: B instructions; seeds: the simulator reset
    seed of each start when it was rendered from one (None otherwise), so that the same episode can be run for
    real.
    """

    frames: dict[str, torch.Tensor]
    actions: torch.Tensor
    state: torch.Tensor
    task: list[str]
    seeds: list[int] | None = None

    @property
    def batch_size(self) -> int:
        return self.state.shape[0]

    def repeat(self, times: int) -> InitialStates:
        """Each start `times` times in a row (a GRPO group: [s0, s0, ..., s1, s1, ...])."""
        return InitialStates(
            {c: f.repeat_interleave(times, 0) for c, f in self.frames.items()},
            self.actions.repeat_interleave(times, 0),
            self.state.repeat_interleave(times, 0),
            [t for t in self.task for _ in range(times)],
            None if self.seeds is None else [s for s in self.seeds for _ in range(times)],
        )

    def select(self, index: list[int]) -> InitialStates:
        return InitialStates(
            {c: f[index] for c, f in self.frames.items()},
            self.actions[index],
            self.state[index],
            [self.task[i] for i in index],
            None if self.seeds is None else [self.seeds[i] for i in index],
        )


def _as_float_frames(frames: torch.Tensor) -> torch.Tensor:
    return frames.float() / 255 if frames.dtype == torch.uint8 else frames.float()


class WorldModelEnv:
    """B imagined episodes stepped together; see the module docstring."""

    def __init__(
        self,
        world_model: WorldModel,
        config: WorldModelEnvConfig | None = None,
        embodiment: EmbodimentSpec | None = None,
    ):
        """`embodiment`: the robot whose limits the imagined state keeps; None -> the one the world model's
        checkpoint stores (`checkpoint_inputs.embodiment_of`)."""
        self.config = config or WorldModelEnvConfig()
        self.config.validate()
        self.world_model = world_model.eval()
        embodiment = embodiment or embodiment_of(world_model)
        self.embodiment = embodiment
        dit = world_model.cfg.dit
        for what, dim in (("action_dim", dit.action_dim), ("state_dim", world_model.cfg.idm.state_dim)):
            if dim != embodiment.num_joints:
                raise ValueError(
                    f"world model {what}={dim} but embodiment {embodiment.name!r} has "
                    f"{embodiment.num_joints} joints"
                )
        self.cameras = tuple(world_model.cfg.cameras)
        self.success_threshold = self.config.success_threshold or world_model.cfg.heads.success_threshold
        self.context_frames = dit.context_frames
        self.device = next(world_model.parameters()).device
        self._lower = torch.tensor(embodiment.position_lower, dtype=torch.float32, device=self.device)
        self._upper = torch.tensor(embodiment.position_upper, dtype=torch.float32, device=self.device)
        self._max_move = torch.tensor(embodiment.velocity_limit, device=self.device) / embodiment.fps
        self._generator: torch.Generator | None = None
        self.steps_taken = 0  # env steps (frames) imagined since reset, the same for the whole batch

    # ---- episode ---------------------------------------------------------------------------------------
    def reset(self, initial: InitialStates, seed: int = 0) -> dict:
        """Start B episodes from `initial`; `seed` fixes every random draw of the episode."""
        b = initial.batch_size
        size = self.world_model.cfg.frame_size
        missing = [c for c in self.cameras if c not in initial.frames]
        if missing:
            raise KeyError(
                f"initial frames lack cameras {missing}: the world model draws {list(self.cameras)}, "
                f"got {sorted(initial.frames)}"
            )
        views = []
        for cam in self.cameras:
            f = initial.frames[cam]
            if f.dim() != 5 or f.shape[0] != b or tuple(f.shape[2:]) != (3, size, size):
                raise ValueError(
                    f"initial frames[{cam!r}]: expected [{b}, C, 3, {size}, {size}] (the world model's "
                    f"image size), got {list(f.shape)}"
                )
            views.append(_as_float_frames(f).to(self.device))
        frames = torch.stack(views, 2)  # [B, C, V, 3, H, W]
        c, a_dim = frames.shape[1], self.embodiment.num_joints
        if tuple(initial.actions.shape) != (b, c - 1, a_dim):
            raise ValueError(
                f"initial actions: expected [{b}, {c - 1}, {a_dim}] (between the {c} context frames), "
                f"got {list(initial.actions.shape)}"
            )
        if tuple(initial.state.shape) != (b, a_dim):
            raise ValueError(f"initial state: expected [{b}, {a_dim}], got {list(initial.state.shape)}")
        if len(initial.task) != b:
            raise ValueError(f"initial task: expected {b} instructions, got {len(initial.task)}")
        # The real frame the episode starts from, for outcome heads that read it (heads.use_first_frame).
        self._first = frames[:, 0]
        # The start frame the policy keeps seeing with observe="first_frame".
        self._held = frames[:, -1]
        # The DiT attends to `context_frames` earlier frames: older ones (and their actions) are dropped.
        self._frames = frames[:, -self.context_frames :]
        kept = self._frames.shape[1]
        self._actions = initial.actions.float().to(self.device)[:, initial.actions.shape[1] - (kept - 1) :]
        self._state = initial.state.float().to(self.device).clamp(self._lower, self._upper)
        self._task = list(initial.task)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self.succeeded = torch.zeros(b, dtype=torch.bool, device=self.device)
        self.progress = torch.zeros(b, device=self.device)
        self.steps_taken = 0
        return self._observation()

    def _observation(self) -> dict:
        last = self._held if self.config.observe == "first_frame" else self._frames[:, -1]
        obs = {image_key(cam): last[:, v] for v, cam in enumerate(self.cameras)}
        obs[STATE] = self._state.clone()
        obs[TASK] = list(self._task)
        return obs

    def integrate_state(self, state: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Joint positions after following targets [B, K, A] one step each (servo model): [B, K, A]."""
        out = []
        for k in range(targets.shape[1]):
            goal = targets[:, k].clamp(self._lower, self._upper)
            state = (state + (goal - state).clamp(-self._max_move, self._max_move)).clamp(
                self._lower, self._upper
            )
            out.append(state)
        return torch.stack(out, 1)

    @torch.no_grad()
    def step(self, action_chunk: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Imagine the frames that follow `action_chunk` [B, K, A] (absolute joint targets, dataset units).

        A chunk running past the horizon is cut at it. Returns (obs, reward [B], terminated [B],
        truncated [B], info) where reward sums the reward head over the steps taken before an env
        succeeded, terminated marks envs whose success probability crossed the threshold (now or earlier),
        and info holds per-step `frames` (camera -> [B, K, 3, H, W]), `rewards` and `success_prob` [B, K],
        `state` [B, K, A] and the running `progress` [B] (the reward head's last value, clipped to [0, 1]).
        """
        if self._generator is None:
            raise RuntimeError("call reset() before step()")
        b, a_dim = self._state.shape
        if action_chunk.dim() != 3 or action_chunk.shape[0] != b or action_chunk.shape[2] != a_dim:
            raise ValueError(f"action_chunk: expected [{b}, K, {a_dim}], got {list(action_chunk.shape)}")
        remaining = self.config.horizon - self.steps_taken
        if remaining <= 0:
            raise RuntimeError(
                f"the episode ended at the horizon ({self.config.horizon} steps); call reset()"
            )
        chunk = action_chunk[:, :remaining].float().to(self.device)
        # The world model was trained on the targets the sim actually used, i.e. clipped to the limits.
        chunk = chunk.clamp(self._lower, self._upper)
        states = self.integrate_state(self._state, chunk)
        frames, rewards, success = self.world_model.rollout(
            self._frames,
            self._actions,
            chunk,
            steps=self.config.sampler_steps or None,
            generator=self._generator,
            use_cache=self.config.use_cache,
            task=self._task,
            future_state=states,
            first_frame=self._first,
        )
        k = chunk.shape[1]
        # Per-step success with termination: steps after an env's first success earn nothing.
        hit = success > self.success_threshold
        already = self.succeeded.clone()
        active = torch.ones(b, k, dtype=torch.bool, device=self.device)
        if self.config.terminate_on_success:
            first_hit = torch.cumsum(hit.int(), 1) > 0
            # active up to and including the first successful step
            active = ~already[:, None] & (torch.cat([first_hit.new_zeros(b, 1), first_hit[:, :-1]], 1) == 0)
        reward = (rewards * active).sum(1)
        self.succeeded = already | (hit & active).any(1)
        # Progress: the reward head at each env's last active step (trained on the sim's progress in [0, 1]).
        steps = torch.arange(1, k + 1, device=self.device)
        last_active = (active.long() * steps).argmax(1)
        live = rewards.gather(1, last_active[:, None])[:, 0].clamp(0, 1)
        self.progress = torch.where(active.any(1), live, self.progress)
        self.progress = torch.where(self.succeeded, torch.ones_like(self.progress), self.progress)

        self._frames = torch.cat([self._frames, frames], 1)[:, -self.context_frames :]
        kept = self._frames.shape[1]
        self._actions = torch.cat([self._actions, chunk], 1)[:, self._actions.shape[1] + k - (kept - 1) :]
        self._state = states[:, -1]
        self.steps_taken += k
        terminated = self.succeeded.clone()
        truncated = torch.full((b,), self.steps_taken >= self.config.horizon, device=self.device)
        info = {
            "frames": {cam: frames[:, :, v] for v, cam in enumerate(self.cameras)},
            "rewards": rewards,
            "success_prob": success,
            "state": states,
            "progress": self.progress.clone(),
            "active": active,
        }
        return self._observation(), reward, terminated, truncated, info

    def judge(self) -> dict:
        """What decides success and progress here, for every result to name: the outcome heads' inputs and
        the threshold. kind "kinematic" when the heads read the real first frame and not the drawn ones (with
        the integrated joint states): the drawn frames then do not decide the verdict. "drawn_frames" when they
        read only the frames the world model draws (and the joint state); "drawn_and_first_frame" when they
        read both."""
        heads = self.world_model.cfg.heads
        if not heads.use_frame:
            kind = "kinematic"
        else:
            kind = "drawn_and_first_frame" if heads.use_first_frame else "drawn_frames"
        return {
            "kind": kind,
            "reads_drawn_frame": heads.use_frame,
            "reads_first_frame": heads.use_first_frame,
            "reads_state": heads.use_state,
            "success_threshold": float(self.success_threshold),
            "observe": self.config.observe,
        }

    @torch.no_grad()
    def success_prob(self, info: dict, task: list[str]) -> torch.Tensor:
        """[B, K] success probability of the frames the last `step` imagined (its `info`), judged as if the
        episodes had been asked for `task` (B instructions): hindsight, what they achieved for another goal."""
        if len(task) != self.succeeded.shape[0]:
            raise ValueError(f"success_prob: {len(task)} instructions for {self.succeeded.shape[0]} episodes")
        wm = self.world_model
        frames = torch.stack([info["frames"][cam] for cam in self.cameras], 2)  # [B, K, V, 3, H, W]
        out = wm.outcomes(wm.frames_in(frames), task, info["state"], wm.frames_in(self._first))
        return torch.sigmoid(out["success_logit"])

    @property
    def done(self) -> torch.Tensor:
        """[B] episodes that ended (success with terminate_on_success, or the horizon)."""
        over = self.steps_taken >= self.config.horizon
        ended = self.succeeded if self.config.terminate_on_success else torch.zeros_like(self.succeeded)
        return ended | over


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


FrameReading = Callable[[torch.Tensor, list[str]], torch.Tensor]
"""(drawn frames [B, K, 3, H, W] in [0, 1] of the first camera, the B instructions) -> [B, K] numbers."""


@torch.no_grad()
def replay_actions(
    env: WorldModelEnv,
    starts: InitialStates,
    actions: torch.Tensor,
    seed: int,
    chunk: int = 10,
    frame_reading: FrameReading | None = None,
) -> list[dict]:
    """Open loop: imagine recorded action sequences [B, T, A] from their episodes' first frames.

    What the world model predicts for behaviour whose real outcome is known (e.g. a dataset's scripted
    experts of graded skill): the success and progress heads can then be checked episode by episode.
    `frame_reading`, where given, is applied to every drawn frame: each result then holds its values per
    step (`frame_reading`), a reading of the drawn frames apart from the heads (e.g. object tracking).
    """
    if actions.dim() != 3 or actions.shape[0] != starts.batch_size:
        raise ValueError(f"actions: expected [{starts.batch_size}, T, A], got {list(actions.shape)}")
    env.reset(starts, seed=seed)
    max_prob = torch.zeros(starts.batch_size)
    readings = []
    t = 0
    while not env.done.all() and t < actions.shape[1]:
        _, _, _, _, info = env.step(actions[:, t : t + chunk])
        max_prob = torch.maximum(max_prob, (info["success_prob"] * info["active"]).max(1).values.cpu())
        if frame_reading is not None:
            readings.append(frame_reading(info["frames"][env.cameras[0]], starts.task).float().cpu())
        t += chunk
    results = [
        {
            "task": starts.task[i],
            "success": bool(env.succeeded[i]),
            "progress": float(env.progress[i]),
            "max_success_prob": float(max_prob[i]),
        }
        for i in range(starts.batch_size)
    ]
    if frame_reading is not None:
        per_step = torch.cat(readings, 1)
        for i, result in enumerate(results):
            result["frame_reading"] = per_step[i].tolist()
    return results


def replay_episodes(
    env: WorldModelEnv,
    dataset: EpisodeDataset,
    episodes: list[int],
    steps: int,
    batch_size: int,
    seed: int,
    chunk: int = 10,
    bar: tqdm | None = None,
    frame_reading: FrameReading | None = None,
) -> list[dict]:
    """`replay_actions` over dataset episodes, `batch_size` at a time: each episode from its first frame
    under its first `steps` recorded actions (every episode needs at least `steps` frames, each with its
    action). One result per episode, in order; batch k (from episode index i = k * batch_size) is seeded
    `seed + i`. `bar`: a progress bar advanced by each batch's episodes."""
    short = [e for e in episodes if dataset.episodes[e].length < steps]
    if short:
        raise ValueError(
            f"{dataset.root}: episodes {short[:5]} have fewer than {steps} frames; replaying {steps} steps "
            "needs at least that many recorded actions"
        )
    table = dataset.frame_table()
    results = []
    for first in range(0, len(episodes), batch_size):
        group = episodes[first : first + batch_size]
        starts = from_dataset(dataset, group, env.cameras)
        start_rows = [dataset.episodes[e].start for e in group]
        actions = torch.stack([table.action[row : row + steps] for row in start_rows])
        results += replay_actions(env, starts, actions, seed + first, chunk, frame_reading)
        if bar is not None:
            bar.update(len(group))
    return results
