"""The one writer of recorded episodes (scripted experts, policies in the sim, deployment runs) into a local
LeRobotDataset v3, and the growing of a dataset by appending others to it.

    with EpisodeWriter(root, repo_id, fps, robot_type, joint_names, cameras, (64, 64), episodes=2) as w:
        w.add_frame(observation, action, reward, success, done, task)   # ... every step
        w.end_episode(seed=0)                                           # ... every episode
    grow_dataset([base_root, root], out_root)                           # lerobot's aggregate_datasets

Each frame holds the observation at time t, the action taken at t, and `next.*` (reward, success, done)
observed after that action; failures are kept. The writer knows nothing of who acts: the sim's episode
loop (`sim.recording`) and the deployment runtime (`real_robot.recorder`) hand it frames.

Crash safety: closing the writer (leaving its `with` block, an exception included) drops an episode that
was not ended, finalizes the dataset so the episodes ended so far stay readable, and writes
`meta/recording.json` atomically. That file holds the per-episode facts lerobot has no column for
(episode index, seed, success at any step, length, and what the caller adds, e.g. the expert's skill) and
`complete`: whether every episode the recording was meant to hold was recorded (lerobot's
`meta/info.json` exists from the first moment).

Durable episodes (`durable=True`, for runs that a `kill -9`, an OOM kill or a power cut may end): every
`end_episode` leaves the dataset readable as it stands. It closes lerobot's parquet writers (a parquet
file is readable only once its footer is written) and sends the next episode to new files, as lerobot
does when it resumes a recording; `meta/recording.json` then lists the files of the saved episodes and a
copy of `meta/info.json` and `meta/stats.json`. A crash between two `end_episode`s loses only the
episode in progress. A crash inside one (while lerobot writes that episode) can leave a half-written
file; `repair_recording(root)` removes what the last completed `end_episode` did not list and restores
`info.json` and `stats.json`. The episodes must share one task (lerobot rewrites `meta/tasks.parquet`
when a new task appears, which is not restored).

Growing copies every source into a fresh dataset with lerobot's `aggregate_datasets` (episode indices
renumbered in order, tasks merged), so the result is an ordinary dataset anything can read; the sources
must agree on fps, robot type and features, which is checked first with an error naming the one that
differs.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from datasets.utils import logging as hf_logging

from worldloop.common.checkpoint import atomic_write_text
from worldloop.data.features import ACTION, DONE, REWARD, SUCCESS, TASK, lerobot_features

RECORDING_META = "meta/recording.json"
_PARQUET_DIRS = ("data", "meta/episodes")  # where lerobot writes an episode's parquet files


def write_recording_meta(root: str | Path, meta: dict) -> None:
    """Write `meta` to `<root>/meta/recording.json` atomically (a crash leaves the old file or the new)."""
    atomic_write_text(Path(root) / RECORDING_META, json.dumps(meta, indent=1) + "\n")


def prepare_root(root: Path, overwrite: bool) -> None:
    """Make way for a new dataset at `root`: an existing one is an error unless `overwrite` (then removed)."""
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


class EpisodeWriter:
    """Writes episodes, frame by frame, into a new LeRobotDataset at `root` (images stored as PNG frames).

    `episodes` is how many episodes the recording is meant to hold (`complete` in `meta/recording.json`;
    None: not known in advance, set `expected_episodes` before closing); `config`, if given, is stored
    there too. `durable`: each ended episode is readable on disk before `end_episode` returns (see the
    module docstring). Use it as a context manager, or call `close` in a `finally`.
    """

    def __init__(
        self,
        root: str | Path,
        repo_id: str,
        fps: int,
        robot_type: str,
        joint_names: Sequence[str],
        cameras: Sequence[str],
        image_size: tuple[int, int],
        episodes: int | None,
        config: dict | None = None,
        image_writer_threads: int = 0,
        durable: bool = False,
        environment_state_names: Sequence[str] = (),
    ):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        self.root = Path(root)
        if self.root.exists():
            raise FileExistsError(f"recording root {self.root} exists; each recording needs a new directory")
        self.expected_episodes, self.config = episodes, config
        self.durable = durable
        self._durable_state: dict | None = None  # what `repair_recording` restores (durable writers)
        # Non-empty: every frame's observation carries `observation.environment_state` of this many values.
        self.environment_state_names = tuple(environment_state_names)
        self.episodes: list[dict] = []  # the facts of every ended episode, as in meta/recording.json
        self._length, self._succeeded = 0, False
        self._dataset = LeRobotDataset.create(
            repo_id,
            fps=fps,
            features=lerobot_features(
                tuple(joint_names), tuple(cameras), tuple(image_size), self.environment_state_names
            ),
            root=self.root,
            robot_type=robot_type,
            use_videos=False,
            image_writer_threads=image_writer_threads,
        )
        self._hf_bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # one `datasets` bar per saved episode would bury the caller's

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_frame(
        self, observation: dict, action: np.ndarray, reward: float, success: bool, done: bool, task: str
    ) -> None:
        """One frame: `observation` (state and image keys) at t, the action taken at t, and the reward,
        success and done observed after it."""
        self._dataset.add_frame(
            {
                **observation,
                ACTION: np.asarray(action, dtype=np.float32),
                REWARD: np.array([reward], dtype=np.float32),
                SUCCESS: np.array([success]),
                DONE: np.array([done]),
                TASK: task,
            }
        )
        self._length += 1
        self._succeeded = self._succeeded or bool(success)

    def end_episode(self, seed: int | None = None, **facts) -> dict:
        """Save the frames added since the last episode as one episode; returns its facts (episode index,
        `seed` if given, success, length, then `facts`), also kept for `meta/recording.json`."""
        if self._length == 0:
            raise ValueError(f"recording {self.root}: an episode needs at least one frame")
        with warnings.catch_warnings():
            # LeRobot's episode stats histogram our bool success / done columns after casting them to uint8, and
            # say so once per column and process: harmless, and it floods the progress bar.
            warnings.filterwarnings("ignore", "Converting input from bool", RuntimeWarning)
            self._dataset.save_episode()
        episode = {"episode_index": self._dataset.meta.total_episodes - 1}
        if seed is not None:
            episode["seed"] = seed
        # Any step, not the last: an episode that does not end at success may succeed and move on.
        episode |= {"success": self._succeeded, "length": self._length, **facts}
        self.episodes.append(episode)
        self._length, self._succeeded = 0, False
        if self.durable:
            self._make_durable()
        return episode

    def _make_durable(self) -> None:
        """Close the parquet files (their footers make them readable), start new ones for the next
        episode, and record what is now on disk for `repair_recording`."""
        dataset = self._dataset
        data_ref, meta_ref = dataset.latest_episode, dataset.meta.latest_episode
        dataset.finalize()
        # lerobot's resume path: with no latest episode in memory, the next episode goes to new files after
        # those of `meta.episodes[-1]` (writing to the closed files would truncate them). That path reads
        # only the last entry's file indices and frame count, so they are given instead of re-reading
        # every episode from disk (seconds per save once there are a few).
        dataset.meta.episodes = [
            {
                "dataset_to_index": int(meta_ref["dataset_to_index"][0]),
                "meta/episodes/chunk_index": int(meta_ref["meta/episodes/chunk_index"][0]),
                "meta/episodes/file_index": int(meta_ref["meta/episodes/file_index"][0]),
                "data/chunk_index": int(data_ref["data/chunk_index"]),
                "data/file_index": int(data_ref["data/file_index"]),
            }
        ]
        dataset.latest_episode, dataset.meta.latest_episode = None, None
        files = sorted(
            str(f.relative_to(self.root))
            for d in _PARQUET_DIRS
            for f in (self.root / d).rglob("*")
            if f.is_file()
        )
        meta = self.root / "meta"
        self._durable_state = {
            "files": files,
            "info": json.loads((meta / "info.json").read_text()),
            "stats": json.loads((meta / "stats.json").read_text()),
        }
        self._write_meta()

    def close(self) -> None:
        """Drop an episode that was not ended, finalize the dataset and write `meta/recording.json`."""
        dataset = self._dataset
        try:
            if dataset.episode_buffer is not None and dataset.episode_buffer["size"] > 0:
                dataset.clear_episode_buffer()  # the interrupted episode is incomplete: drop it
            dataset.finalize()
            dataset.stop_image_writer()
        finally:
            if self._hf_bars_were_on:
                hf_logging.enable_progress_bar()
            self._write_meta()

    def _write_meta(self) -> None:
        meta = {} if self.config is None else {"config": self.config}
        meta |= {"complete": len(self.episodes) == self.expected_episodes, "episodes": self.episodes}
        if self._durable_state is not None:
            meta["durable"] = self._durable_state
        write_recording_meta(self.root, meta)


def repair_recording(root: str | Path) -> list[str]:
    """Make a durable recording that a crash interrupted readable: remove the parquet files the last
    completed `end_episode` did not list and restore its `meta/info.json` and `meta/stats.json`. Returns
    the removed files; a recording that needs no repair is left as it is."""
    root = Path(root)
    path = root / RECORDING_META
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no {RECORDING_META}; not a recording made by EpisodeWriter")
    durable = json.loads(path.read_text()).get("durable")
    if durable is None:
        raise ValueError(f"{root}: {RECORDING_META} lists no saved episode of a durable recording to restore")
    kept = set(durable["files"])
    removed = sorted(
        str(f.relative_to(root))
        for d in _PARQUET_DIRS
        for f in (root / d).rglob("*")
        if f.is_file() and str(f.relative_to(root)) not in kept
    )
    for name in removed:
        (root / name).unlink()
    for name in ("info", "stats"):
        atomic_write_text(root / "meta" / f"{name}.json", json.dumps(durable[name], indent=4) + "\n")
    return removed


def check_compatible(roots: Sequence[str | Path]) -> None:
    """Raise naming the first dataset whose fps, robot type or features differ from the first one's."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    metas = [LeRobotDatasetMetadata(f"local/{Path(r).name}", root=r) for r in roots]
    first = metas[0]
    for root, meta in zip(roots[1:], metas[1:]):
        for name in ("fps", "robot_type"):
            if getattr(meta, name) != getattr(first, name):
                raise ValueError(
                    f"dataset {root}: {name}={getattr(meta, name)!r} differs from {roots[0]}'s "
                    f"{getattr(first, name)!r}; datasets must agree to be grown into one"
                )
        keys = set(meta.features) | set(first.features)
        differing = sorted(k for k in keys if meta.features.get(k) != first.features.get(k))
        if differing:
            k = differing[0]
            raise ValueError(
                f"dataset {root}: feature {k!r} is {meta.features.get(k)} but {first.features.get(k)} in "
                f"{roots[0]} ({len(differing)} features differ); record with the same cameras and image size"
            )


def grow_dataset(roots: Sequence[str | Path], out_root: str | Path, repo_id: str = "") -> Path:
    """A new dataset at `out_root` holding every episode of `roots`, in order; returns `out_root`."""
    from lerobot.datasets.aggregate import aggregate_datasets

    out_root = Path(out_root)
    if out_root.exists():
        raise FileExistsError(f"dataset root {out_root} exists; growing writes a new dataset")
    if not roots:
        raise ValueError("grow_dataset needs at least one source dataset")
    check_compatible(roots)
    aggregate_datasets(
        repo_ids=[f"local/{Path(r).name}" for r in roots],
        aggr_repo_id=repo_id or f"local/{out_root.name}",
        roots=[Path(r) for r in roots],
        aggr_root=out_root,
    )
    return out_root
