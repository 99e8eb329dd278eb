"""Held-out autoregressive rollouts of a world model, scored for fidelity and executability.

Shared by the post-training loop's evaluation and benchmarks/wm_posttrain.py, so that "before" and "after"
are measured by the same code: the same start states, the same real actions and, through a generator seeded
per batch, the same sampling noise for every model that is compared.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.rl_finetune.wm_posttrain.executability import executability_terms, jerk_rms
from worldloop.rl_finetune.wm_posttrain.rollout_stability import FidelityRewardConfig, frame_fidelity
from worldloop.world_model.model import WorldModel


@torch.no_grad()
def held_out_rollouts(
    model: WorldModel,
    windows: Dataset,
    indices: list[int],
    context: int,
    horizon: int,
    fidelity: FidelityRewardConfig,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = False,
    decoder: WorldModel | None = None,
    sampler_steps: int | None = None,
) -> dict[str, torch.Tensor]:
    """Roll out from windows[i][:context] under the real actions for `horizon` frames.

    `windows` yields `frames` [T, V, 3, H, W] (uint8 or float) and `actions` [T, A] with T >= context +
    horizon (data.windows.WorldModelWindows). Returns per rollout: `ssim`, `psnr`, `score` (and `lpips`
    when `fidelity.lpips_weight > 0`) [N, horizon] against the real frames, the IDM-decoded actions
    `decoded`, the IDM's reading of the real frames `decoded_real` (its floor) and the `commanded` actions
    [N, horizon, A]. `decoder` is the model whose
    IDM decodes (default `model`): comparisons pass one decoder so every model is judged by the same IDM.
    `sampler_steps` overrides the model's denoising steps per frame.
    """
    decoder = decoder or model
    model.eval()
    dev = next(model.parameters()).device
    out: dict[str, list[torch.Tensor]] = {k: [] for k in ("decoded", "decoded_real", "commanded")}
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    for b, chunk in enumerate(tqdm(batches, desc="rollouts", disable=not progress)):
        items = [windows[i] for i in chunk]
        frames = torch.stack([it["frames"] for it in items]).to(dev)
        if frames.dtype == torch.uint8:
            frames = frames.float() / 255
        actions = torch.stack([it["actions"] for it in items]).to(dev).float()
        if frames.shape[1] < context + horizon:
            raise ValueError(
                f"windows hold {frames.shape[1]} frames; context {context} + horizon {horizon} are needed"
            )
        real = frames[:, context : context + horizon]
        commanded = actions[:, context - 1 : context - 1 + horizon]
        gen = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + b)
        generated, _, _ = model.rollout(
            frames[:, :context], actions[:, : context - 1], commanded, steps=sampler_steps, generator=gen
        )
        for k, v in frame_fidelity(generated, real, fidelity).items():
            out.setdefault(k, []).append(v.cpu())
        # The IDM reads the transition from the last context frame into the first generated one as well.
        last = frames[:, context - 1 : context]
        out["decoded"].append(decoder.infer_actions(torch.cat([last, generated], 1)).cpu())
        out["decoded_real"].append(decoder.infer_actions(torch.cat([last, real], 1)).cpu())
        out["commanded"].append(commanded.cpu())
    return {k: torch.cat(v) for k, v in out.items()}


def executability_summary(result: dict[str, torch.Tensor], spec: EmbodimentSpec) -> dict[str, float]:
    """Means over rollouts of the executability terms and the decoded-action jerk RMS."""
    terms = executability_terms(result["decoded"], result["commanded"], spec)
    summary = {f"exec/{k}": float(v.mean()) for k, v in terms.items()}
    summary["exec/jerk_rms"] = float(jerk_rms(result["decoded"], spec.fps).mean())
    summary["exec/commanded_jerk_rms"] = float(jerk_rms(result["commanded"], spec.fps).mean())
    return summary


def fidelity_summary(result: dict[str, torch.Tensor], horizons: list[int]) -> dict[str, float]:
    """SSIM / PSNR (/ LPIPS) at the given 1-based horizons and the clip means."""
    summary = {"fidelity/score": float(result["score"].mean()), "fidelity/ssim": float(result["ssim"].mean())}
    metrics = [m for m in ("ssim", "psnr", "lpips") if m in result]
    for h in horizons:
        if h <= result["ssim"].shape[1]:
            summary.update({f"{m}@{h}": float(result[m][:, h - 1].mean()) for m in metrics})
    return summary
