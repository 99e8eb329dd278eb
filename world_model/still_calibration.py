"""The rollout sampler's still-pixel threshold (`sampler.still_threshold`), chosen on training windows.

Most of a robot scene stands still from one frame to the next. A model that redraws every pixel adds a small
error to the still ones at each step, and over a 30-frame rollout the scene fades (gym-pusht's T dissolved
into the background by h20), while copying the last frame keeps it exactly. With a threshold, pixels the
model changed by at most that much (and that do not touch a pixel it changed more) are copied from the frame
before; the mover is still drawn. Too high a threshold freezes slow motion too, so it is chosen by rolling
the model out from windows of its *training* episodes under their recorded actions, once per candidate, and
keeping the one with the best mean SSIM over the horizon (ties: the lowest). Held-out episodes stay unseen
for the fidelity benchmark.
"""

from __future__ import annotations

import numpy as np
import torch

from worldloop.world_model.metrics import HeldOutWindows, imagine, per_step, psnr, ssim
from worldloop.world_model.model import WorldModel

CANDIDATES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)


@torch.no_grad()
def calibrate_still_threshold(
    model: WorldModel,
    windows: HeldOutWindows,
    context: int,
    candidates: tuple[float, ...] = CANDIDATES,
    seed: int = 0,
) -> dict:
    """Roll the model out on `windows` (their first `context` frames, then their recorded actions) once per
    candidate threshold, the same noise each time. Returns {"threshold": the pick, "windows", "horizon",
    "candidates": [{"threshold", "mean_ssim", "mean_psnr", "ssim", "psnr"} per candidate],
    "copy_last": {"mean_ssim", "mean_psnr"}}. Leaves the model's sampler as it found it."""
    if not candidates:
        raise ValueError("calibrate_still_threshold needs at least one candidate threshold")
    real = windows.frames[:, context:].float()
    last = windows.frames[:, context - 1 : context].float().expand_as(real)
    original = model.cfg.sampler.still_threshold
    rows = []
    try:
        for threshold in candidates:
            model.cfg.sampler.still_threshold = threshold
            drawn = imagine(model, windows, context, seed=seed, judge=False)[0]
            s, p = per_step(ssim(drawn, real)), per_step(psnr(drawn, real))
            rows.append(
                {
                    "threshold": threshold,
                    "mean_ssim": float(np.mean(s)),
                    "mean_psnr": float(np.mean(p)),
                    "ssim": s,
                    "psnr": p,
                }
            )
    finally:
        model.cfg.sampler.still_threshold = original
    best = max(rows, key=lambda r: (r["mean_ssim"], -r["threshold"]))
    return {
        "threshold": best["threshold"],
        "windows": len(windows),
        "horizon": real.shape[1],
        "candidates": rows,
        "copy_last": {
            "mean_ssim": float(np.mean(per_step(ssim(last, real)))),
            "mean_psnr": float(np.mean(per_step(psnr(last, real)))),
        },
    }
