"""The success threshold calibrated on open-loop replays of held-out episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.world_model import success_calibration
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.success_calibration import (
    balanced_accuracy,
    bootstrap_picks,
    calibrate_success_threshold,
    replay_max_success,
)


def test_balanced_accuracy_weighs_both_outcomes_equally():
    actual = np.array([True, False, False, False])
    assert balanced_accuracy(np.array([False] * 4), actual) == 0.5  # all "failure": right 3 of 4, yet chance
    assert balanced_accuracy(actual.copy(), actual) == 1.0
    assert balanced_accuracy(np.array([True, True, False, False]), actual) == pytest.approx(0.5 * (1 + 2 / 3))


def test_threshold_is_the_best_candidate_and_ties_go_low(monkeypatch):
    # max probabilities: successes at 0.97 and 0.92, failures at 0.91 and 0.60 -> only > 0.91 separates
    fake = (np.array([0.97, 0.92, 0.91, 0.60]), np.array([True, True, False, False]))
    monkeypatch.setattr(success_calibration, "replay_max_success", lambda *a, **k: fake)
    report = calibrate_success_threshold(None, None, [0, 1, 2, 3], candidates=(0.5, 0.8, 0.915, 0.95))
    assert report["threshold"] == 0.915
    assert [r["balanced_accuracy"] for r in report["candidates"]] == [0.5, 0.75, 1.0, 0.75]
    assert sum(report["bootstrap_picks"].values()) == pytest.approx(1.0)
    fake = (np.array([0.97, 0.6]), np.array([True, False]))
    monkeypatch.setattr(success_calibration, "replay_max_success", lambda *a, **k: fake)
    assert calibrate_success_threshold(None, None, [0, 1], candidates=(0.5, 0.7, 0.9))["threshold"] == 0.7
    monkeypatch.setattr(success_calibration, "replay_max_success", lambda *a, **k: (fake[0], fake[1] | True))
    with pytest.raises(ValueError, match="all successes"):
        calibrate_success_threshold(None, type("D", (), {"root": "data"})(), [0, 1])


def test_bootstrap_picks_are_firm_for_a_clear_separation_and_split_for_a_flat_one():
    rng = np.random.default_rng(0)
    recorded = rng.random(200) < 0.5
    # successes peak at 0.97, failures at 0.6: every resample picks the lowest separating candidate, 0.7
    clear = np.where(recorded, 0.97, 0.6)
    picks = bootstrap_picks(clear, recorded, (0.5, 0.7, 0.9), resamples=200)
    assert picks == {"0.5": 0.0, "0.7": 1.0, "0.9": 0.0}
    # two thresholds err on different episodes, equally often on the whole: the resamples split between them
    flat = np.where(recorded, 0.97, 0.6)
    flat[np.flatnonzero(recorded)[:10]] = 0.8  # successes that only 0.7 catches
    flat[np.flatnonzero(~recorded)[:10]] = 0.85  # failures that only 0.9 rejects
    picks = bootstrap_picks(flat, recorded, (0.7, 0.9), resamples=400)
    assert sum(picks.values()) == pytest.approx(1.0)
    assert 0.2 < picks["0.7"] < 0.8 and 0.2 < picks["0.9"] < 0.8
    assert bootstrap_picks(flat, recorded, (0.7, 0.9), resamples=400) == picks  # seeded


def test_replay_reads_every_episode_and_its_recorded_outcome(tiny_lerobot_dataset, tmp_path):
    root = tiny_lerobot_dataset(tmp_path, episodes=4, length=[5, 6, 5, 6], cameras=("front",))
    dataset = EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"], image_size=[16, 16]))
    dit = VideoDiTConfig(image_size=16, patch_size=4, width=32, depth=1, heads=2, context_frames=2)
    torch.manual_seed(0)
    model = WorldModel(WorldModelConfig(dit=dit, idm=InverseDynamicsConfig(channels=8))).eval()
    max_prob, recorded = replay_max_success(model, dataset, [3, 0, 1], batch_size=2)
    assert recorded.tolist() == [False, True, False]  # the fixture's even episodes succeed; caller's order
    assert max_prob.shape == (3,) and ((0 <= max_prob) & (max_prob <= 1)).all()
    again, _ = replay_max_success(model, dataset, [3, 0, 1], batch_size=2)
    assert np.array_equal(max_prob, again)  # seeded


def test_replay_episodes_is_replay_actions_batch_by_batch(tiny_lerobot_dataset, tmp_path):
    from worldloop.world_model.world_model_env import (
        WorldModelEnv,
        WorldModelEnvConfig,
        from_dataset,
        replay_actions,
        replay_episodes,
    )

    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=[5, 6, 5], cameras=("front",))
    dataset = EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"], image_size=[16, 16]))
    dit = VideoDiTConfig(image_size=16, patch_size=4, width=32, depth=1, heads=2, context_frames=2)
    torch.manual_seed(0)
    env = WorldModelEnv(
        WorldModel(WorldModelConfig(dit=dit, idm=InverseDynamicsConfig(channels=8))).eval(),
        WorldModelEnvConfig(horizon=4, terminate_on_success=False),
    )
    results = replay_episodes(env, dataset, [2, 0, 1], steps=4, batch_size=2, seed=7)
    table = dataset.frame_table()
    by_hand = []
    for first, group in ((0, [2, 0]), (2, [1])):
        actions = torch.stack([table.action[dataset.episodes[e].start :][:4] for e in group])
        by_hand += replay_actions(env, from_dataset(dataset, group, env.cameras), actions, seed=7 + first)
    assert results == by_hand and len(results) == 3
    with pytest.raises(ValueError, match=r"episodes \[0, 2\] have fewer than 6 frames"):
        replay_episodes(env, dataset, [0, 1, 2], steps=6, batch_size=2, seed=7)


@pytest.mark.parametrize(("held_out_fraction", "expected"), [(0.0, 4), (0.5, 2)])
def test_calibrate_only_uses_held_out_episodes_or_all_of_a_calibration_dataset(
    tiny_lerobot_dataset, tmp_path, monkeypatch, held_out_fraction, expected
):
    from worldloop.world_model import trainer

    root = tiny_lerobot_dataset(tmp_path, episodes=4, length=[5, 6, 5, 6], cameras=("front",))
    dit = VideoDiTConfig(image_size=16, patch_size=4, width=32, depth=1, heads=2, context_frames=2)
    WorldModel(WorldModelConfig(cameras=["front"], dit=dit)).save_pretrained(tmp_path / "model")
    seen = {}
    monkeypatch.setattr(
        trainer,
        "calibrate_exported",
        lambda model, ds, train_eps, held_eps, cfg: seen.update(eps=held_eps, train=train_eps),
    )
    cfg = trainer.TrainWorldModelConfig(
        dataset=DatasetConfig(root=str(root), held_out_fraction=held_out_fraction),
        init_from=str(tmp_path / "model"),
        calibrate_only=True,
        output_dir=str(tmp_path / "out"),
    )
    trainer.train(cfg)
    assert len(seen["eps"]) == expected and set(seen["eps"]) <= {0, 1, 2, 3}
    # the still-pixel threshold is chosen on the other episodes (all of them for a calibration dataset)
    assert len(seen["train"]) == (4 - expected if held_out_fraction else 4)
