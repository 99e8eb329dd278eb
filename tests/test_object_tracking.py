"""Object tracking on rendered sim frames: found where the simulator put the cube, not found when hidden."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldloop.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE
from worldloop.sim.tabletop_sim import TabletopSim
from worldloop.sim.tasks import TaskInstance, sample_layout
from worldloop.world_model.object_tracking import (
    ColourTracker,
    centroid_distance,
    object_fidelity,
    one_step_motion,
)


@pytest.fixture(scope="module")
def sim():
    s = TabletopSim(cameras=("front",), image_size=64)
    yield s
    s.close()


def _frame(sim: TabletopSim) -> torch.Tensor:
    return torch.from_numpy(sim.render()["front"]).permute(2, 0, 1).float() / 255


def test_every_cube_is_found_within_a_pixel_of_its_projected_centre(sim):
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(6):
        sim.reset(sample_layout(TaskInstance("push", "red", "green"), rng), sim.home)
        frame = _frame(sim)
        for colour in CUBE_COLORS:
            xy, visible = ColourTracker(tuple(sim.cube_colour(colour))).locate(frame)
            assert bool(visible), colour
            errors.append(np.linalg.norm(xy.numpy() - sim.project("front", sim.scene_state().cubes[colour])))
    assert max(errors) < 1.0
    # a batch of frames gives the same positions as one at a time
    batch = torch.stack([frame, frame.flip(-1)])
    xy, visible = ColourTracker(tuple(sim.cube_colour("red"))).locate(batch)
    assert visible.tolist() == [True, True]
    assert abs(float(xy[1, 0]) - (64 - float(xy[0, 0]))) < 1e-4  # mirrored column, same row


def test_a_cube_hidden_behind_the_arm_is_not_visible(sim):
    sim.reset(sample_layout(TaskInstance("push", "red", "green"), np.random.default_rng(1)), sim.home)
    tracker = ColourTracker(tuple(sim.cube_colour("red")))
    # Behind the arm's column as the front camera sees it: the line from the camera through the base.
    camera_xy = np.array([0.45, -0.5])  # the front camera's position in tabletop.xml
    behind = -camera_xy / np.linalg.norm(camera_xy) * 0.1
    hidden = np.array([*behind, CUBE_HALF_SIZE])
    sim.set_cube_position("red", hidden)
    x, y = sim.project("front", hidden)
    assert 0 < x < 64 and 0 < y < 64  # in view: hidden by the arm, not out of frame
    xy, visible = tracker.locate(_frame(sim))
    assert not bool(visible) and torch.isnan(xy).all()
    # the same cube beside the column is seen again
    beside = np.array([behind[0] + 0.12, behind[1] + 0.12, CUBE_HALF_SIZE])
    sim.set_cube_position("red", beside)
    xy, visible = tracker.locate(_frame(sim))
    assert bool(visible) and np.linalg.norm(xy.numpy() - sim.project("front", beside)) < 1.0


def test_the_cube_to_square_distance_is_small_on_the_square_and_large_beside_it(sim):
    sim.reset(sample_layout(TaskInstance("push", "red", "green"), np.random.default_rng(2)), sim.home)
    colours = tuple(sim.cube_colour("red")), tuple(sim.zone_colour("green"))
    square = sim.scene_state().zones["green"]
    far = float(centroid_distance(_frame(sim), *colours))
    cube_px = sim.project("front", sim.scene_state().cubes["red"])
    square_px = sim.project("front", np.array([*square, 0.0]))
    assert abs(far - np.linalg.norm(cube_px - square_px)) < 1.5  # the square's centroid is near its centre
    sim.set_cube_position("red", np.array([*square, CUBE_HALF_SIZE]))
    on = float(centroid_distance(_frame(sim), *colours))
    sim.set_cube_position("red", np.array([square[0] + 0.1, square[1], CUBE_HALF_SIZE]))
    beside = float(centroid_distance(_frame(sim), *colours))
    # on it, not 0: the cube's centroid is drawn above the table and it hides part of the square (3-4 px at
    # 64x64); 10 cm beside it, clearly farther
    assert on < 4.5 and beside > on + 3
    # a colour that is not in the frame: not seen, NaN
    assert torch.isnan(centroid_distance(torch.full((3, 16, 16), 0.5), *colours))


def test_grey_and_other_colours_do_not_match():
    frame = torch.full((3, 16, 16), 0.5)  # grey table
    frame[:, 2:6, 2:6] = torch.tensor([0.95, 0.55, 0.1]).view(3, 1, 1)  # the orange finger
    frame[:, 10:14, 10:14] = torch.tensor([0.6, 0.06, 0.06]).view(3, 1, 1)  # a shaded red face
    xy, visible = ColourTracker((0.9, 0.1, 0.1)).locate(frame)
    assert bool(visible) and xy.tolist() == [12.0, 12.0]
    _, visible = ColourTracker((0.1, 0.3, 0.95)).locate(frame)
    assert not bool(visible)
    with pytest.raises(ValueError, match="colour"):
        ColourTracker((0.0, 0.0, 0.0)).locate(frame)


def _squares(xs: list[list[float]], size: int = 16) -> torch.Tensor:
    """Frames [N, H, 3, size, size]: a grey table with a 3x3 red square whose left column starts at x."""
    frames = torch.full((len(xs), len(xs[0]), 3, size, size), 0.5)
    for i, row in enumerate(xs):
        for k, x in enumerate(row):
            frames[i, k, :, 6:9, int(x) : int(x) + 3] = torch.tensor([0.9, 0.1, 0.1]).view(3, 1, 1)
    return frames


def test_one_step_motion_scores_a_copy_at_zero_and_the_truth_at_one():
    """Two windows whose square moves right by 1-2 px a step: frames drawn where the truth is score slope 1,
    the previous frame copied (a model that moves nothing) scores 0; still steps are left out."""
    red = (0.9, 0.1, 0.1)
    lefts = [[3.0, 4.0, 6.0, 6.0, 8.0], [9.0, 10.0, 11.0, 11.0, 12.0]]  # frame 0 is the last context frame
    frames = _squares(lefts)
    truth = torch.tensor([[[x + 1.5, 7.5] for x in row[1:]] for row in lefts])
    start = truth.new_tensor([[row[0] + 1.5, 7.5] for row in lefts])
    previous, real = frames[:, :-1], frames[:, 1:]
    exact = one_step_motion(real, previous, truth, start, [red, red])
    assert exact["slope"] == pytest.approx(1.0) and exact["r"] == pytest.approx(1.0)
    assert exact["steps"] == 6  # the 2 still steps are below min_step
    assert exact["area_ratio"] == pytest.approx(1.0)
    assert exact["tracker_slope"] == pytest.approx(1.0)  # the real frames, tracked, move as the truth does
    # Continuing the step before's true move (1, 0 before the moves of 2, 2 and 1, 1 after the first steps):
    # (1 * 2 + 0 * 2 + 1 * 1 + 0 * 1) / (4 + 4 + 1 + 1).
    assert exact["persistence_slope"] == pytest.approx(0.3)
    # A blend of "stayed" and "moved" (a conditional mean) matches only where the two squares overlap: that core
    # sits halfway, so the tracker reads half the move, and the drawn square is smaller than the real one.
    blended = one_step_motion(0.5 * previous + 0.5 * real, previous, truth, start, [red, red])
    assert blended["slope"] == pytest.approx(0.5)
    assert blended["area_ratio"] == pytest.approx((2 / 3 + 1 / 3 + 2 / 3 + 2 / 3) / 4)
    copied = one_step_motion(previous, previous, truth, start, [red, red])
    assert copied["slope"] == pytest.approx(0.0) and copied["steps"] == 6
    lagging = object_fidelity(previous, real, truth, start, [red, red])  # drawn one step behind the truth
    assert lagging["position_error"][-1] == pytest.approx((2.0 + 1.0) / 2)
    assert lagging["still_error"][-1] == pytest.approx((5.0 + 3.0) / 2)  # left where it started
    assert lagging["lost_windows"] == []
    erased = previous.clone()
    erased[1, -1] = 0.5  # the second window's drawn last frame shows no square: that window is lost
    assert object_fidelity(erased, real, truth, start, [red, red])["lost_windows"] == [1]
    with pytest.raises(ValueError, match="one_step_motion"):
        one_step_motion(real[:1], previous, truth, start, [red, red])
