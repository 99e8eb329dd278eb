"""Open a LeRobotDataset v3 from a local root, check it has what worldloop trains on, and read it fast.

    dataset = EpisodeDataset(DatasetConfig(root="outputs/data/push", cameras=["front"]))
    train_eps, held_out_eps = dataset.split()
    table = dataset.frame_table()          # every frame decoded once into memory (uint8 images)

Everything goes through lerobot's own dataset object (`LeRobotDataset`, its `meta` and `hf_dataset`), so
any dataset lerobot can read (ours, or a converted public one) works, and the on-disk format stays
lerobot's business. Nothing here touches the network: a root that is not a complete dataset on disk is an
error, not a download.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldloop.data.features import (
    ACTION,
    DONE,
    ENVIRONMENT_STATE,
    IMAGE_PREFIX,
    REWARD,
    STATE,
    SUCCESS,
    camera_of,
    image_key,
)
from worldloop.data.images import check_resize_mode, resize_frames

# Files lerobot would otherwise try to download from the hub when they are missing.
_REQUIRED_META_FILES = ("meta/info.json", "meta/tasks.parquet", "meta/episodes")
_FLOAT_DTYPES = ("float32", "float64", "float16")
_DECODE_ROWS = 128  # image rows (or video frames) decoded per step when filling the cache


class DatasetError(ValueError):
    """A dataset on disk that does not have the features or shapes worldloop needs."""


@dataclass
class DatasetConfig:
    root: str = ""  # local LeRobotDataset v3 directory (the one holding meta/ and data/)
    repo_id: str = ""  # a name only (never fetched); "" -> "local/<root folder name>"
    cameras: list[str] = field(default_factory=list)  # [] -> the dataset's first camera
    image_size: list[int] = field(default_factory=list)  # [H, W] frames are served at; [] -> the cameras' own
    # How a camera of another size than image_size gets there: "" (an error), "crop" (centre-crop to
    # image_size's aspect ratio, then resize) or "stretch" (resize only). See data/images.py.
    resize: str = ""
    state_dim: int = 0  # required size of observation.state; 0 -> any
    action_dim: int = 0  # required size of action; 0 -> any
    require_rewards: bool = False  # False: missing next.reward/success/done are filled (see FrameTable)
    held_out_fraction: float = 0.1  # share of episodes kept out of training (see split_episodes)
    split_seed: int = 0
    video_backend: str = ""  # "" -> lerobot's default (torchcodec when installed, else pyav)


@dataclass(frozen=True)
class Episode:
    index: int  # episode_index in the dataset
    start: int  # absolute frame index of the first frame (lerobot's dataset_from_index)
    end: int  # one past the last frame (dataset_to_index)
    tasks: tuple[str, ...]

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class FrameTable:
    """Every frame of a dataset as in-memory tensors; row r is the frame with absolute index r.

    Missing reward features are filled: reward 0, success False, done True on each episode's last frame.
    """

    images: dict[str, torch.Tensor]  # camera -> uint8 [N, 3, H, W]
    state: torch.Tensor  # float32 [N, S]
    action: torch.Tensor  # float32 [N, A]
    reward: torch.Tensor  # float32 [N]
    success: torch.Tensor  # bool [N]
    done: torch.Tensor  # bool [N]
    episode_index: torch.Tensor  # int64 [N]
    frame_index: torch.Tensor  # int64 [N]
    task: list[str]  # [N]
    environment_state: torch.Tensor | None = None  # float32 [N, E]: the objects' state, where recorded

    def __len__(self) -> int:
        return self.state.shape[0]


def split_episodes(episodes: list[int], held_out_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded train / held-out split of episode indices.

    Episodes are ranked by a hash of (seed, episode index) and the lowest-ranked ones are held out. An
    episode's rank does not depend on the other episodes, so when the closed loop appends episodes to a
    dataset, episodes that were in training mostly stay in training (no leak into the held-out set).
    At least one episode is held out when the fraction is positive and there are two or more episodes.
    """
    if not 0.0 <= held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction}")
    n_held = int(round(held_out_fraction * len(episodes)))
    if held_out_fraction > 0 and len(episodes) >= 2:
        n_held = min(max(n_held, 1), len(episodes) - 1)

    def rank(ep: int) -> bytes:
        return hashlib.sha256(f"{seed}:{ep}".encode()).digest()

    held = set(sorted(episodes, key=rank)[:n_held])
    return [e for e in episodes if e not in held], [e for e in episodes if e in held]


def _image_hw(root: Path, key: str, feature: dict) -> tuple[int, int]:
    shape = tuple(feature.get("shape", ()))
    names = feature.get("names") or []
    if len(shape) != 3:
        raise DatasetError(f"dataset {root}: feature {key!r} has shape {shape}, expected (H, W, 3)")
    # lerobot writes (H, W, C); some converted datasets declare (C, H, W) and say so in `names`.
    h, w, c = shape[1:] + shape[:1] if names and names[0] in ("channel", "channels") else shape
    if c != 3:
        raise DatasetError(f"dataset {root}: feature {key!r} has {c} channels, expected 3 (RGB)")
    return int(h), int(w)


