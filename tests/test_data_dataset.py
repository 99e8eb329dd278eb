"""EpisodeDataset: opening a LeRobotDataset from disk, feature checks with clear errors, the split."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import SHARED_LENGTHS, make_tiny_lerobot_dataset, pattern_image, pattern_state, pattern_task

from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset, split_episodes
from worldloop.data.features import ACTION, STATE

LENGTHS = SHARED_LENGTHS


@pytest.fixture(scope="module")
def root(shared_tiny_dataset_root):
    return shared_tiny_dataset_root


def test_opens_and_discovers_features(root):
    ds = EpisodeDataset(DatasetConfig(root=str(root)))
    assert ds.cameras == ["front"]  # default: the first camera only
    assert ds.image_size == (16, 16) and ds.state_dim == 4 and ds.action_dim == 4 and ds.fps == 10
    assert [(e.start, e.end) for e in ds.episodes.values()] == [(0, 6), (6, 9), (9, 18), (18, 23)]
    assert ds.episodes[1].tasks == (pattern_task(1),) and ds.episodes[1].length == 3


def test_frame_table_round_trip(root):
    ds = EpisodeDataset(DatasetConfig(root=str(root), cameras=["wrist", "front"]))
    table = ds.frame_table()
    assert len(table) == sum(LENGTHS)
    assert table.images["wrist"].dtype == torch.uint8 and table.images["wrist"].shape == (23, 3, 16, 16)
    row = 9 + 4  # episode 2, frame 4
    expected = torch.from_numpy(pattern_image(2, 4, 1, (16, 16))).permute(2, 0, 1)
    assert torch.equal(table.images["wrist"][row], expected)
    assert torch.equal(table.images["front"][row, 2], torch.zeros(16, 16, dtype=torch.uint8))
    assert torch.equal(table.state[row], torch.from_numpy(pattern_state(2, 4)))
    assert table.task[row] == pattern_task(2) and int(table.frame_index[row]) == 4
    assert table.done.nonzero().flatten().tolist() == [5, 8, 17, 22]
    assert table.success.nonzero().flatten().tolist() == [5, 17]  # last frames of even episodes
    assert ds.frame_table() is table  # decoded once


def test_split_is_seeded_disjoint_and_stable_when_episodes_are_added():
    eps = list(range(40))
    train, held = split_episodes(eps, 0.25, seed=3)
    assert sorted(train + held) == eps and not set(train) & set(held) and len(held) == 10
    assert split_episodes(eps, 0.25, seed=3) == (train, held)
    assert split_episodes(eps, 0.25, seed=4)[1] != held
    # Growing the dataset keeps old training episodes in training.
    train_more, _ = split_episodes(list(range(44)), 0.25, seed=3)
    assert len(set(train) - set(train_more)) <= 2
    assert split_episodes([0, 1], 0.1, seed=0)[1] != []  # a positive fraction always holds one out
    with pytest.raises(ValueError, match="held_out_fraction"):
        split_episodes(eps, 1.0, seed=0)


def test_missing_root_is_a_clear_error_without_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        EpisodeDataset(DatasetConfig(root=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="meta/info.json is missing"):
        EpisodeDataset(DatasetConfig(root=str(tmp_path / "empty")))
    with pytest.raises(DatasetError, match="root is empty"):
        EpisodeDataset(DatasetConfig())


def test_missing_data_file_is_a_clear_error(root, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    shutil.rmtree(broken / "data")
    with pytest.raises(FileNotFoundError, match=r"data/chunk-000/file-000.parquet \(episode 0\) is missing"):
        EpisodeDataset(DatasetConfig(root=str(broken)))


def test_wrong_camera_names_the_available_ones(root):
    with pytest.raises(DatasetError, match=r"camera 'top' not found.*\['front', 'wrist'\]"):
        EpisodeDataset(DatasetConfig(root=str(root), cameras=["top"]))


def test_expected_shapes_are_checked(root):
    with pytest.raises(DatasetError, match=r"camera 'front' is 16x16, expected 64x64"):
        EpisodeDataset(DatasetConfig(root=str(root), image_size=[64, 64]))
    with pytest.raises(DatasetError, match=r"'observation.state' has size 4, expected 6"):
        EpisodeDataset(DatasetConfig(root=str(root), state_dim=6))
    with pytest.raises(DatasetError, match=r"'action' has size 4, expected 7"):
        EpisodeDataset(DatasetConfig(root=str(root), action_dim=7))


def _edit_info(root, tmp_path, edit) -> str:
    copy = tmp_path / "edited"
    shutil.copytree(root, copy)
    info_path = copy / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    edit(info["features"])
    info_path.write_text(json.dumps(info))
    return str(copy)


def test_missing_feature_is_named(root, tmp_path):
    edited = _edit_info(root, tmp_path, lambda f: f.pop(ACTION))
    with pytest.raises(DatasetError, match=r"required feature 'action' is missing"):
        EpisodeDataset(DatasetConfig(root=edited))


def test_wrong_declared_shape_is_named(root, tmp_path):
    def make_state_2d(features):
        features[STATE]["shape"] = [2, 2]

    edited = _edit_info(root, tmp_path, make_state_2d)
    with pytest.raises(DatasetError, match=r"'observation.state' is float32 of shape \(2, 2\)"):
        EpisodeDataset(DatasetConfig(root=edited))


def test_declared_image_size_that_lies_is_caught_when_decoding(root, tmp_path):
    def shrink(features):
        features["observation.images.front"]["shape"] = [8, 8, 3]

    ds = EpisodeDataset(DatasetConfig(root=_edit_info(root, tmp_path, shrink)))
    with pytest.raises(DatasetError, match=r"'observation.images.front' frames are \{\(16, 16, 3\)\}"):
        ds.frame_table()


def test_unknown_episode_is_named(root):
    ds = EpisodeDataset(DatasetConfig(root=str(root)))
    with pytest.raises(DatasetError, match=r"no episodes \[7\]"):
        ds.select_episodes([0, 7])


def test_missing_rewards_are_filled_or_required(tmp_path):
    root = make_tiny_lerobot_dataset(tmp_path / "no_rewards", episodes=2, length=[3, 4], with_rewards=False)
    with pytest.raises(
        DatasetError, match=r"required features \['next.reward', 'next.success', 'next.done'\]"
    ):
        EpisodeDataset(DatasetConfig(root=str(root), require_rewards=True))
    table = EpisodeDataset(DatasetConfig(root=str(root))).frame_table()
    assert not table.reward.any() and not table.success.any()  # filled, as documented
    assert table.done.nonzero().flatten().tolist() == [2, 6]  # True on each episode's last frame


def test_image_key_outside_the_contract_is_named(root, tmp_path):
    def rename(features):
        features["observation.image"] = features.pop("observation.images.front")
        features.pop("observation.images.wrist")

    with pytest.raises(DatasetError, match=r"image features \['observation.image'\] need renaming"):
        EpisodeDataset(DatasetConfig(root=_edit_info(root, tmp_path, rename)))


def test_old_format_names_the_root(root, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(root, copy)
    info = json.loads((copy / "meta" / "info.json").read_text())
    info["codebase_version"] = "v2.1"
    (copy / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=rf"dataset {copy}: lerobot could not read its metadata"):
        EpisodeDataset(DatasetConfig(root=str(copy)))
