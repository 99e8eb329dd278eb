"""Normalisation statistics for `observation.state` and `action`, their stats.json, and a `Normalizer`.

stats.json maps a feature key to {"mean", "std", "min", "max", "q01", "q99": [D floats], "count": [1 int]},
plain JSON lists, the same field names as lerobot's meta/stats.json so either can be read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from worldloop.common.checkpoint import load_json, save_json
from worldloop.data.dataset import EpisodeDataset
from worldloop.data.features import ACTION, ENVIRONMENT_STATE, STATE

STAT_FIELDS = ("mean", "std", "min", "max", "q01", "q99")
NORMALIZED_KEYS = (STATE, ACTION)
NORM_MODES = ("mean_std", "min_max", "identity")
# Below this spread a dimension is treated as constant: it is centred but not scaled, so a value that
# never varied in the data cannot blow up to +-1e8 when it does vary at run time.
MIN_SPREAD = 1e-6

Stats = dict[str, dict[str, np.ndarray]]


def compute_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Per-dimension statistics of `values` [N, D] (float64 arithmetic, population std)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or len(values) == 0:
        raise ValueError(f"compute_stats expects a non-empty [N, D] array, got shape {values.shape}")
    return {
        "mean": values.mean(0),
        "std": values.std(0),
        "min": values.min(0),
        "max": values.max(0),
        "q01": np.quantile(values, 0.01, axis=0),
        "q99": np.quantile(values, 0.99, axis=0),
        "count": np.array([len(values)]),
    }


def dataset_stats(
    dataset: EpisodeDataset, episodes: list[int] | None = None, keys: tuple[str, ...] = NORMALIZED_KEYS
) -> Stats:
    """Stats of `keys` over the frames of `episodes` (all when None), computed from the data columns.

    Pass the training episodes so held-out data does not leak into normalisation. Reading the numeric
    columns takes no image decoding, so this is fast even for datasets that are never cached.
    """
    chosen = dataset.select_episodes(episodes)
    cols = dataset.numeric_columns(list(keys))
    rows = np.concatenate([np.arange(ep.start, ep.end) for ep in chosen])
    return {k: compute_stats(cols[k].reshape(len(cols[k]), -1)[rows]) for k in keys}


# stats.json key of the change of `observation.environment_state` from one frame to the next within an
# episode: derived, not a dataset feature (the world model's object-state head regresses it).
ENVIRONMENT_MOTION = ENVIRONMENT_STATE + ".motion"


def environment_state_stats(dataset: EpisodeDataset, episodes: list[int] | None = None) -> Stats:
    """Stats of `observation.environment_state` and of its frame-to-frame change (ENVIRONMENT_MOTION)
    over the frames of `episodes` (all when None)."""
    chosen = dataset.select_episodes(episodes)
    values = dataset.numeric_columns([ENVIRONMENT_STATE])[ENVIRONMENT_STATE]
    values = values.reshape(len(values), -1).astype(np.float64)
    rows = np.concatenate([np.arange(ep.start, ep.end) for ep in chosen])
    motion = np.concatenate([np.diff(values[ep.start : ep.end], axis=0) for ep in chosen if ep.length > 1])
    return {ENVIRONMENT_STATE: compute_stats(values[rows]), ENVIRONMENT_MOTION: compute_stats(motion)}


def save_stats(stats: Stats, path: str | Path) -> None:
    save_json({k: {f: np.asarray(v).tolist() for f, v in s.items()} for k, s in stats.items()}, path)


def load_stats(path: str | Path) -> Stats:
    """Read stats.json, checking every key has every field as a list of numbers of one length."""
    raw = load_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of feature key -> stats, got {type(raw).__name__}")
    stats: Stats = {}
    for key, fields in raw.items():
        if not isinstance(fields, dict):
            raise ValueError(f"{path}: {key!r} should map stat names to lists, got {type(fields).__name__}")
        missing = [f for f in STAT_FIELDS if f not in fields]
        if missing:
            raise ValueError(f"{path}: {key!r} lacks {missing} (expected {list(STAT_FIELDS)})")
        try:
            stats[key] = {f: np.asarray(v, dtype=np.float64).reshape(-1) for f, v in fields.items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {key!r} has a non-numeric stat: {e}") from e
        sizes = {f: len(stats[key][f]) for f in STAT_FIELDS}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{path}: {key!r} stats differ in length {sizes}")
        if not all(np.isfinite(stats[key][f]).all() for f in STAT_FIELDS):
            raise ValueError(f"{path}: {key!r} has a NaN or infinite stat")
    return stats


def _buffer_name(key: str, what: str) -> str:
    return f"{key.replace('.', '_')}__{what}"


class Normalizer(nn.Module):
    """Maps features to a normalised range and back, from fixed stats (buffers; nothing to train).

    mean_std: (x - mean) / std.   min_max: to [-1, 1] over [min, max].   identity: unchanged.
    Dimensions whose spread is below MIN_SPREAD are only centred. The buffers are part of `state_dict`,
    so a model holding a Normalizer saves and restores them with its weights.
    """

    def __init__(self, stats: Stats, modes: dict[str, str]):
        super().__init__()
        self.modes = dict(modes)
        for key, mode in self.modes.items():
            if mode not in NORM_MODES:
                raise ValueError(f"Normalizer: mode {mode!r} for {key!r} is not one of {NORM_MODES}")
            if mode == "identity":
                continue
            if key not in stats:
                raise ValueError(f"Normalizer: no stats for {key!r} (stats have {sorted(stats)})")
            s = {f: torch.as_tensor(np.asarray(v), dtype=torch.float32) for f, v in stats[key].items()}
            if mode == "mean_std":
                center, spread = s["mean"], s["std"]
            else:
                center, spread = (s["max"] + s["min"]) / 2, (s["max"] - s["min"]) / 2
            spread = torch.where(spread < MIN_SPREAD, torch.ones_like(spread), spread)
            self.register_buffer(_buffer_name(key, "center"), center.clone())
            self.register_buffer(_buffer_name(key, "scale"), spread.clone())

    def _params(self, key: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        if key not in self.modes:
            raise KeyError(f"Normalizer has no mode for {key!r} (it has {sorted(self.modes)})")
        if self.modes[key] == "identity":
            return None
        return getattr(self, _buffer_name(key, "center")), getattr(self, _buffer_name(key, "scale"))

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """`x` [..., D] with D the stats' size (broadcast over leading dims, e.g. [B, H, D] chunks)."""
        params = self._params(key)
        return x if params is None else (x - params[0]) / params[1]

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        params = self._params(key)
        return x if params is None else x * params[1] + params[0]