def _vector_dim(root: Path, key: str, feature: dict | None, expected: int) -> int:
    if feature is None:
        raise DatasetError(f"dataset {root}: required feature {key!r} is missing")
    shape = tuple(feature.get("shape", ()))
    if feature.get("dtype") not in _FLOAT_DTYPES or len(shape) != 1:
        raise DatasetError(
            f"dataset {root}: feature {key!r} is {feature.get('dtype')} of shape {shape}, "
            "expected a float vector of shape (D,)"
        )
    if expected and shape[0] != expected:
        field_name = "state_dim" if key == STATE else "action_dim"
        raise DatasetError(
            f"dataset {root}: feature {key!r} has size {shape[0]}, expected {expected} (DatasetConfig."
            f"{field_name}, which the trainers set from the model config: build the model for size {shape[0]})"
        )
    return int(shape[0])


class EpisodeDataset:
    """A validated local LeRobotDataset: chosen cameras, state/action sizes, episodes and a cached reader."""

    def __init__(self, cfg: DatasetConfig):
        if not cfg.root:
            raise DatasetError("DatasetConfig.root is empty: give the local directory of a LeRobotDataset")
        self.cfg = cfg
        self.root = Path(cfg.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"dataset root {self.root} does not exist")
        for rel in _REQUIRED_META_FILES:
            if not (self.root / rel).exists():
                raise FileNotFoundError(
                    f"dataset root {self.root} is not a LeRobotDataset v3: {rel} is missing"
                )
        self.repo_id = cfg.repo_id or f"local/{self.root.resolve().name}"
        self.meta = self._read_metadata()
        self.fps = int(self.meta.fps)
        self._check_features(self.meta.features)
        eps = self.meta.episodes
        self.episodes: dict[int, Episode] = {
            int(i): Episode(int(i), int(a), int(b), tuple(t))
            for i, a, b, t in zip(
                eps["episode_index"], eps["dataset_from_index"], eps["dataset_to_index"], eps["tasks"]
            )
        }
        # Features are checked before lerobot reads data/: its own errors on a mismatch are about arrow
        # schemas, not about which feature is wrong.
        self.lerobot = self._open_lerobot()
        self._table: FrameTable | None = None

    def _check_features(self, features: dict[str, dict]) -> None:
        cfg = self.cfg

        available = [camera_of(k) for k in features if k.startswith(IMAGE_PREFIX)]
        if not available:
            other = [k for k, f in features.items() if f.get("dtype") in ("image", "video")]
            raise DatasetError(
                f"dataset {self.root}: no camera features named {IMAGE_PREFIX}<camera>"
                + (f"; its image features {other} need renaming to that form" if other else "")
            )
        self.cameras: list[str] = list(cfg.cameras) or available[:1]
        for cam in self.cameras:
            if cam not in available:
                raise DatasetError(
                    f"dataset {self.root}: camera {cam!r} not found (feature {image_key(cam)!r} is missing); "
                    f"cameras in this dataset: {available}"
                )
        # The size each camera is stored at; frames are served at self.image_size.
        self.source_sizes = {
            cam: _image_hw(self.root, image_key(cam), features[image_key(cam)]) for cam in self.cameras
        }
        self.image_size: tuple[int, int] = self._served_size(self.source_sizes)
        self.state_dim = _vector_dim(self.root, STATE, features.get(STATE), cfg.state_dim)
        self.action_dim = _vector_dim(self.root, ACTION, features.get(ACTION), cfg.action_dim)
        missing_rewards = [k for k in (REWARD, SUCCESS, DONE) if k not in features]
        if cfg.require_rewards and missing_rewards:
            raise DatasetError(f"dataset {self.root}: required features {missing_rewards} are missing")
        self.reward_keys = [k for k in (REWARD, SUCCESS, DONE) if k in features]
        # [observation.environment_state] where the dataset records the objects' state, else []; its size (0: none)
        self.object_keys = [ENVIRONMENT_STATE] if ENVIRONMENT_STATE in features else []
        self.environment_state_dim = (
            _vector_dim(self.root, ENVIRONMENT_STATE, features[ENVIRONMENT_STATE], 0)
            if self.object_keys
            else 0
        )

    def _served_size(self, sizes: dict[str, tuple[int, int]]) -> tuple[int, int]:
        cfg = self.cfg
        try:
            check_resize_mode(cfg.resize)
        except ValueError as e:
            raise DatasetError(str(e)) from e
        if cfg.image_size and (len(cfg.image_size) != 2 or min(cfg.image_size) < 1):
            raise DatasetError(f"DatasetConfig.image_size must be [H, W] (positive), got {cfg.image_size}")
        if not cfg.image_size:
            if len(set(sizes.values())) > 1:
                raise DatasetError(
                    f"dataset {self.root}: chosen cameras differ in size {sizes}; pick same-size ones or "
                    "set dataset.image_size and dataset.resize (crop | stretch)"
                )
            return next(iter(sizes.values()))
        target = (int(cfg.image_size[0]), int(cfg.image_size[1]))
        for cam, hw in sizes.items():
            if hw != target and not cfg.resize:
                raise DatasetError(
                    f"dataset {self.root}: camera {cam!r} is {hw[0]}x{hw[1]}, expected {target[0]}x{target[1]} "
                    f"(DatasetConfig.image_size, the model's size; feature {image_key(cam)!r}): set "
                    "dataset.resize=crop (keeps the aspect ratio) or dataset.resize=stretch to resize it"
                )
        return target

    def _read_metadata(self):
        """lerobot's metadata object, after checking every file it points to is on disk."""
        from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

        try:
            meta = LeRobotDatasetMetadata(self.repo_id, root=self.root)
        except Exception as e:  # lerobot's own errors do not say which directory they were about
            raise DatasetError(f"dataset {self.root}: lerobot could not read its metadata: {e}") from e
        for ep in range(meta.total_episodes):
            paths = [meta.get_data_file_path(ep)] + [meta.get_video_file_path(ep, k) for k in meta.video_keys]
            for rel in paths:
                if not (self.root / rel).is_file():
                    raise FileNotFoundError(f"dataset root {self.root}: {rel} (episode {ep}) is missing")
        return meta

    def _open_lerobot(self, delta_timestamps: dict[str, list[float]] | None = None):
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        try:
            return LeRobotDataset(
                self.repo_id,
                root=self.root,
                delta_timestamps=delta_timestamps,
                video_backend=self.cfg.video_backend or None,
                download_videos=False,
            )
        except Exception as e:  # lerobot's own errors do not say which directory they were about
            raise DatasetError(f"dataset {self.root}: lerobot could not open it: {e}") from e

    def lerobot_with_deltas(self, delta_timestamps: dict[str, list[float]]):
        """A second LeRobotDataset on the same root whose items carry `delta_timestamps` windows."""
        return self._open_lerobot(delta_timestamps)

    @property
    def episode_indices(self) -> list[int]:
        return sorted(self.episodes)

    def split(self) -> tuple[list[int], list[int]]:
        return split_episodes(self.episode_indices, self.cfg.held_out_fraction, self.cfg.split_seed)

    def select_episodes(self, episodes: list[int] | None) -> list[Episode]:
        """The `Episode`s with these indices (all when None), or an error naming the unknown ones."""
        if episodes is None:
            return [self.episodes[i] for i in self.episode_indices]
        unknown = sorted(set(episodes) - set(self.episodes))
        if unknown:
            raise DatasetError(
                f"dataset {self.root}: no episodes {unknown[:10]} (it has {len(self.episodes)}, "
                f"indices {self.episode_indices[0]}..{self.episode_indices[-1]})"
            )
        return [self.episodes[i] for i in episodes]

    def numeric_columns(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Non-image columns of every frame (plus `index`, `episode_index`) as numpy arrays.

        Row r is the frame with absolute index r: lerobot itself reads windows that way, so a dataset
        whose rows are stored in another order is rejected here rather than read wrongly later."""
        cols = list(dict.fromkeys(["index", "episode_index", *keys]))
        hf = self.lerobot.hf_dataset.select_columns(cols).with_format("numpy")
        data = {k: np.asarray(v) for k, v in hf[:].items()}
        n = len(data["index"])
        if n != self.meta.total_frames or not np.array_equal(data["index"].reshape(n), np.arange(n)):
            raise DatasetError(
                f"dataset {self.root}: data/ rows are not frames 0..{self.meta.total_frames - 1} in order "
                f"({n} rows); lerobot requires row r to hold the frame with index r"
            )
        return data

    def frame_table(self) -> FrameTable:
        """All episodes decoded once into memory (built on first call, then shared)."""
        if self._table is None:
            self._table = self._build_table()
        return self._table

    def _build_table(self) -> FrameTable:
        cols = self.numeric_columns(
            [STATE, ACTION, "frame_index", "timestamp", "task_index", *self.reward_keys, *self.object_keys]
        )
        n = len(cols["index"])
        state = torch.from_numpy(cols[STATE].astype(np.float32).reshape(n, -1))
        action = torch.from_numpy(cols[ACTION].astype(np.float32).reshape(n, -1))
        for key, t, dim in ((STATE, state, self.state_dim), (ACTION, action, self.action_dim)):
            if t.shape[1] != dim:
                raise DatasetError(
                    f"dataset {self.root}: {key!r} rows have size {t.shape[1]}, info says {dim}"
                )
        for ep, info in self.episodes.items():
            in_data = np.flatnonzero(cols["episode_index"].reshape(n) == ep)
            if len(in_data) != info.length or (len(in_data) and in_data[0] != info.start):
                raise DatasetError(
                    f"dataset {self.root}: episode {ep} has {len(in_data)} frames in data/ starting at "
                    f"{in_data[:1].tolist()}, meta/episodes says {info.length} starting at {info.start}"
                )
        rows = {ep: (info.start, info.end) for ep, info in self.episodes.items()}
        last_frame = torch.zeros(n, dtype=torch.bool)
        last_frame[[b - 1 for _, b in rows.values()]] = True
        task_of = dict(zip(self.meta.tasks["task_index"].tolist(), self.meta.tasks.index.tolist()))
        return FrameTable(
            images={cam: self._decode_camera(cam, cols, rows) for cam in self.cameras},
            state=state,
            action=action,
            reward=self._column(cols, REWARD, torch.zeros(n), torch.float32),
            success=self._column(cols, SUCCESS, torch.zeros(n, dtype=torch.bool), torch.bool),
            done=self._column(cols, DONE, last_frame, torch.bool),
            episode_index=torch.from_numpy(cols["episode_index"].astype(np.int64).reshape(n)),
            frame_index=torch.from_numpy(cols["frame_index"].astype(np.int64).reshape(n)),
            task=[task_of[int(i)] for i in cols["task_index"].reshape(n)],
            environment_state=(
                torch.from_numpy(cols[ENVIRONMENT_STATE].astype(np.float32).reshape(n, -1))
                if self.object_keys
                else None
            ),
        )

    def _column(self, cols: dict, key: str, default: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if key not in cols:
            return default
        values = torch.from_numpy(np.asarray(cols[key]).reshape(len(default), -1))
        if values.shape[1] != 1:
            raise DatasetError(
                f"dataset {self.root}: {key!r} has {values.shape[1]} values per frame, expected 1"
            )
        return values[:, 0].to(dtype)

    def _decode_camera(self, cam: str, cols: dict, rows: dict[int, tuple[int, int]]) -> torch.Tensor:
        key = image_key(cam)
        out = torch.empty((len(cols["index"]), 3, *self.image_size), dtype=torch.uint8)
        if key in self.meta.video_keys:
            self._decode_video(cam, cols["timestamp"].reshape(-1), rows, out)
            return out
        h, w = self.source_sizes[cam]
        hf = self.lerobot.hf_dataset.select_columns([key]).with_format("numpy")
        for a in tqdm(range(0, len(hf), _DECODE_ROWS), desc=f"decoding {key}", leave=False):
            images = hf[a : a + _DECODE_ROWS][key]
            shapes = {img.shape for img in images}
            if shapes != {(h, w, 3)}:
                raise DatasetError(
                    f"dataset {self.root}: {key!r} frames are {shapes}, expected ({h}, {w}, 3) "
                    "(the shape meta/info.json declares)"
                )
            frames = torch.from_numpy(np.stack(list(images))).permute(0, 3, 1, 2)
            out[a : a + len(images)] = self.resize(frames)
        return out

    def resize(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames [..., 3, H, W] read from this dataset (uint8 or float) at the served `image_size`."""
        return resize_frames(frames, self.image_size, self.cfg.resize)

    def _decode_video(self, cam: str, timestamps: np.ndarray, rows: dict, out: torch.Tensor) -> None:
        from lerobot.datasets.video_utils import decode_video_frames

        key = image_key(cam)
        source = (3, *self.source_sizes[cam])
        for ep, (a, b) in tqdm(rows.items(), desc=f"decoding {key}", leave=False):
            # An episode's frames sit in a shared mp4 starting at from_timestamp (lerobot v3 layout).
            offset = float(self.meta.episodes[ep][f"videos/{key}/from_timestamp"])
            path = self.root / self.meta.get_video_file_path(ep, key)
            # In slices: a long episode of 480x640 float frames would not fit in memory at once.
            for s in range(a, b, _DECODE_ROWS):
                e = min(s + _DECODE_ROWS, b)
                frames = decode_video_frames(
                    path,
                    [offset + float(t) for t in timestamps[s:e]],
                    self.lerobot.tolerance_s,
                    self.lerobot.video_backend,
                )
                if tuple(frames.shape) != (e - s, *source):
                    raise DatasetError(
                        f"dataset {self.root}: {key!r} episode {ep} ({path}) decoded to "
                        f"{tuple(frames.shape)}, expected {(e - s, *source)} (the shape meta/info.json declares)"
                    )
                out[s:e] = (self.resize(frames) * 255).round().to(torch.uint8)
