"""Rollout fidelity: how close imagined frames stay to real ones, step by step over the horizon.

On held-out windows (context frames + the real future under the real actions) the world model rolls out
autoregressively and every horizon step h = 1..H is scored against the real frame:
- PSNR and SSIM of the whole frame, for the model and for the copy-last-frame baseline (the last context
  frame repeated: hard to beat at short horizons, where little of the frame moves);
- PSNR of the moving pixels, those that change between real frames h-1 and h by more than
  `moving_threshold` in some channel (where the action shows; pooled over the batch);
- action-following error: the inverse dynamics model reads consecutive frames and guesses the action
  between them; its mean absolute error against the commanded action on generated frames, next to the same
  error on real frames (the IDM's own floor);
- reward / success heads against the real labels of each transition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pytorch_msssim import ssim as _ssim


def psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-frame PSNR (dB) of frames in [0, 1]: [..., C, H, W] -> [...]."""
    return decibels((pred.float() - target.float()).pow(2).flatten(-3).mean(-1))


def decibels(mse: torch.Tensor) -> torch.Tensor:
    """PSNR (dB) of mean squared errors of frames in [0, 1]; an exact match scores the clamp's 100 dB."""
    return 10 * torch.log10(1 / mse.clamp_min(1e-10))


def pooled_psnr(pred: torch.Tensor, target: torch.Tensor) -> list[float]:
    """PSNR (dB) of the squared error averaged over the N windows at each step, frames [N, H, ..., C, h, w] in
    [0, 1] -> H values. Unlike the mean of per-frame PSNR, a window whose frame is reproduced exactly (the
    clamp's 100 dB) does not outweigh the others: copy-last scores that wherever nothing moved."""
    return decibels((pred.float() - target.float()).pow(2).flatten(2).mean(-1).mean(0)).tolist()


