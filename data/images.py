"""Bring camera frames of a dataset's own size to the size a model was built for.

A researcher's cameras are rarely the model's size (SO-101 recordings are often 480x640). `resize_frames`
maps them there once, when frames are decoded, so the cache holds model-sized frames only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RESIZE_MODES = ("", "crop", "stretch")
# Frames converted to float per interpolation call: bounds the float copy of large frames.
_RESIZE_BATCH = 32


def check_resize_mode(mode: str) -> str:
    if mode not in RESIZE_MODES:
        raise ValueError(
            f"DatasetConfig.resize is {mode!r}; expected '' (sizes must match), 'crop' (centre-crop to the "
            "target's aspect ratio, then resize) or 'stretch' (resize, aspect ratio not kept)"
        )
    return mode


def _centre_crop_box(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the largest centred box of `target`'s aspect ratio inside `size`."""
    h, w = size
    th, tw = target
    if h * tw > w * th:  # taller than the target: crop rows
        ch, cw = round(w * th / tw), w
    else:
        ch, cw = h, round(h * tw / th)
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def resize_frames(frames: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """`frames` [..., 3, H, W] (uint8, or float in [0, 1]) at `size` [h, w], same dtype.

    Bilinear with antialiasing, so shrinking a 480x640 frame averages pixels instead of skipping them.
    Frames already at `size` are returned as they are.
    """
    check_resize_mode(mode)
    size = (int(size[0]), int(size[1]))
    if tuple(frames.shape[-2:]) == size:
        return frames
    if not mode:
        raise ValueError(f"frames are {tuple(frames.shape[-2:])}, expected {size}, and resizing is off")
    if mode == "crop":
        top, left, ch, cw = _centre_crop_box(tuple(frames.shape[-2:]), size)
        frames = frames[..., top : top + ch, left : left + cw]
    lead = frames.shape[:-3]
    flat = frames.reshape(-1, *frames.shape[-3:])
    out = torch.empty((flat.shape[0], flat.shape[1], *size), dtype=frames.dtype)
    is_uint8 = frames.dtype == torch.uint8
    for a in range(0, flat.shape[0], _RESIZE_BATCH):
        # uint8 goes through [0, 1] floats like lerobot's own decoding, so a cached (uint8) frame and the
        # same frame read through lerobot's __getitem__ (float) resize to identical values.
        chunk = flat[a : a + _RESIZE_BATCH].float() / 255 if is_uint8 else flat[a : a + _RESIZE_BATCH].float()
        resized = F.interpolate(chunk, size=size, mode="bilinear", antialias=True, align_corners=False)
        resized = resized.clamp(0, 1)
        out[a : a + _RESIZE_BATCH] = (
            (resized * 255).round().to(torch.uint8) if is_uint8 else resized.to(frames.dtype)
        )
    return out.reshape(*lead, *out.shape[-3:])
