"""WorldModelWindows and PolicySamples over a synthetic LeRobotDataset whose values encode (episode, frame)."""

from __future__ import annotations

import pytest
import torch
from conftest import SHARED_LENGTHS, pattern_action, pattern_state, pattern_task
from torch.utils.data import DataLoader

from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.features import ACTION, STATE, TASK, image_key
from worldloop.data.windows import PolicySamples, WorldModelWindows

LENGTHS = SHARED_LENGTHS  # episode 1 is shorter than a window of 4


@pytest.fixture(scope="module")
def dataset(shared_tiny_dataset_root):
    return EpisodeDataset(DatasetConfig(root=str(shared_tiny_dataset_root), cameras=["front", "wrist"]))


def test_windows_align_frames_actions_and_state(dataset):
    windows = WorldModelWindows(dataset, context=3, horizon=1)
    assert windows.skipped_episodes == [1]
    assert len(windows) == sum(n - 4 + 1 for n in LENGTHS if n >= 4)
    for i in range(len(windows)):
        w = windows[i]
        ep, f0 = w["episode_index"], w["frame_index"]
        assert w["frames"].shape == (4, 2, 3, 16, 16) and w["frames"].dtype == torch.uint8
        # Channel 0 holds the frame index, channel 1 the episode, channel 2 the camera number.
        assert w["frames"][:, :, 0, 0, 0].tolist() == [[f0 + t] * 2 for t in range(4)]
        assert (w["frames"][:, :, 1] == ep).all()  # never crosses into another episode
        assert w["frames"][0, :, 2, 0, 0].tolist() == [0, 1]
        # The episode's first frame, whatever the window: frame index 0 of this episode, both cameras.
        assert w["first_frame"].shape == (2, 3, 16, 16)
        assert w["first_frame"][:, 0, 0, 0].tolist() == [0, 0] and (w["first_frame"][:, 1] == ep).all()
        for t in range(4):
            assert torch.equal(w["actions"][t], torch.from_numpy(pattern_action(ep, f0 + t)))
            assert torch.equal(w["state"][t], torch.from_numpy(pattern_state(ep, f0 + t)))
        assert w["done"].tolist() == [f0 + t == LENGTHS[ep] - 1 for t in range(4)]
        assert w["task"] == pattern_task(ep)


def test_window_stride_episode_subset_and_float_frames(dataset):
    windows = WorldModelWindows(dataset, episodes=[2], context=2, horizon=2, stride=2, float_frames=True)
    assert [windows[i]["frame_index"] for i in range(len(windows))] == [0, 2, 4]
    frames = windows[1]["frames"]
    assert frames.dtype == torch.float32 and torch.allclose(frames[0, 0, 0], torch.full((16, 16), 2 / 255))


def test_windows_batch_through_a_dataloader(dataset):
    batch = next(iter(DataLoader(WorldModelWindows(dataset, context=2, horizon=1), batch_size=5)))
    assert batch["frames"].shape == (5, 3, 2, 3, 16, 16) and batch["actions"].shape == (5, 3, 4)
    assert batch["reward"].shape == (5, 3) and len(batch["task"]) == 5


def test_no_episode_long_enough_is_an_error(dataset):
    with pytest.raises(DatasetError, match=r"has the 20 frames a window needs"):
        WorldModelWindows(dataset, context=10, horizon=10)


def test_policy_samples_chunks_and_pad_mask_at_episode_end(dataset):
    samples = PolicySamples(dataset, episodes=[0, 3], chunk_size=4)
    assert len(samples) == LENGTHS[0] + LENGTHS[3]
    s = samples[LENGTHS[0] + 3]  # episode 3 (length 5), frame 3: two real actions, then padding
    assert s["episode_index"] == 3 and s["frame_index"] == 3
    assert s["action_is_pad"].tolist() == [False, False, True, True]
    expected = [pattern_action(3, f) for f in (3, 4, 4, 4)]  # the last action repeats, as in LeRobot
    assert torch.equal(s[ACTION], torch.tensor(expected))
    assert torch.equal(s[STATE], torch.from_numpy(pattern_state(3, 3)))
    img = s[image_key("wrist")]
    assert img.dtype == torch.float32 and img.shape == (3, 16, 16)
    assert torch.allclose(img[:, 0, 0], torch.tensor([3, 3, 1]) / 255)
    assert s[TASK] == pattern_task(3)
    assert not samples[0]["action_is_pad"].any()


@pytest.mark.parametrize("episodes", [None, [2, 3]])
def test_cached_and_lerobot_paths_agree(dataset, episodes):
    pairs = [
        (WorldModelWindows(dataset, episodes, context=2, horizon=2, cache=c) for c in (True, False)),
        (PolicySamples(dataset, episodes, chunk_size=3, cache=c) for c in (True, False)),
    ]
    for cached, direct in pairs:
        assert len(cached) == len(direct)
        for i in range(len(cached)):
            a, b = cached[i], direct[i]
            assert a.keys() == b.keys()
            for key in a:
                if isinstance(a[key], torch.Tensor):
                    assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
                else:
                    assert a[key] == b[key], key
