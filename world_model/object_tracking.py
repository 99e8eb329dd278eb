"""Object tracking in frames, drawn or real: find an object of known colour and say where it is.

A metric, never a reward: it tells whether the world model draws the pushed cube where the simulator put
it. The object is found by colour alone. A pixel belongs to it when its colour, scaled so that its
brightest channel is 1, lies near the object's colour scaled the same way: shading changes brightness,
not that direction, so the lit and the shadowed faces of a cube both match, while the grey table and the
white arm do not (too little saturation). The object's position is the centroid of those pixels; with
fewer than `min_pixels` of them (hidden behind the arm, pushed out of view, or drawn away) it is not
visible and its position is NaN.

Positions are (x, y) pixel coordinates, x along columns and y down rows, pixel (i, j)'s centre at
(j + 0.5, i + 0.5): the convention of `sim.rendering.project_to_pixels`, which gives the truth to compare.
This module knows no simulator: the caller passes the colour (and the truth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ColourTracker:
    colour: tuple[float, float, float]  # the object's RGB in [0, 1] (e.g. its MJCF rgba)
    max_distance: float = 0.2  # of a pixel's brightness-scaled colour to the object's (Euclidean)
    min_saturation: float = 0.5  # (max - min) / max channel: below it a pixel is grey, never the object
    min_brightness: float = 0.1  # darker pixels have no reliable colour
    min_pixels: int = 3  # fewer matching pixels: not visible

    def validate(self) -> None:
        if len(self.colour) != 3 or max(self.colour) <= 0 or min(self.colour) < 0 or max(self.colour) > 1:
            raise ValueError(
                f"ColourTracker.colour={self.colour}: expected an RGB triple in [0, 1], not black"
            )
        if self.max_distance <= 0 or self.min_pixels < 1:
            raise ValueError("ColourTracker needs max_distance > 0 and min_pixels >= 1")

    def mask(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames [..., 3, H, W] in [0, 1] -> [..., H, W] bool: the pixels of the object's colour."""
        self.validate()
        if frames.dim() < 3 or frames.shape[-3] != 3:
            raise ValueError(f"frames: expected [..., 3, H, W] RGB, got {list(frames.shape)}")
        f = frames.float()
        top = f.max(-3).values
        low = f.min(-3).values
        scaled = f / top.clamp_min(1e-6).unsqueeze(-3)
        ref = torch.tensor(self.colour, dtype=torch.float32, device=f.device)
        ref = (ref / ref.max()).view(3, 1, 1)
        near = (scaled - ref).norm(dim=-3) <= self.max_distance
        saturated = (top - low) >= self.min_saturation * top
        return near & saturated & (top >= self.min_brightness)

    def locate(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames [..., 3, H, W] in [0, 1] -> positions [..., 2] (x, y) in pixels (NaN where not visible) and
        visible [...] bool."""
        xy, count = self.locate_and_count(frames)
        return xy, count >= self.min_pixels

    def locate_and_count(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Like `locate`, but with the number of the object's pixels [...] (float) instead of `visible`."""
        mask = self.mask(frames).float()
        h, w = mask.shape[-2:]
        count = mask.sum((-2, -1))
        ys = torch.arange(h, dtype=torch.float32, device=mask.device) + 0.5
        xs = torch.arange(w, dtype=torch.float32, device=mask.device) + 0.5
        x = (mask * xs).sum((-2, -1)) / count.clamp_min(1)
        y = (mask * ys[:, None]).sum((-2, -1)) / count.clamp_min(1)
        xy = torch.stack([x, y], -1)
        visible = (count >= self.min_pixels).unsqueeze(-1)
        return torch.where(visible, xy, torch.full_like(xy, float("nan"))), count


def centroid_distance(
    frames: torch.Tensor, colour: tuple[float, float, float], other: tuple[float, float, float]
) -> torch.Tensor:
    """Frames [..., 3, H, W] in [0, 1] -> [...]: how far apart, in pixels, the centroids of the objects of two
    colours are (e.g. a pushed cube and its target square); NaN where either is not visible."""
    a, seen_a = ColourTracker(colour).locate(frames)
    b, seen_b = ColourTracker(other).locate(frames)
    distance = (a - b).norm(dim=-1)
    return torch.where(seen_a & seen_b, distance, torch.full_like(distance, float("nan")))


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson r of two flat tensors; NaN where either does not vary."""
    a, b = a - a.mean(), b - b.mean()
    denom = (a.pow(2).sum() * b.pow(2).sum()).sqrt()
    return float((a * b).sum() / denom) if denom > 0 else float("nan")


def move_slope(moved: torch.Tensor, truth: torch.Tensor) -> float:
    """Least-squares slope through the origin of moves [n, 2] on the true moves [n, 2]: 1 moves as far as the
    truth, 0 not at all."""
    return float((moved * truth).sum() / truth.pow(2).sum())


def locate_each(
    frames: torch.Tensor, colours: list[tuple[float, float, float]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Frames [N, H, 3, h, w] in [0, 1] of N windows, window i's object of colour colours[i] -> its
    positions [N, H, 2] (NaN where not visible) and its number of pixels [N, H]."""
    xy = torch.full((*frames.shape[:2], 2), float("nan"))
    count = torch.zeros(frames.shape[:2])
    for colour in sorted(set(map(tuple, colours))):
        rows = torch.tensor([tuple(c) == colour for c in colours])
        found, pixels = ColourTracker(colour).locate_and_count(frames[rows])
        xy[rows], count[rows] = found.cpu(), pixels.cpu()
    return xy, count


def _check_windows(name, drawn, real, truth, start, colours) -> None:
    n, horizon = drawn.shape[:2]
    if real.shape != drawn.shape or tuple(truth.shape) != (n, horizon, 2) or tuple(start.shape) != (n, 2):
        raise ValueError(
            f"{name}: drawn {list(drawn.shape)}, real {list(real.shape)}, truth "
            f"{list(truth.shape)}, start {list(start.shape)} do not describe the same N windows x H steps"
        )
    if len(colours) != n:
        raise ValueError(f"{name}: {len(colours)} colours for {n} windows")


def one_step_motion(
    drawn: torch.Tensor,
    previous: torch.Tensor,
    truth: torch.Tensor,
    start: torch.Tensor,
    colours: list[tuple[float, float, float]],
    min_step: float = 0.7,
) -> dict:
    """Whether a model moves an object one step ahead from the real past.

    drawn [N, H, 3, h, w]: frame k of each window drawn from the real frames before it (not from drawn
    ones); previous [N, H, 3, h, w]: the real frame before each; truth [N, H, 2] and start [N, 2] as in
    `object_fidelity`. On steps where the object truly moves at least `min_step` px and shows in both
    frames: `slope` of the drawn move (drawn position minus the tracked previous one) on the true move,
    through the origin (1: moves it as far as the sim, 0: leaves it where it was), `r` (Pearson, x and y
    pooled), `tracker_r` and `tracker_slope` (the same for the real frame: the tracker's own ceiling),
    `persistence_slope` (what continuing the true move of the step before scores, on those of the steps that
    have a step before: how far the past alone carries a move; a model far below it is not limited by an
    unpredictable world), `area_ratio` (the drawn object's pixels over the real frame's, mean over those steps:
    below 1 where the model draws a faded or blended object, whose matching core sits between where it was and
    where it went) and `steps`."""
    _check_windows("one_step_motion", drawn, previous, truth, start, colours)
    before, before_pixels = locate_each(previous, colours)
    drawn_xy, drawn_pixels = locate_each(drawn, colours)
    drawn_move = drawn_xy - before
    true_move = truth - torch.cat([start[:, None], truth[:, :-1]], 1)
    real_after = torch.cat([before[:, 1:], torch.full_like(before[:, :1], float("nan"))], 1) - before
    pick = ~torch.isnan(drawn_move[..., 0]) & (true_move.norm(dim=-1) >= min_step)
    real_pick = pick & ~torch.isnan(real_after[..., 0])
    if pick.sum() < 3:
        nan = float("nan")
        return {
            "slope": nan,
            "r": nan,
            "tracker_r": nan,
            "tracker_slope": nan,
            "persistence_slope": nan,
            "area_ratio": nan,
            "steps": int(pick.sum()),
            "min_step_px": min_step,
        }
    d, t = drawn_move[pick], true_move[pick]
    tracked, tracked_truth = real_after[real_pick], true_move[real_pick]
    continued, continued_truth = true_move[:, :-1][pick[:, 1:]], true_move[:, 1:][pick[:, 1:]]
    # previous[k + 1] is the real frame k; real_pick has it visible, so at least min_pixels >= 1 of it
    area_pick = real_pick[:, :-1]
    area = drawn_pixels[:, :-1][area_pick] / before_pixels[:, 1:][area_pick]
    return {
        "slope": move_slope(d, t),
        "r": pearson(d.flatten(), t.flatten()),
        "tracker_r": pearson(tracked.flatten(), tracked_truth.flatten())
        if len(tracked) >= 3
        else float("nan"),
        "tracker_slope": move_slope(tracked, tracked_truth) if len(tracked) else float("nan"),
        "persistence_slope": move_slope(continued, continued_truth) if len(continued) else float("nan"),
        "area_ratio": float(area.mean()) if len(area) else float("nan"),
        "steps": int(pick.sum()),
        "min_step_px": min_step,
    }


def object_fidelity(
    drawn: torch.Tensor,
    real: torch.Tensor,
    truth: torch.Tensor,
    start: torch.Tensor,
    colours: list[tuple[float, float, float]],
    min_move: float = 4.0,
) -> dict:
    """How well drawn frames place an object, against the truth.

    drawn, real: [N, H, 3, h, w] in [0, 1] (a rollout and the real future of N windows); truth [N, H, 2]:
    the object's true pixel position at each step (e.g. the simulator's, projected); start [N, 2]: its true
    position in the last context frame; colours: each window's object colour (RGB in [0, 1]).
    A step counts where the object is visible in the real frame (not hidden by the arm).
    Returns, per horizon step (lists by h - 1): `position_error` (mean px distance of the drawn object's
    centroid to the truth where it is drawn; NaN if nowhere), `found_rate` (share of those steps where the
    drawn frame shows the object at all) and `real_error` (the tracker on real frames, its own floor); and at
    the last step, on windows whose object truly moved at least `min_move` px from `start`:
    `displacement_r` (Pearson r of drawn vs true displacement, x and y pooled, where the drawn object is
    found) and `moving_windows` (how many moved; `moving_found`: of those, drawn somewhere; `lost_windows`:
    the indices of the windows whose object shows in the real last frame and not in the drawn one). `still_error`:
    the error, on the steps `position_error` averages, of an object left where it started (what a model
    that draws no motion, or copy-last, would score)."""
    _check_windows("object_fidelity", drawn, real, truth, start, colours)
    n, horizon = drawn.shape[:2]
    drawn_xy, real_xy = locate_each(drawn, colours)[0], locate_each(real, colours)[0]
    seen = ~torch.isnan(real_xy[..., 0])  # [N, H]: the object shows in the real frame
    found = seen & ~torch.isnan(drawn_xy[..., 0])
    error = (drawn_xy - truth).norm(dim=-1)
    real_error = (real_xy - truth).norm(dim=-1)
    still_error = (start[:, None] - truth).norm(dim=-1)

    def per_step(values: torch.Tensor, where: torch.Tensor) -> list[float]:
        return [
            float(values[where[:, h], h].mean()) if where[:, h].any() else float("nan")
            for h in range(horizon)
        ]

    true_move = truth[:, -1] - start
    moving = seen[:, -1] & (true_move.norm(dim=-1) >= min_move)
    pair = moving & found[:, -1]
    drawn_move = drawn_xy[:, -1] - start
    r = pearson(drawn_move[pair].flatten(), true_move[pair].flatten()) if pair.sum() >= 3 else float("nan")
    return {
        "position_error": per_step(error, found),
        "found_rate": [float(found[:, h].sum() / seen[:, h].sum().clamp_min(1)) for h in range(horizon)],
        "real_error": per_step(real_error, seen),
        "still_error": per_step(still_error, found),
        "displacement_r": r,
        "moving_windows": int(moving.sum()),
        "moving_found": int(pair.sum()),
        "lost_windows": torch.nonzero(seen[:, -1] & ~found[:, -1]).flatten().tolist(),
    }
