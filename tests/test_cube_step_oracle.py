"""benchmarks/cube_step_oracle.py: its one-step examples line up with the frames and the sim's truth, its
scores read known inputs right, and it runs end to end on a tiny push recording."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import record_tiny_push

from benchmarks.cube_step_oracle import (
    CubeStepOracleConfig,
    one_step_examples,
    run_benchmark,
    shifted,
    slope_and_r,
)
from benchmarks.world_model_fidelity import instructed_cube_xyz, object_truth
from worldloop.common.config import ConfigError
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.world_model.trainer import EvalConfig, held_out_windows

SIZE = 32
CONTEXT, HORIZON = 3, 5


@pytest.fixture(scope="module")
def push(tmp_path_factory):
    root = record_tiny_push(
        tmp_path_factory.mktemp("oracle") / "push", episodes=4, image_size=SIZE, max_steps=14
    )
    dataset = EpisodeDataset(DatasetConfig(root=str(root), held_out_fraction=0.5))
    windows = held_out_windows(
        dataset,
        dataset.episode_indices,
        EvalConfig(context=CONTEXT, horizon=HORIZON, max_windows=4, stride=3),
    )
    return dataset, windows


def test_each_example_reads_the_frames_actions_and_state_before_its_step(push):
    dataset, windows = push
    ex = one_step_examples(dataset, windows, CONTEXT, "front")
    pixels, start, _ = object_truth(dataset, windows, CONTEXT, "front")
    assert len(ex.move) == len(windows.frames) * HORIZON
    cubes = instructed_cube_xyz(dataset, windows, torch.arange(windows.frames.shape[1]))
    for i in (0, 1, HORIZON - 1, len(ex.move) - 1):
        w, k = divmod(i, HORIZON)
        last = CONTEXT - 1 + k  # the newest frame the step reads; it leads to frame last + 1
        frames = ex.frames[torch.tensor([i])][0]
        assert frames.shape[0] == CONTEXT
        assert torch.allclose(frames[-1], windows.frames[w, last], atol=1 / 255)
        assert torch.equal(ex.actions[i, -1], windows.actions[w, last].float())
        assert torch.allclose(ex.state[i, 1, -3:], cubes[w, last])  # the cube in the newest frame
        assert torch.allclose(ex.state[i, 0, -3:], cubes[w, last - 1])  # and in the one before
        assert torch.allclose(ex.state[i, 1, :-3], windows.state[w, last].float())
        was = start[w] if k == 0 else pixels[w, k - 1]
        assert torch.allclose(ex.move[i], pixels[w, k] - was)
        if k:
            assert torch.allclose(ex.before[i], ex.move[i - 1])
        else:
            assert torch.isnan(ex.before[i]).all()


def test_slope_and_r_read_a_move_drawn_half_as_far():
    true = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, -3.0], [1.5, 1.5]])
    half = slope_and_r(0.5 * true, true)
    assert half["slope"] == pytest.approx(0.5) and half["r"] == pytest.approx(1.0)
    assert slope_and_r(torch.zeros_like(true), true)["slope"] == 0.0
    assert math.isnan(slope_and_r(true[:2], true[:2])["slope"])


def test_benchmark_smoke_run_fits_both_regressors(push):
    dataset, _ = push
    figures = run_benchmark(
        CubeStepOracleConfig(
            dataset=DatasetConfig(root=str(dataset.root), held_out_fraction=0.5),
            eval=EvalConfig(context=CONTEXT, horizon=HORIZON, max_windows=2, stride=3),
            train_windows=3,
            steps=3,
            batch_size=4,
            augment_shift=2,
        )
    )
    for label in ("frames", "state"):
        assert figures[label]["parameters"] > 0
        assert math.isfinite(figures[label]["train"]["explained"])
    assert figures["zero_held_out"]["explained"] == pytest.approx(0.0)


def test_a_shift_moves_every_context_frame_of_an_example_alike_and_keeps_the_move():
    frames = torch.zeros(3, CONTEXT, 3, 12, 12)
    for c in range(CONTEXT):  # a one-pixel cube stepping right by one pixel a frame
        frames[:, c, 1, 5, 4 + c] = 1.0
    moved = shifted(frames, 2, torch.Generator().manual_seed(0))
    assert moved.shape == frames.shape
    offsets = set()
    for i in range(len(frames)):
        where = [torch.nonzero(moved[i, c, 1]).tolist() for c in range(CONTEXT)]
        assert all(len(w) == 1 for w in where)  # the cube is moved, not smeared or lost
        y0, x0 = where[0][0]
        offsets.add((y0 - 5, x0 - 4))
        assert max(abs(y0 - 5), abs(x0 - 4)) <= 2
        # the same offset for every frame: the cube's step between frames is unchanged
        assert [w[0] for w in where] == [[y0, x0 + c] for c in range(CONTEXT)]
    assert len(offsets) > 1  # examples get their own offsets
    with pytest.raises(ConfigError, match="augment_shift"):
        CubeStepOracleConfig(augment_shift=-1).validate()
