"""Normalisation stats against numpy, stats.json round trip and errors, Normalizer round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import SHARED_LENGTHS, pattern_action, pattern_state

from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import ACTION, STATE
from worldloop.data.stats import (
    Normalizer,
    compute_stats,
    dataset_stats,
    load_stats,
    save_stats,
)

LENGTHS = SHARED_LENGTHS


@pytest.fixture(scope="module")
def dataset(shared_tiny_dataset_root):
    return EpisodeDataset(DatasetConfig(root=str(shared_tiny_dataset_root)))


def _numpy_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "mean": values.mean(0),
        "std": values.std(0),
        "min": values.min(0),
        "max": values.max(0),
        "q01": np.percentile(values, 1, axis=0),
        "q99": np.percentile(values, 99, axis=0),
    }


@pytest.mark.parametrize("episodes", [None, [0, 2]])
def test_dataset_stats_match_numpy(dataset, episodes):
    stats = dataset_stats(dataset, episodes)
    chosen = episodes if episodes is not None else range(len(LENGTHS))
    for key, pattern in ((STATE, pattern_state), (ACTION, pattern_action)):
        values = np.stack([pattern(e, f) for e in chosen for f in range(LENGTHS[e])]).astype(np.float64)
        for field, expected in _numpy_stats(values).items():
            np.testing.assert_allclose(stats[key][field], expected, rtol=1e-6, err_msg=f"{key} {field}")
        assert int(stats[key]["count"][0]) == len(values)


def test_stats_agree_with_lerobots_meta_stats_on_moments(dataset):
    ours, theirs = dataset_stats(dataset), dataset.meta.stats  # lerobot's, in meta/stats.json
    for key in (STATE, ACTION):
        for field in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(np.ravel(theirs[key][field]), ours[key][field], rtol=1e-5, atol=1e-6)


def test_stats_json_round_trip(dataset, tmp_path):
    stats = dataset_stats(dataset)
    save_stats(stats, tmp_path / "stats.json")
    raw = json.loads((tmp_path / "stats.json").read_text())
    assert isinstance(raw[ACTION]["mean"], list) and len(raw[ACTION]["mean"]) == 4  # plain JSON lists
    loaded = load_stats(tmp_path / "stats.json")
    for key in stats:
        for field in stats[key]:
            np.testing.assert_array_equal(loaded[key][field], stats[key][field])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"action": {"mean": [0.0]}}, r"'action' lacks \['std', 'min', 'max', 'q01', 'q99'\]"),
        ({"action": dict.fromkeys(["mean", "std", "min", "max", "q01"], [0.0]) | {"q99": [0, 1]}}, "differ"),
        ({"action": dict.fromkeys(["mean", "std", "min", "max", "q01", "q99"], ["a"])}, "non-numeric"),
        ({"action": dict.fromkeys(["mean", "std", "min", "max", "q01", "q99"], [float("nan")])}, "NaN"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_stats_json_names_file_and_key(tmp_path, content, message):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message) as err:
        load_stats(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("mode", ["mean_std", "min_max"])
def test_normalizer_round_trip_and_range(mode):
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, size=(500, 4)) * np.array([1, 10, 0.1, 1])
    values[:, 3] = 1.5  # a constant dimension: std and range are zero
    norm = Normalizer({ACTION: compute_stats(values)}, {ACTION: mode})
    x = torch.from_numpy(values).float()
    y = norm.normalize(ACTION, x)
    assert torch.isfinite(y).all()
    assert torch.allclose(y[:, 3], torch.zeros(500))  # constant dims are centred, not divided by ~0
    if mode == "mean_std":
        assert torch.allclose(y[:, :3].mean(0), torch.zeros(3), atol=1e-5)
        assert torch.allclose(y[:, :3].std(0, unbiased=False), torch.ones(3), atol=1e-4)
    else:
        assert torch.allclose(y[:, :3].min(0).values, -torch.ones(3), atol=1e-5)
        assert torch.allclose(y[:, :3].max(0).values, torch.ones(3), atol=1e-5)
    assert torch.allclose(norm.unnormalize(ACTION, y), x, atol=1e-4)
    chunk = x[:6].reshape(2, 3, 4)  # [B, H, A] action chunks broadcast over leading dims
    assert torch.allclose(norm.normalize(ACTION, chunk), y[:6].reshape(2, 3, 4))


def test_normalizer_buffers_travel_with_state_dict_and_batches():
    stats = {STATE: compute_stats(np.array([[0.0, 2.0], [2.0, 6.0]])), ACTION: compute_stats(np.ones((3, 1)))}
    norm = Normalizer(stats, {STATE: "mean_std", ACTION: "identity"})
    fresh = Normalizer({STATE: compute_stats(np.zeros((2, 2)))}, {STATE: "mean_std", ACTION: "identity"})
    fresh.load_state_dict(norm.state_dict())
    assert torch.allclose(fresh.normalize(STATE, torch.tensor([[1.0, 4.0]])), torch.zeros(1, 2))
    assert torch.equal(fresh.normalize(ACTION, torch.tensor([[5.0]])), torch.tensor([[5.0]]))
    with pytest.raises(KeyError, match="no mode for 'next.reward'"):
        norm.normalize("next.reward", torch.zeros(1))
    with pytest.raises(ValueError, match="no stats for 'action'"):
        Normalizer({}, {ACTION: "min_max"})
    with pytest.raises(ValueError, match="'zscore'"):
        Normalizer(stats, {ACTION: "zscore"})
