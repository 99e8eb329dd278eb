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
        mask = self.mask(frames).float()
        h, w = mask.shape[-2:]
        count = mask.sum((-2, -1))
        ys = torch.arange(h, dtype=torch.float32, device=mask.device) + 0.5
        xs = torch.arange(w, dtype=torch.float32, device=mask.device) + 0.5
        x = (mask * xs).sum((-2, -1)) / count.clamp_min(1)
        y = (mask * ys[:, None]).sum((-2, -1)) / count.clamp_min(1)
        visible = count >= self.min_pixels
        xy = torch.stack([x, y], -1)
        return torch.where(visible.unsqueeze(-1), xy, torch.full_like(xy, float("nan"))), visible
