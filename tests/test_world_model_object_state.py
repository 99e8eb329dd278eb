"""The auxiliary object-state loss (`model.object_state_weight`): the data that carries the objects' state,
the head's targets and normalisation, its gradient into the backbone, and that rollouts never read it; and
the training windows where objects move, listed more often (`object_motion_repeat`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import record_tiny_push
from test_world_model_steps import SIZE, tiny_model
from test_world_model_training import tiny_train_args

from worldloop.common.config import ConfigError, parse_cli
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import ENVIRONMENT_STATE
from worldloop.data.stats import ENVIRONMENT_MOTION, compute_stats
from worldloop.data.windows import WorldModelWindows, object_motion, repeat_moving_windows
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.model import WorldModel, identity_stats
from worldloop.world_model.trainer import TrainWorldModelConfig, train

E = 3


def object_stats() -> dict:
    stats = identity_stats(4, 4)
    stats[ENVIRONMENT_STATE] = compute_stats(np.array([[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]]))  # mean 1/2/4
    stats[ENVIRONMENT_MOTION] = compute_stats(np.array([[0.0, 0.0, 0.0], [0.2, 0.4, 0.0]]))  # std .1/.2/0
    return stats


def object_model(weight: float = 1.0) -> WorldModel:
    cfg = tiny_model().cfg
    cfg.object_state_weight, cfg.object_state_dim = weight, E
    torch.manual_seed(0)
    model = WorldModel(cfg, object_stats())
    with torch.no_grad():  # as tiny_model: zero-initialised output layers would ignore their inputs
        for p in model.parameters():
            p.normal_(std=0.1)
    return model.train()


def _window(b=2, t=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(b, t, 3, SIZE, SIZE, generator=g),
        torch.randn(b, t, 4, generator=g),
        torch.randn(b, t, E, generator=g),
    )


def test_object_state_loss_regresses_each_target_frames_state_and_motion_centred_and_scaled():
    model = object_model()
    with torch.no_grad():
        model.object_state.weight.zero_()
        model.object_state.bias.zero_()
    b, t = 2, 4
    tokens = torch.randn(b, t - 1, model.cfg.dit.frame_len, model.cfg.dit.width)
    s = torch.arange(b * t * E, dtype=torch.float32).view(b, t, E) / 10
    loss = model.object_state_loss(tokens, s)
    # a zero head predicts 0: the loss is the Huber loss of the targets of frames 1..T-1, each centred and
    # divided by one scale, the root mean square of its dimensions' stds (state 1/1/2, motion .1/.2/0)
    state = (s[:, 1:] - torch.tensor([1.0, 2.0, 4.0])) / 2**0.5
    motion = (s[:, 1:] - s[:, :-1] - torch.tensor([0.1, 0.2, 0.0])) / (0.05 / 3) ** 0.5
    huber = torch.nn.functional.huber_loss
    expected = 0.5 * (huber(state, torch.zeros_like(state)) + huber(motion, torch.zeros_like(motion)))
    torch.testing.assert_close(loss, expected)


def test_object_state_loss_is_added_with_its_weight_and_reaches_the_backbone():
    frames, actions, objects = _window()
    torch.manual_seed(1)
    with_head, logs = object_model(weight=2.0).compute_loss(frames, actions, environment_state=objects)
    torch.manual_seed(1)
    without, plain_logs = object_model(weight=0.0).compute_loss(frames, actions, environment_state=objects)
    assert "loss/object_state" in logs and "loss/object_state" not in plain_logs
    torch.testing.assert_close(with_head - without, torch.tensor(2.0 * logs["loss/object_state"]))
    model = object_model()
    model.zero_grad()
    model.object_state_loss(
        model.compute_model_output(*_teacher_forced(model, frames, actions)).tokens, objects
    ).backward()
    assert model.object_state.weight.grad.abs().sum() > 0
    assert all(blk.qkv.weight.grad.abs().sum() > 0 for blk in model.dit.blocks)


def _teacher_forced(model, frames, actions):
    _, x, a = model.encode_window(frames, actions)
    window = model.noise_window(x)
    cond = model.compute_conditioners(window.clean, window.ctx_t, window.target_t, a, window.target_t >= 0)
    return window.clean, window.noisy, cond


def test_object_state_needs_its_data_stats_and_size():
    frames, actions, _ = _window()
    with pytest.raises(ValueError, match="no environment_state"):
        object_model().compute_loss(frames, actions)
    with pytest.raises(ValueError, match="object_state_dim"):
        WorldModelConfig(object_state_weight=1.0).validate()
    with pytest.raises(ValueError, match="environment_state.motion"):
        stats = object_stats()
        del stats[ENVIRONMENT_MOTION]
        WorldModel(object_model().cfg, stats)


def test_rollouts_never_read_the_object_state_head():
    model = object_model().eval()
    ctx, ctx_a, fut = torch.rand(1, 2, 3, SIZE, SIZE), torch.randn(1, 1, 4), torch.randn(1, 3, 4)
    before = model.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(0))[0]
    with torch.no_grad():
        model.object_state.weight.normal_()
    after = model.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(0))[0]
    assert torch.equal(before, after)


@pytest.fixture(scope="module")
def push_root(tmp_path_factory):
    return record_tiny_push(
        tmp_path_factory.mktemp("objects") / "push", episodes=3, image_size=SIZE, max_steps=8
    )


def test_windows_carry_the_recorded_object_state_on_both_read_paths(push_root):
    ds = EpisodeDataset(DatasetConfig(root=str(push_root), cameras=["front"]))
    cached = WorldModelWindows(ds, context=1, horizon=3)[2]
    streamed = WorldModelWindows(ds, context=1, horizon=3, cache=False)[2]
    assert cached["environment_state"].shape == (4, 9)
    torch.testing.assert_close(cached["environment_state"], streamed["environment_state"])


def test_trainer_fits_the_object_state_where_recorded_and_names_the_dataset_where_not(
    tmp_path, push_root, tiny_lerobot_dataset
):
    out = tmp_path / "run"
    args = [*tiny_train_args(push_root, out), "--model.object_state_weight=0.5", "--still_windows=0"]
    train(parse_cli(TrainWorldModelConfig, [*args, "--eval.max_windows=0", "--calibrate_success=false"]))
    loaded = WorldModel.from_pretrained(out / "pretrained_model")
    assert loaded.cfg.object_state_dim == 9 and loaded.object_state is not None
    assert {ENVIRONMENT_STATE, ENVIRONMENT_MOTION} <= set(loaded.stats)
    plain = tiny_lerobot_dataset(tmp_path, episodes=2, length=8, image_size=(SIZE, SIZE))
    with pytest.raises(ConfigError, match=f"{plain}.* records none"):
        train(parse_cli(TrainWorldModelConfig, [*tiny_train_args(plain, tmp_path / "x"), args[-2]]))


def _windows_with_a_planted_push(push_root) -> tuple[WorldModelWindows, torch.Tensor]:
    """Windows of the tiny push episodes (too short for the pusher to reach a cube), with one cube moved
    5 cm from frame 2 of the first episode on; and which windows hold that step."""
    windows = WorldModelWindows(
        EpisodeDataset(DatasetConfig(root=str(push_root), cameras=["front"])), horizon=2
    )
    first = windows.dataset.episodes[0]
    windows.dataset.frame_table().environment_state[first.start + 2 : first.end, 0] += 0.05
    step = first.start + 2  # frames step - 1 and step differ
    holds_step = torch.tensor(
        [ep == first.index and start < step < start + 3 for ep, start in windows.starts]
    )
    return windows, holds_step


def test_object_motion_is_the_largest_range_of_any_object_value_within_each_window(push_root):
    windows, holds_step = _windows_with_a_planted_push(push_root)
    expected = [(w["environment_state"].amax(0) - w["environment_state"].amin(0)).max() for w in windows]
    motion = object_motion(windows)
    torch.testing.assert_close(motion, torch.stack(expected))
    assert 0 < int(holds_step.sum()) < len(windows)
    assert (motion[holds_step] > 0.04).all() and (motion[~holds_step] < 0.01).all()


def test_moving_windows_are_listed_repeat_times_and_still_ones_once(push_root):
    windows, holds_step = _windows_with_a_planted_push(push_root)
    repeated = repeat_moving_windows(windows, repeat=3, min_motion=0.01)
    assert len(repeated) == len(windows) + 2 * int(holds_step.sum())
    counts = torch.bincount(torch.tensor(repeated.indices), minlength=len(windows))
    assert torch.equal(counts, torch.where(holds_step, 3, 1))
    assert repeated[len(windows)]["frame_index"] == windows[int(holds_step.nonzero()[0])]["frame_index"]
    assert len(repeat_moving_windows(windows, repeat=1, min_motion=0.01)) == len(windows)
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        repeat_moving_windows(windows, repeat=0, min_motion=0.01)


def test_trainer_repeats_moving_windows_only_where_the_dataset_records_objects(
    tmp_path, tiny_lerobot_dataset
):
    plain = tiny_lerobot_dataset(tmp_path, episodes=2, length=8, image_size=(SIZE, SIZE))
    args = [*tiny_train_args(plain, tmp_path / "x"), "--object_motion_repeat=3"]
    with pytest.raises(ConfigError, match=f"object_motion_repeat=3: dataset {plain} records no"):
        train(parse_cli(TrainWorldModelConfig, args))
