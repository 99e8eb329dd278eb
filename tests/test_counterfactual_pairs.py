"""Counterfactual pairs: one start recorded several ways (`record_demos.py --variants`), the training windows
paired across a start's takes (`CounterfactualPairs`), and the world model's `counterfactual_weight`, which draws
both windows of a pair from the same noise and scores the drawn difference against the real one."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import record_tiny_push
from test_world_model_levers import _window
from test_world_model_steps import SIZE, tiny_model
from test_world_model_training import tiny_train_args

from worldloop.common.config import ConfigError, parse_cli
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.recording import RECORDING_META
from worldloop.data.windows import CounterfactualPairs, WorldModelWindows, pair_collate
from worldloop.sim.recording import RecordingConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.trainer import TrainWorldModelConfig, train

STEPS = 8


@pytest.fixture(scope="module")
def takes_root(tmp_path_factory):
    """Two starts, each pushed two ways by a clumsy expert (skill 0.2: noise, hesitation, wrong targets)."""
    root = tmp_path_factory.mktemp("takes") / "push"
    return record_tiny_push(
        root, episodes=4, image_size=SIZE, max_steps=STEPS, variants=2, skill=0.2, seed=30
    )


def _dataset(root) -> EpisodeDataset:
    return EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"]))


def test_variants_record_each_start_in_a_row_each_take_pushed_its_own_way(takes_root, tmp_path):
    meta = json.loads((takes_root / RECORDING_META).read_text())["episodes"]
    assert [e["seed"] for e in meta] == [30, 30, 31, 31]
    assert [e["variant"] for e in meta] == [0, 1, 0, 1]
    table = _dataset(takes_root).frame_table()
    eps = list(_dataset(takes_root).episodes.values())
    first = [table.images["front"][ep.start] for ep in eps]
    assert torch.equal(first[0], first[1]) and torch.equal(first[2], first[3])
    assert not torch.equal(first[0], first[2])
    actions = [table.action[ep.start : ep.end] for ep in eps]
    assert not torch.allclose(actions[0], actions[1]) and not torch.allclose(actions[2], actions[3])
    # variant 0 is the take a recording without variants makes of that start: old recordings stay as they were
    plain = _dataset(record_tiny_push(tmp_path / "plain", 1, SIZE, STEPS, skill=0.2, seed=30)).frame_table()
    torch.testing.assert_close(plain.action, actions[0])


def test_variants_are_checked():
    with pytest.raises(ValueError, match="variants must be >= 1"):
        RecordingConfig(variants=0).validate()
    with pytest.raises(ValueError, match="variants=2: .*not with task=pusht"):
        RecordingConfig(task="pusht", cameras=["top"], variants=2).validate()
    with pytest.raises(ValueError, match="variants=2: .*--policies"):
        RecordingConfig(variants=2, policies=["p"]).validate()


def test_windows_pair_across_a_starts_takes_at_the_same_offset(takes_root):
    windows = WorldModelWindows(_dataset(takes_root), context=1, horizon=2)
    pairs = CounterfactualPairs(windows)
    per_episode = STEPS - 3 + 1
    assert len(pairs) == 2 * per_episode  # one pair of takes per start, at every offset
    assert pairs.starts == 2
    paired = {a for a, _ in pairs.pairs} | {b for _, b in pairs.pairs}
    assert paired == set(range(len(windows)))  # every window is in a pair
    for i in range(len(pairs)):
        a, b = pairs[i]
        assert a["frame_index"] == b["frame_index"]
        assert a["episode_index"] != b["episode_index"]
        assert torch.equal(a["first_frame"], b["first_frame"])
    batch = pair_collate([pairs[0], pairs[per_episode]])
    # the pairs' first windows (starts 30 and 31, take 0), then their partners (take 1)
    assert batch["episode_index"].tolist() == [0, 2, 1, 3]
    torch.testing.assert_close(batch["actions"][2], pairs[0][1]["actions"])


def test_a_dataset_without_shared_starts_has_no_pairs_and_says_how_to_record_them(tmp_path):
    root = record_tiny_push(tmp_path / "one_take", episodes=2, image_size=SIZE, max_steps=5)
    with pytest.raises(DatasetError, match=f"dataset {root}: no two .*--variants=2"):
        CounterfactualPairs(WorldModelWindows(_dataset(root), context=1, horizon=2))


def test_paired_self_rollout_shares_the_noise_between_the_halves():
    model = tiny_model(self_rollout_frames=2, self_rollout_grad_frames=2, context_noise_rollout=0.0).train()
    frames, actions = _window(b=2, t=5)
    frames, actions = frames.repeat(2, 1, 1, 1, 1), actions.repeat(2, 1, 1)  # each window paired with itself
    _, x, a = model.encode_window(frames, actions)
    torch.manual_seed(5)
    paired = torch.cat(model.self_rollout(x, a, paired=True), 1)
    torch.testing.assert_close(paired[:2], paired[2:], atol=0, rtol=0)
    assert model.counterfactual_loss(x, model.self_rollout(x, a, paired=True)) == 0
    torch.manual_seed(5)
    unpaired = torch.cat(model.self_rollout(x, a), 1)
    assert (unpaired[:2] - unpaired[2:]).abs().amax() > 1e-3  # the same windows, drawn from other noise
    with pytest.raises(ValueError, match="even batch"):
        model.self_rollout(x[:3], a[:3], paired=True)


def test_the_counterfactual_loss_is_the_drawn_difference_against_the_real_one_and_joins_the_loss():
    model = tiny_model(
        self_rollout_frames=2,
        self_rollout_grad_frames=1,
        counterfactual_weight=0.5,
        context_noise_rollout=0.0,
    ).train()
    frames, actions = _window(b=4, t=5)
    _, x, a = model.encode_window(frames, actions)
    torch.manual_seed(2)
    drawn = model.self_rollout(x, a, paired=True)
    d, r = drawn[-1], x[:, -1:]
    expected = ((d[:2] - d[2:]) - (r[:2] - r[2:])).square().mean()
    torch.testing.assert_close(model.counterfactual_loss(x, drawn), expected)
    loss, logs = model.compute_loss(frames, actions)
    parts = logs["loss/diffusion"] + logs["loss/self_rollout"] + 0.5 * logs["loss/counterfactual"]
    assert logs["loss/counterfactual"] > 0
    assert logs["loss/total"] == pytest.approx(parts + model.cfg.idm_loss_weight * logs["loss/idm"], rel=1e-5)
    model.cfg.counterfactual_weight = 0.0
    assert "loss/counterfactual" not in model.compute_loss(frames, actions)[1]
    with pytest.raises(ValueError, match="needs self_rollout_frames > 0"):
        WorldModelConfig(counterfactual_weight=1.0).validate()
    with pytest.raises(ValueError, match="counterfactual_weight=-1"):
        WorldModelConfig(counterfactual_weight=-1.0, self_rollout_frames=1).validate()
    with pytest.raises(ValueError, match="set context_noise_rollout=0"):
        WorldModelConfig(
            counterfactual_weight=1.0, self_rollout_frames=1, context_noise_rollout=0.02
        ).validate()


def test_training_on_pairs_through_the_overrides(takes_root, tmp_path, monkeypatch):
    seen = []
    scored = WorldModel.counterfactual_loss

    def counterfactual_loss(self, x, drawn):
        seen.append(x.shape[0])
        return scored(self, x, drawn)

    monkeypatch.setattr(WorldModel, "counterfactual_loss", counterfactual_loss)
    pair_args = [
        "--model.counterfactual_weight=1",
        "--model.self_rollout_frames=1",
        "--model.context_noise_rollout=0",
    ]
    args = [*tiny_train_args(takes_root, tmp_path / "cf"), *pair_args, "--dataset.held_out_fraction=0"]
    model = train(parse_cli(TrainWorldModelConfig, [*args, "--eval.max_windows=0"]))
    assert model.cfg.counterfactual_weight == 1
    assert seen == [4, 4]  # 2 steps of batch_size 2 pairs: 4 windows each
    one_take = record_tiny_push(tmp_path / "one_take", episodes=2, image_size=SIZE, max_steps=5)
    with pytest.raises(ConfigError, match="counterfactual_weight=1.0: dataset .* no counterfactual pairs"):
        train(parse_cli(TrainWorldModelConfig, [*tiny_train_args(one_take, tmp_path / "x"), *pair_args]))
    with pytest.raises(ConfigError, match="object_motion_repeat=3 with model.counterfactual_weight"):
        train(
            parse_cli(
                TrainWorldModelConfig,
                [*tiny_train_args(takes_root, tmp_path / "y"), *pair_args, "--object_motion_repeat=3"],
            )
        )
