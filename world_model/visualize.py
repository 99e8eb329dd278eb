"""Evaluation artefacts: a side-by-side video (ground truth | imagined), a still strip of chosen horizon steps
and a plot of metrics over the horizon."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def side_by_side_video(
    real: torch.Tensor, imagined: torch.Tensor, path: str | Path, fps: int = 10, scale: int = 4
) -> Path:
    """real, imagined [N, T, (V,) 3, H, W] in [0, 1]: one row per window, columns real | imagined per view."""
    import imageio.v2 as imageio

    if real.dim() == 5:
        real, imagined = real.unsqueeze(2), imagined.unsqueeze(2)
    pairs = torch.stack([real, imagined], 3)  # [N, T, V, 2, 3, H, W]
    n, t, v, two, c, h, w = pairs.shape
    # [T, N*H, V*2*W, 3]: rows are windows, columns alternate real / imagined for each view
    grid = pairs.permute(1, 0, 5, 2, 3, 6, 4).reshape(t, n * h, v * two * w, c)
    frames = (grid.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    frames = frames.repeat(scale, 1).repeat(scale, 2)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, list(frames), fps=fps, macro_block_size=1)
    return path


def horizon_strip(
    columns: dict[str, torch.Tensor], steps: list[int], path: str | Path, scale: int = 3, gap: int = 2
) -> Path:
    """PNG: one row per window; for each horizon step in `steps` (1-based) a group of the `columns` side by
    side (e.g. real | drawn | drawn under shuffled actions), groups separated by a white gap. columns: name ->
    frames [N, H, (V,) 3, h, w] in [0, 1] (the first view is shown). The image carries no labels: say
    what its columns are where it is shown."""
    import imageio.v2 as imageio

    frames = [c if c.dim() == 5 else c[:, :, 0] for c in columns.values()]
    n, horizon = frames[0].shape[:2]
    bad = [h for h in steps if not 1 <= h <= horizon]
    if bad:
        raise ValueError(f"horizon_strip: steps {bad} lie outside 1..{horizon}")
    c, hh = frames[0].shape[2:4]
    white = torch.ones(n, c, hh, gap * 2)
    groups = []
    for h in steps:
        groups += [torch.cat([f[:, h - 1] for f in frames], -1), white]
    rows = torch.cat(groups[:-1], -1)  # [N, 3, h, W]
    rows = torch.cat([rows, torch.ones(n, c, gap, rows.shape[-1])], -2)  # a gap under each window
    image = rows.permute(0, 2, 3, 1).reshape(-1, rows.shape[-1], c)
    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    pixels = pixels.repeat(scale, 0).repeat(scale, 1)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.imwrite(path, pixels)
    return path


def horizon_plot(curves: dict[str, list[float]], path: str | Path) -> Path:
    """PNG with one panel per metric (model vs copy-last where both exist) against the horizon step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("psnr", "PSNR (dB)"),
        ("ssim", "SSIM"),
        ("moving_psnr", "PSNR of moving pixels (dB)"),
        ("idm_error_generated", "action-following error (IDM MAE)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, title) in zip(axes, panels):
        steps = np.arange(1, len(curves[key]) + 1)
        ax.plot(steps, curves[key], label="world model")
        baseline = {"idm_error_generated": "idm_error_real"}.get(key, f"{key}_copy_last")
        if baseline in curves:
            label = "real frames" if key.startswith("idm") else "copy last frame"
            ax.plot(steps, curves[baseline], "--", label=label)
        ax.set_title(title)
        ax.set_xlabel("horizon step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