def ssim(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-frame SSIM of frames in [0, 1] (7x7 Gaussian window, fits 32x32 and up): [..., C, H, W] -> [...]."""
    lead = pred.shape[:-3]
    p, t = pred.float().reshape(-1, *pred.shape[-3:]), target.float().reshape(-1, *target.shape[-3:])
    return _ssim(p, t, data_range=1.0, size_average=False, win_size=7).reshape(lead)


def per_step(values: torch.Tensor) -> list[float]:
    """[N, H, ...] per-frame scores (e.g. per view) -> the mean at each horizon step, [H]."""
    return values.reshape(values.shape[0], values.shape[1], -1).mean((0, 2)).tolist()


def moving_mask(previous: torch.Tensor, current: torch.Tensor, threshold: float) -> torch.Tensor:
    """[..., C, H, W] -> [..., 1, H, W] bool: pixels that changed by more than `threshold` in some channel."""
    return ((current.float() - previous.float()).abs() > threshold).any(-3, keepdim=True)


def masked_psnr(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """PSNR over the masked pixels of all frames together (nan if no pixel is masked)."""
    m = mask.expand_as(pred).float()
    count = m.sum()
    if count == 0:
        return float("nan")
    mse = ((pred.float() - target.float()).pow(2) * m).sum() / count
    return float(decibels(mse))


@dataclass
class HeldOutWindows:
    """Real windows to score against: frames [N, C+H, (V,) 3, H, W] in [0, 1], actions [N, C+H, A],
    reward / success [N, C+H] (the labels of the transition out of each frame), joint states [N, C+H, S]
    and instructions (N), which the outcome heads read; rows [N]: the dataset row (absolute frame index) of
    each window's first frame, to look up what else the dataset holds about the window's frames."""

    frames: torch.Tensor
    actions: torch.Tensor
    reward: torch.Tensor
    success: torch.Tensor
    state: torch.Tensor | None = None
    task: list[str] | None = None
    rows: torch.Tensor | None = None

    def select(self, rows: slice, frames: slice = slice(None)) -> HeldOutWindows:
        return HeldOutWindows(
            self.frames[rows, frames],
            self.actions[rows, frames],
            self.reward[rows, frames],
            self.success[rows, frames],
            None if self.state is None else self.state[rows, frames],
            None if self.task is None else self.task[rows],
            None if self.rows is None else self.rows[rows] + range(self.frames.shape[1])[frames].start,
        )

    def __len__(self) -> int:
        return self.frames.shape[0]


def _check_horizon(total: int, context: int) -> None:
    if total - context < 1:
        raise ValueError(f"windows have {total} frames: no room for a horizon after {context} context frames")


def imagine(
    model,
    windows: HeldOutWindows,
    context: int,
    steps: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    shuffle_actions: bool = False,
    use_cache: bool = True,
    judge: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Roll the model out from each window's first `context` frames under its future actions.

    `shuffle_actions` feeds each window the future actions of another window (a fixed derangement): the
    action-sensitivity test, where a model that ignores actions would score the same as with real ones.
    Returns frames [N, H, ...], rewards [N, H], success probabilities [N, H] (None for both with
    `judge=False`, frames only, or when the heads read the joint state and the windows have none), on the
    CPU beside the windows whatever device the model is on.
    """
    n, total = windows.frames.shape[:2]
    _check_horizon(total, context)
    future = windows.actions[:, context - 1 : total - 1]  # future[:, k] leads to frame context + k
    if shuffle_actions:
        if n < 2:
            raise ValueError("shuffled actions need at least 2 windows")
        future = future.roll(1, dims=0)
    gen = torch.Generator().manual_seed(seed)
    frames, rewards, success = [], [], []
    for i in range(0, n, batch_size):
        sl = slice(i, i + batch_size)
        f, r, s = model.rollout(
            windows.frames[sl, :context],
            windows.actions[sl, : context - 1],
            future[sl],
            steps=steps,
            generator=gen,
            use_cache=use_cache,
            task=None if windows.task is None else windows.task[sl],
            future_state=None if windows.state is None else windows.state[sl, context:],
            judge=judge,
        )
        # Scored against the windows, which stay on the CPU: a model on a GPU draws there.
        frames.append(f.cpu())
        rewards.append(None if r is None else r.cpu())
        success.append(None if s is None else s.cpu())
    if rewards[0] is None:  # not judged
        return torch.cat(frames), None, None
    return torch.cat(frames), torch.cat(rewards), torch.cat(success)


def imagine_next_frames(
    model,
    windows: HeldOutWindows,
    context: int,
    steps: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
) -> torch.Tensor:
    """Each horizon frame drawn one step ahead from the real frames before it: frame context + k from real
    frames k..k+context-1 and the action between (teacher forcing at test time, so a model is judged on
    its dynamics, not on its drift). Returns frames [N, H, ...] in [0, 1], on the CPU beside the windows."""
    n, total = windows.frames.shape[:2]
    _check_horizon(total, context)
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for i in range(0, n, batch_size):
        sl = slice(i, i + batch_size)
        per_step = [
            model.rollout(
                windows.frames[sl, k : k + context],
                windows.actions[sl, k : k + context - 1],
                windows.actions[sl, k + context - 1 : k + context],
                steps=steps,
                generator=gen,
                judge=False,
            )[0].cpu()
            for k in range(total - context)
        ]
        frames.append(torch.cat(per_step, 1))
    return torch.cat(frames)


def action_following(
    idm_model, windows: HeldOutWindows, context: int, gen_frames: torch.Tensor
) -> tuple[list[float], list[float]]:
    """Action following per horizon step: the mean absolute error of `idm_model`'s inverse dynamics on (frame
    h-1, frame h) against the action commanded between them, on the drawn frames and on the real ones. The IDM
    may be another model's (a referee the drawing was never trained against)."""
    total = windows.frames.shape[1]
    first = windows.frames[:, context - 1 : context].float()
    commanded = windows.actions[:, context - 1 : total - 1]
    errors = []
    for frames in (gen_frames, windows.frames[:, context:].float()):
        inferred = idm_model.infer_actions(torch.cat([first, frames], 1))
        errors.append((inferred - commanded).abs().mean((0, 2)).tolist())
    return errors[0], errors[1]


def rollout_fidelity(
    model,
    windows: HeldOutWindows,
    context: int,
    imagined: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    moving_threshold: float = 0.05,
) -> dict[str, list[float]]:
    """Score `imagined` (what `imagine` returned, with the real actions) per horizon step (lists by h - 1)."""
    gen_frames, rewards, success = imagined
    n, total = windows.frames.shape[:2]
    horizon = total - context
    if gen_frames.shape[:2] != (n, horizon):
        raise ValueError(
            f"imagined frames {list(gen_frames.shape[:2])} do not fit {n} windows of horizon {horizon}"
        )
    real = windows.frames[:, context:].float()
    last = windows.frames[:, context - 1 : context].float().expand_as(real)
    real_prev = windows.frames[:, context - 1 : total - 1].float()
    out: dict[str, list[float]] = {
        "psnr": per_step(psnr(gen_frames, real)),
        "psnr_copy_last": per_step(psnr(last, real)),
        "ssim": per_step(ssim(gen_frames, real)),
        "ssim_copy_last": per_step(ssim(last, real)),
        "psnr_pooled": pooled_psnr(gen_frames, real),
        "psnr_pooled_copy_last": pooled_psnr(last, real),
        # Windows whose frame h is the frame before it, pixel for pixel (copy-last's PSNR there is 100 dB).
        "unchanged_fraction": (real == real_prev).flatten(2).all(-1).float().mean(0).tolist(),
        "moving_psnr": [],
        "moving_psnr_copy_last": [],
        "moving_fraction": [],
    }
    for h in range(horizon):
        mask = moving_mask(real_prev[:, h], real[:, h], moving_threshold)
        out["moving_psnr"].append(masked_psnr(gen_frames[:, h], real[:, h], mask))
        out["moving_psnr_copy_last"].append(masked_psnr(last[:, h], real[:, h], mask))
        out["moving_fraction"].append(float(mask.float().mean()))

    out["idm_error_generated"], out["idm_error_real"] = action_following(model, windows, context, gen_frames)

    if rewards is not None:  # the heads' verdicts on generated frames (absent: `imagine` had no states)
        real_reward = windows.reward[:, context - 1 : total - 1].float()
        real_success = windows.success[:, context - 1 : total - 1].bool()
        out["reward_mae"] = (rewards - real_reward).abs().mean(0).tolist()
        out["success_accuracy"] = ((success > 0.5) == real_success).float().mean(0).tolist()
    return out


def summarize(curves: dict[str, list[float]], at: tuple[int, ...] = (1, 5, 10, 20, 30)) -> dict[str, float]:
    """Scalars for logging: each curve at the given horizon steps (those within the horizon)."""
    out = {}
    for name, values in curves.items():
        for h in at:
            if h <= len(values) and not np.isnan(values[h - 1]):
                out[f"{name}@{h}"] = float(values[h - 1])
    return out
