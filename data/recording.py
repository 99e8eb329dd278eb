"""Record scripted-expert episodes from the tabletop sim into a local LeRobotDataset v3.

    python record_demos.py --config configs/record/tiny.yaml --episodes=200 --skill_range="[0.2, 1.0]"

Each frame holds the observation at time t, the action taken at t, and `next.*` (reward, success, done)
observed after that action. An interrupted recording (Ctrl-C, an error) still finalizes the dataset: the
episodes completed so far stay readable, the partial one is dropped. Per-episode facts that lerobot has no
column for (seed, expert skill, success, length) go to `meta/recording.json`, whose `complete` says whether
every requested episode was recorded (lerobot's `meta/info.json` exists from the first moment).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from datasets.utils import logging as hf_logging
from tqdm import tqdm

from worldloop.common.checkpoint import atomic_write_text
from worldloop.data.features import ACTION, DONE, REWARD, SUCCESS, TASK, lerobot_features
from worldloop.sim.experts import ExpertConfig, ScriptedExpert
from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig

logger = logging.getLogger(__name__)

RECORDING_META = "meta/recording.json"


@dataclass
class RecordingConfig:
    root: str = "outputs/datasets/tabletop_push"  # local dataset directory (must not exist unless overwrite)
    repo_id: str = "worldloop/tabletop_push"  # a name only; nothing is pushed to or pulled from the hub
    task: str = "push"  # reach | push
    episodes: int = 50
    skill: float = 1.0  # expert skill for every episode (see sim/experts.py)
    # If set, each episode's skill is drawn uniformly from [low, high] instead: a mixture of good and bad
    # behaviour, which is what the world model wants to learn dynamics from.
    skill_range: list[float] | None = None
    seed: int = 0  # episode i uses env seed `seed + i`
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

    def validate(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"RecordingConfig.episodes must be >= 1, got {self.episodes}")
        if not self.root:
            raise ValueError("RecordingConfig.root must name a local directory")
        if self.skill_range is not None:
            if len(self.skill_range) != 2 or not 0.0 <= self.skill_range[0] <= self.skill_range[1] <= 1.0:
                raise ValueError(
                    f"RecordingConfig.skill_range must be [low, high] with 0 <= low <= high <= 1, "
                    f"got {self.skill_range}"
                )
        ExpertConfig(skill=self.skill).validate()
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


def prepare_root(root: Path, overwrite: bool) -> None:
    if root.exists():
        if not overwrite:
            raise FileExistsError(
                f"dataset root {root} already exists; choose another --root or pass --overwrite=true to "
                "replace it"
            )
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)


def recording_part(root: Path) -> Path:
    """Where scripted episodes recorded after `include`d datasets are written before the merge into `root`."""
    return root.parent / f".{root.name}.part"


def policy_recording_parts(root: Path) -> Path:
    """Where `record_demos.py --policies` records each policy's episodes (`<k:03d>/`, one dataset per policy)
    before the merge into `root`."""
    return root.parent / f".{root.name}.parts"


def record_demos(cfg: RecordingConfig) -> Path:
    """Record `cfg.episodes` episodes into a new dataset at `cfg.root`, after the episodes of `cfg.include`
    (the new ones are recorded apart, then merged); returns the root."""
    cfg.validate()
    root = Path(cfg.root)
    prepare_root(root, cfg.overwrite)
    if not cfg.include:
        return _record_scripted(cfg, root)
    from worldloop.data.actor_recording import grow_dataset

    part = recording_part(root)
    shutil.rmtree(part, ignore_errors=True)
    _record_scripted(cfg, part)  # an interruption leaves its episodes there and merges nothing
    grow_dataset([*cfg.include, part], root, cfg.repo_id)
    shutil.move(part / RECORDING_META, root / RECORDING_META)
    shutil.rmtree(part)
    return root


def _record_scripted(cfg: RecordingConfig, root: Path) -> Path:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    env_cfg = cfg.env_config()
    env = TabletopEnv(env_cfg)
    dataset = LeRobotDataset.create(
        cfg.repo_id,
        fps=env.embodiment.fps,
        features=lerobot_features(env.embodiment.joint_names, tuple(cfg.cameras), (cfg.image_size,) * 2),
        root=root,
        robot_type=env.embodiment.name,
        use_videos=False,
        image_writer_threads=cfg.image_writer_threads,
    )
    expert = ScriptedExpert(env)
    episodes: list[dict] = []
    hf_bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one `datasets` bar per saved episode would bury ours
    try:
        bar = tqdm(episode_skills(cfg), desc=f"recording {cfg.task}", unit="episode")
        for i, skill in enumerate(bar):
            seed = cfg.seed + i
            expert.config = ExpertConfig(skill=float(skill))
            episodes.append(_record_episode(env, expert, dataset, seed) | {"skill": float(skill)})
            bar.set_postfix(success=f"{np.mean([e['success'] for e in episodes]):.0%}")
    finally:
        if dataset.episode_buffer is not None and dataset.episode_buffer["size"] > 0:
            dataset.clear_episode_buffer()  # the interrupted episode is incomplete: drop it
        dataset.finalize()
        dataset.stop_image_writer()
        env.close()
        if hf_bars_were_on:
            hf_logging.enable_progress_bar()
        atomic_write_text(
            root / RECORDING_META,
            json.dumps(
                {"config": asdict(cfg), "complete": len(episodes) == cfg.episodes, "episodes": episodes},
                indent=1,
            )
            + "\n",
        )
    return root


def _record_episode(env: TabletopEnv, expert: ScriptedExpert, dataset, seed: int) -> dict:
    obs, info = env.reset(seed=seed)
    expert.reset(seed=seed)
    steps, succeeded = 0, False
    while True:
        action = expert.act()
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        succeeded = succeeded or bool(info["success"])
        dataset.add_frame(
            {
                **obs,
                ACTION: action,
                REWARD: np.array([reward], dtype=np.float32),
                SUCCESS: np.array([info["success"]]),
                DONE: np.array([done]),
                TASK: info["task"],
            }
        )
        obs = next_obs
        steps += 1
        if done:
            break
    dataset.save_episode()
    return {
        "episode_index": dataset.meta.total_episodes - 1,
        "seed": seed,
        # Any step, not the last: an episode that does not end at success may succeed and move on.
        "success": succeeded,
        "length": steps,
    }
