"""The motion a frame will continue: a per-pixel shift found by block matching its two previous frames.

A push model drew the pushed cube a third of the way it moved in one step, even when the same cube had moved
as far in the step before, in plain view of its context (docs/experiments.md, 2026-11-27). Motion that
persists is the commonest motion in robot video, and a whole-pixel block match finds it without learning:
for each pixel, the shift of the older frame whose window best matches the newer one's. The world model
adds this shift to the flow it predicts for warping the previous frame (`WorldModelConfig.motion_prior_radius`),
so the network learns only where motion starts, stops or turns.

Shifts follow `dit.warp`'s convention: frame[p] ~ before[p + s], so the next frame, if the motion goes on,
reads the newest frame at p + s. Uniform regions match every shift equally and keep 0 (a tiny cost per
pixel of shift breaks the tie); the edges of a moving object carry its shift, which is all a warp of a
uniform object needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def motion_prior(newest: torch.Tensor, older: torch.Tensor, radius: int, window: int = 5) -> torch.Tensor:
    """Frames newest and older [..., C, H, W] (the frame before newest) -> shifts [..., 2, H, W] (x then y,
    whole pixels, each in [-radius, radius]): at each pixel p, the s minimising the mean squared difference
    between newest and older read at + s over the `window` x `window` pixels around p (edges repeated)."""
    if newest.shape != older.shape or newest.dim() < 3:
        raise ValueError(
            f"motion_prior: frames {list(newest.shape)} and {list(older.shape)} must match, [..., C, H, W]"
        )
    if radius < 1 or window < 1 or window % 2 == 0:
        raise ValueError(f"motion_prior: radius={radius} must be >= 1 and window={window} odd")
    *lead, c, h, w = newest.shape
    new, old = newest.reshape(-1, c, h, w).float(), older.reshape(-1, c, h, w).float()
    padded = F.pad(old, (radius,) * 4, mode="replicate")
    shifts, costs = [], []
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            read = padded[:, :, radius + dy : radius + dy + h, radius + dx : radius + dx + w]  # old[p + s]
            diff = (new - read).pow(2).sum(1, keepdim=True)
            cost = F.avg_pool2d(diff, window, stride=1, padding=window // 2, count_include_pad=False)
            costs.append(cost + 1e-6 * (dx * dx + dy * dy))  # ties (uniform regions) go to the smallest shift
            shifts.append((dx, dy))
    best = torch.cat(costs, 1).argmin(1)  # [N, H, W]
    table = torch.tensor(shifts, dtype=newest.dtype, device=newest.device)  # [S, 2]
    return table[best].permute(0, 3, 1, 2).reshape(*lead, 2, h, w)
