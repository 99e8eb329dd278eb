"""The world model's x0 prediction, with gradients, for noised frames of a clip given their clean past.

`WorldModel.rollout` is a no-grad sampler; post-training needs the same prediction as a differentiable
function of the weights, for frames the model itself generated. This runs the DiT once in its
teacher-forced layout (clean frames 0..T-1, then noisy copies of frames 1..T-1; noisy frame i sees clean
frames i-context..i-1 and itself, see world_model/attention.py), which is exactly the view a KV-cache
rollout has when it generates frame i: the past carries the rollout's context noise, the previous frame
is read beside the noisy one, and frame i is conditioned on action i-1.

It goes through the model's own teacher-forced steps (`compute_conditioners`, `compute_model_output`,
`wrap_model_output`), so the layout (which earlier frames each position reads) is defined in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worldloop.world_model import flow
from worldloop.world_model.model import WorldModel


@dataclass
class NoisedClip:
    """One draw of the noise that turns a clip into model inputs; shared by every model that is compared."""

    t: torch.Tensor  # [B, T-1] noise levels of frames 1..T-1
    noise: torch.Tensor  # [B, T-1, V, C, H, W] for frames 1..T-1
    context_noise: torch.Tensor  # [B, T, V, C, H, W] the small noise on the clean copies

    @classmethod
    def draw(cls, x: torch.Tensor, t_first: int, t_min: float, t_max: float) -> NoisedClip:
        """x [B, T, V, C, H, W]; frames from `t_first` on get t ~ U[t_min, t_max], earlier ones t = 1
        (their noisy copies are not targets and are only there because the layout has them)."""
        b, length = x.shape[:2]
        t = torch.ones(b, length - 1, device=x.device)
        t[:, t_first - 1 :] = t_min + (t_max - t_min) * torch.rand(b, length - t_first, device=x.device)
        return cls(t, torch.randn_like(x[:, 1:]), torch.randn_like(x))


def predict_x0(model: WorldModel, x: torch.Tensor, actions: torch.Tensor, noised: NoisedClip) -> torch.Tensor:
    """x0 estimates [B, T-1, V, C, H, W] (in the units of x) for the noisy copies of frames 1..T-1.

    x: the clip [B, T, V, C, H, W] as the DiT denoises it (pixels in [-1, 1], or the codec's latents); actions [B, T, A] in dataset units (action t leads from
    frame t to t+1; the last one is unused).
    """
    b, length = x.shape[:2]
    ctx_t = torch.full((b, length), model.cfg.context_noise_rollout, device=x.device)
    clean = flow.add_noise(x, noised.context_noise, ctx_t)
    noisy = flow.add_noise(x[:, 1:], noised.noise, noised.t)
    every_action = torch.ones(b, length - 1, dtype=torch.bool, device=x.device)
    a = model.normalize_action(actions)
    cond = model.compute_conditioners(clean, ctx_t, noised.t, a, every_action, base=x)
    return model.wrap_model_output(model.compute_model_output(clean, noisy, cond).out, noisy, noised.t)
