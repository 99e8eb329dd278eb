"""Record episodes of an actor in the tabletop sim into a new local LeRobotDataset v3: the one env x actor
episode loop, and the scripted-expert recording of `record_demos.py`.

    python record_demos.py --config configs/record/tiny.yaml --episodes=200 --skill_range="[0.2, 1.0]"

    episodes = record_actor_episodes(env, actor, root, seeds)   # actor: reset(seed=...), act()

An actor is anything with `reset(seed=...)` and `act() -> action` (a `ScriptedExpert`, a policy wrapped by
`vla.sim_recording.PolicyActor`): it is duck-typed, so this module needs no policy code. Frames go to
`data.recording.EpisodeWriter`, the writer every recording shares, which keeps failures, labels each
frame's `next.success`, drops an interrupted episode and writes `meta/recording.json` (seed, success,
length per episode; the expert's skill too for scripted recordings).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from worldloop.data.features import ENVIRONMENT_STATE
from worldloop.data.recording import (
    RECORDING_META,
    EpisodeWriter,
    grow_dataset,
    prepare_root,
    recording_part,
)
from worldloop.sim.experts import ExpertConfig, ScriptedExpert
from worldloop.sim.tabletop_env import ENVIRONMENT_STATE_NAMES, TabletopEnv, TabletopEnvConfig


@dataclass
class RecordingConfig:
    root: str = "outputs/datasets/tabletop_push"  # local dataset directory (must not exist unless overwrite)
    repo_id: str = "worldloop/tabletop_push"  # a name only; nothing is pushed to or pulled from the hub
    task: str = "push"  # reach | push (the tabletop sim) | pusht (LeRobot's gym-pusht, sim/pusht.py)
    episodes: int = 50
    skill: float = 1.0  # expert skill for every episode (see sim/experts.py)
    # If set, each episode's skill is drawn uniformly from [low, high] instead: a mixture of good and bad
    # behaviour, which is what the world model wants to learn dynamics from.
    skill_range: list[float] | None = None
    seed: int = 0  # episode i uses env seed `seed + i` (`seed + i // variants` with variants)
    # Record each start this many times in a row, each time with its own expert draw and skill: counterfactual
    # takes of one start whose futures differ only by their actions (the world model's
    # `counterfactual_weight` trains on such pairs). Scripted tabletop recordings only.
    variants: int = 1
    image_size: int = 64
    cameras: list[str] = field(default_factory=lambda: ["front", "wrist"])
    max_steps: int = 50
    terminate_on_success: bool = True
    overwrite: bool = False  # replace an existing dataset at `root`
    # lerobot's async PNG writer threads; 2 record ~1.6x faster than 0 (benchmarks/recording.py)
    image_writer_threads: int = 2
    backend: str = "mujoco"  # physics/rendering: mujoco | genesis (pip install 'worldloop[genesis]')
    # Record these policies (pretrained_model directories) instead of the scripted expert: `episodes` each,
    # policy k's episode i on seed `seed + k * episodes + i`. Their failures differ from the expert's, and
    # the world model's success head learns failure only from the failures it is shown (vla/sim_recording.py).
    policies: list[str] = field(default_factory=list)
    # Datasets whose episodes come first in the new one (e.g. the expert demonstrations before recorded
    # policies, or more scripted episodes after an earlier recording); the recorded ones follow.
    include: list[str] = field(default_factory=list)
    # Record each cube's position at every frame as `observation.environment_state` (the truth object
    # tracking in drawn frames is scored against). A feature of the dataset: recordings merged with
    # `include` (and deployment recordings) must agree on it.
    environment_state: bool = False
    # Play these action sequences instead of the scripted expert: JSON-lines files of one episode a line,
    # {"seed": env seed, "actions": [[joint targets], ...]}, e.g. the `imagined_actions.jsonl` that imagination
    # evaluation writes for each policy: what those very actions do in the simulator. Each episode runs
    # `max_steps` steps, the last action held when the list is shorter; `episodes` and `seed` are not read.
    replay: list[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"RecordingConfig.episodes must be >= 1, got {self.episodes}")
        if not self.root:
            raise ValueError("RecordingConfig.root must name a local directory")
        if self.overwrite and any(Path(i).resolve() == Path(self.root).resolve() for i in self.include):
            raise ValueError(
                f"RecordingConfig: --overwrite=true with --include naming the root {self.root} would delete "
                "the included dataset before reading it; write to a new --root instead"
            )
        if self.skill_range is not None:
            if len(self.skill_range) != 2 or not 0.0 <= self.skill_range[0] <= self.skill_range[1] <= 1.0:
                raise ValueError(
                    f"RecordingConfig.skill_range must be [low, high] with 0 <= low <= high <= 1, "
                    f"got {self.skill_range}"
                )
        ExpertConfig(skill=self.skill).validate()
        if self.variants < 1:
            raise ValueError(f"RecordingConfig.variants must be >= 1, got {self.variants}")
        if self.variants > 1 and (self.task == "pusht" or self.policies or self.replay):
            raise ValueError(
                f"RecordingConfig.variants={self.variants}: counterfactual takes are recorded from the scripted "
                "expert in the tabletop sim, not with task=pusht, --policies or --replay"
            )
        if self.task == "pusht":
            # gym-pusht renders one camera, which the dataset names `top` (as LeRobot's pusht datasets).
            if list(self.cameras) != ["top"]:
                raise ValueError(
                    f"RecordingConfig.cameras={self.cameras}: task=pusht records one camera, pass --cameras=[top]"
                )
            if self.policies or self.replay:
                raise ValueError(
                    "RecordingConfig.policies / replay: they run the tabletop sim, not task=pusht"
                )
            return
        if self.policies and self.replay:
            raise ValueError("RecordingConfig: record --policies or --replay, not both")
        self.env_config().validate()

    def env_config(self) -> TabletopEnvConfig:
        """The env the episodes are recorded in."""
        return TabletopEnvConfig(
            task=self.task,
            image_size=self.image_size,
            cameras=tuple(self.cameras),
            max_steps=self.max_steps,
            terminate_on_success=self.terminate_on_success,
            backend=self.backend,
        )


def episode_skills(cfg: RecordingConfig) -> np.ndarray:
    """The expert skill of every episode (fixed, or drawn from skill_range with the recording seed)."""
    if cfg.skill_range is None:
        return np.full(cfg.episodes, cfg.skill)
    return np.random.default_rng(cfg.seed).uniform(cfg.skill_range[0], cfg.skill_range[1], cfg.episodes)


def open_writer(
    env,
    root: str | Path,
    episodes: int,
    repo_id: str = "",
    config: dict | None = None,
    image_writer_threads: int = 0,
    environment_state: bool = False,
) -> EpisodeWriter:
    """An `EpisodeWriter` at `root` for `env`'s (a `TabletopEnv`, possibly wrapped) embodiment, cameras and
    image size, with `environment_state` recording each cube's position as `observation.environment_state`;
    the dataset is named `repo_id`, or `local/<root's name>`."""
    base = env.unwrapped
    size = base.config.image_size
    return EpisodeWriter(
        root,
        repo_id or f"local/{Path(root).name}",
        base.embodiment.fps,
        base.embodiment.name,
        base.embodiment.joint_names,
        base.config.cameras,
        (size, size),
        episodes=episodes,
        config=config,
        image_writer_threads=image_writer_threads,
        environment_state_names=ENVIRONMENT_STATE_NAMES if environment_state else (),
    )


def record_episode(env, actor, writer: EpisodeWriter, seed: int, **facts) -> dict:
    """One episode of `actor` in `env` from `seed`, handed to `writer` frame by frame; returns its facts
    (those of `EpisodeWriter.end_episode`, `facts` added). When the writer records an environment state,
    each frame's is read from `env.unwrapped.environment_state()` at the frame's own time."""
    with_objects = bool(writer.environment_state_names)

    def observe(obs: dict) -> dict:
        return {**obs, ENVIRONMENT_STATE: env.unwrapped.environment_state()} if with_objects else obs

    obs, info = env.reset(seed=seed)
    obs = observe(obs)
    actor.reset(seed=seed)
    while True:
        action = actor.act()
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        writer.add_frame(obs, action, reward, bool(info["success"]), done, info["task"])
        obs = observe(next_obs)
        if done:
            return writer.end_episode(seed=seed, **facts)


def record_actor_episodes(
    env, actor, root: str | Path, seeds: Sequence[int], repo_id: str = "", environment_state: bool = False
) -> list[dict]:
    """One episode per seed of `actor` in `env` (a `TabletopEnv`, possibly wrapped) into a new dataset at
    `root` with the env's cameras and image size (and the cubes' positions with `environment_state`);
    returns per-episode seed, success and length."""
    with open_writer(env, root, len(seeds), repo_id, environment_state=environment_state) as writer:
        for seed in seeds:
            record_episode(env, actor, writer, int(seed))
    return writer.episodes


def record_demos(cfg: RecordingConfig) -> Path:
    """Record `cfg.episodes` scripted-expert episodes (or the `cfg.replay` ones) into a new dataset at
    `cfg.root`, after the episodes of `cfg.include` (the new ones are recorded apart, then merged); returns
    the root. An interruption keeps the episodes completed so far (in `cfg.root`, or in
    `recording_part(root)` with `include`). Replay files are read and checked before anything is written."""
    cfg.validate()
    replays = read_replays(cfg.replay, _action_dim(cfg)) if cfg.replay else []
    root = Path(cfg.root)
    prepare_root(root, cfg.overwrite)
    if not cfg.include:
        return _record_episodes(cfg, root, replays)
    part = recording_part(root)
    shutil.rmtree(part, ignore_errors=True)
    _record_episodes(cfg, part, replays)  # an interruption leaves its episodes there and merges nothing
    grow_dataset([*cfg.include, part], root, cfg.repo_id)
    shutil.move(part / RECORDING_META, root / RECORDING_META)
    shutil.rmtree(part)
    return root


def _action_dim(cfg: RecordingConfig) -> int:
    env = TabletopEnv(replace(cfg.env_config(), cameras=()))
    try:
        return env.action_space.shape[0]
    finally:
        env.close()


def read_replays(paths: Sequence[str | Path], action_dim: int) -> list[tuple[int, np.ndarray, str]]:
    """The episodes of `RecordingConfig.replay` files: (seed, actions [T, action_dim], file) each, in file
    order; a malformed line is an error naming its file and line."""
    episodes = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"RecordingConfig.replay: {path} does not exist")
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                seed, actions = int(record["seed"]), np.asarray(record["actions"], dtype=np.float32)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f'{path}, line {n}: expected {{"seed": int, "actions": [[...], ...]}} ({e})'
                ) from e
            if actions.ndim != 2 or len(actions) == 0 or actions.shape[1] != action_dim:
                raise ValueError(
                    f"{path}, line {n}: actions must be a non-empty [steps, {action_dim}] list (the arm's "
                    f"joint targets), got shape {list(actions.shape)}"
                )
            episodes.append((seed, actions, str(path)))
    if not episodes:
        raise ValueError(f"RecordingConfig.replay: no episodes in {list(paths)}")
    return episodes


class ActionReplay:
    """An actor (`record_episode`) that plays `actions` [T, A] step by step, then holds the last one."""

    def __init__(self) -> None:
        self.actions = np.zeros((1, 0), dtype=np.float32)
        self.step = 0

    def reset(self, seed: int | None = None) -> None:
        self.step = 0

    def act(self) -> np.ndarray:
        action = self.actions[min(self.step, len(self.actions) - 1)]
        self.step += 1
        return action


def _record_episodes(cfg: RecordingConfig, root: Path, replays: list[tuple[int, np.ndarray, str]]) -> Path:
    if cfg.task == "pusht":  # validate() keeps replays to the tabletop sim
        from worldloop.sim.pusht import record_pusht

        return record_pusht(cfg, root, episode_skills(cfg))
    env = TabletopEnv(cfg.env_config())
    try:
        episodes = len(replays) or cfg.episodes
        writer = open_writer(
            env, root, episodes, cfg.repo_id, asdict(cfg), cfg.image_writer_threads, cfg.environment_state
        )
        with writer:
            desc = f"{'replaying in' if replays else 'recording'} {cfg.task}"
            bar = tqdm(_tabletop_episodes(cfg, env, replays), desc=desc, unit="episode", total=episodes)
            for actor, seed, facts in bar:
                record_episode(env, actor, writer, seed, **facts)
                bar.set_postfix(success=f"{np.mean([e['success'] for e in writer.episodes]):.0%}")
    finally:
        env.close()
    return root


def _tabletop_episodes(cfg: RecordingConfig, env: TabletopEnv, replays: list[tuple[int, np.ndarray, str]]):
    """(actor, seed, facts for the recording's meta) of each episode to record: the replays' action lists,
    or the scripted expert at each episode's skill."""
    if replays:
        replay = ActionReplay()
        for seed, actions, path in replays:
            replay.actions = actions
            yield replay, seed, {"replay": path}
        return
    expert = ScriptedExpert(env)
    for i, skill in enumerate(episode_skills(cfg)):
        expert.config = ExpertConfig(skill=float(skill))
        expert.variant = i % cfg.variants  # 0 throughout without variants: every start taken once, as before
        facts = {"skill": float(skill), **({"variant": expert.variant} if cfg.variants > 1 else {})}
        yield expert, cfg.seed + i // cfg.variants, facts
