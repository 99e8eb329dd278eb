"""Flow-matching samplers over action chunks: deterministic Euler, a stochastic variant with per-step
log-probabilities (for RL), and real-time-chunking (RTC) prefix inpainting.

Convention: t = 0 is pure noise, t = 1 is data; x_t = (1 - t) * noise + t * action and the network
predicts the velocity v = action - noise. A sampler integrates from t = 0 to t = 1 in `num_steps` equal
steps. `velocity(x, t)` takes x [B, H, A] and t [B] and returns [B, H, A]; everything here is in
normalised action space.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def time_grid(num_steps: int, batch_size: int, device: torch.device) -> list[torch.Tensor]:
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    return [torch.full((batch_size,), k / num_steps, device=device) for k in range(num_steps)]


def euler_sample(velocity: VelocityFn, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Integrate the flow ODE from `noise` (t=0) to an action chunk (t=1)."""
    x = noise
    dt = 1.0 / num_steps
    for t in time_grid(num_steps, x.shape[0], x.device):
        x = x + dt * velocity(x, t)
    return x


@dataclass
class StochasticChunk:
    """A chunk drawn by `stochastic_sample`, with what an RL learner needs to re-score it.

    chain: [B, K + 1, H, A] the noise x_0 and every intermediate x_k; chain[:, -1] is the (normalised) chunk.
    step_log_probs: [B, K] log N(x_{k+1} | mean_k, std_k^2) of each transition, summed over the chunk.
    """

    chain: torch.Tensor
    step_log_probs: torch.Tensor

    @property
    def actions(self) -> torch.Tensor:
        return self.chain[:, -1]

    @property
    def log_prob(self) -> torch.Tensor:
        """[B] log-probability of the whole denoising chain given the observation (x_0's N(0, I) term
        included), the quantity policy-gradient methods on flow policies (Flow-Noise, ReinFlow) use. For a
        policy with a latent steering head, x_0 is not N(0, I): score its chain with `FlowVLAPolicy.log_prob`."""
        return self.step_log_probs.sum(dim=1) + gaussian_log_prob(self.chain[:, 0], 0.0, 1.0)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor | float, std: torch.Tensor | float) -> torch.Tensor:
    """log N(x; mean, std^2 I) summed over all but the batch dimension."""
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device)
    z = (x - mean) / std
    per_dim = -0.5 * z.square() - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return per_dim.expand_as(x).flatten(1).sum(dim=1)


def sde_transition(
    velocity: VelocityFn, x: torch.Tensor, t: torch.Tensor, dt: float, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of one Euler-Maruyama step of the SDE that has the same marginals as the flow ODE.

    dx = [v + g^2/2 * score] dt + g dW, with the score of x_t recovered from v for linear interpolation:
    score = -(x - t v) / (1 - t). Without the score term injected noise would widen every marginal and
    drift the chunks away from the demonstrations.
    """
    v = velocity(x, t)
    tt = t.view(-1, *([1] * (x.dim() - 1)))
    score = -(x - tt * v) / (1.0 - tt)
    mean = x + dt * (v + 0.5 * noise_level**2 * score)
    std = noise_level * math.sqrt(dt)
    return mean, torch.full_like(mean[:, :1, :1], std)


def stochastic_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    num_steps: int,
    noise_level: float,
    generator: torch.Generator | None = None,
) -> StochasticChunk:
    """Sample a chunk with Gaussian noise injected at every step; each transition's log-prob is exact."""
    if noise_level <= 0:
        raise ValueError(f"noise_level must be > 0 for stochastic sampling, got {noise_level}")
    dt = 1.0 / num_steps
    chain, log_probs = [noise], []
    x = noise
    for t in time_grid(num_steps, x.shape[0], x.device):
        mean, std = sde_transition(velocity, x, t, dt, noise_level)
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        x = mean + std * eps
        chain.append(x)
        log_probs.append(gaussian_log_prob(x, mean, std))
    return StochasticChunk(torch.stack(chain, dim=1), torch.stack(log_probs, dim=1))


def chain_step_log_probs(velocity: VelocityFn, chain: torch.Tensor, noise_level: float) -> torch.Tensor:
    """[B, K] per-step log-probs of a given chain under the current velocity field (differentiable)."""
    num_steps = chain.shape[1] - 1
    dt = 1.0 / num_steps
    out = []
    for k, t in enumerate(time_grid(num_steps, chain.shape[0], chain.device)):
        mean, std = sde_transition(velocity, chain[:, k], t, dt, noise_level)
        out.append(gaussian_log_prob(chain[:, k + 1], mean, std))
    return torch.stack(out, dim=1)


def rtc_prefix_weights(
    chunk_size: int, prefix_len: int, inference_delay: int, device: torch.device
) -> torch.Tensor:
    """[H] soft mask of RTC (Black et al. 2025): 1 on the actions executed during the inference delay,
    exponentially decaying over the rest of the previous chunk's tail, 0 beyond it."""
    if not 0 <= inference_delay <= prefix_len <= chunk_size:
        raise ValueError(
            f"need 0 <= inference_delay ({inference_delay}) <= prefix length ({prefix_len}) "
            f"<= chunk_size ({chunk_size})"
        )
    i = torch.arange(chunk_size, device=device, dtype=torch.float32)
    weights = torch.zeros(chunk_size, device=device)
    weights[:inference_delay] = 1.0
    span = prefix_len - inference_delay
    if span > 0:
        c = (prefix_len - i[inference_delay:prefix_len]) / (span + 1)
        weights[inference_delay:prefix_len] = c * (torch.exp(c) - 1) / (math.e - 1)
    return weights


def rtc_inpaint(
    velocity: VelocityFn,
    noise: torch.Tensor,
    num_steps: int,
    prefix: torch.Tensor,
    inference_delay: int,
    max_guidance: float = 5.0,
) -> torch.Tensor:
    """Sample a chunk whose first actions follow `prefix` [B, P, A] (the previous chunk's unexecuted tail).

    Pseudo-inverse guidance as in RTC: at each step, the one-step estimate of the clean chunk
    x1 = x + (1 - t) v is pulled towards the prefix with the soft mask, through the vector-Jacobian product
    of x1 with respect to x. The guidance weight grows as t -> 1, clipped at `max_guidance`.
    """
    batch, horizon, _ = noise.shape
    weights = rtc_prefix_weights(horizon, prefix.shape[1], inference_delay, noise.device).view(1, horizon, 1)
    target = torch.zeros_like(noise)
    target[:, : prefix.shape[1]] = prefix
    dt = 1.0 / num_steps
    x = noise
    for t in time_grid(num_steps, batch, noise.device):
        tau = float(t[0])
        with torch.enable_grad():
            x_req = x.detach().requires_grad_(True)
            v = velocity(x_req, t)
            x1 = x_req + (1.0 - tau) * v
            error = (target - x1) * weights
            (grad,) = torch.autograd.grad(x1, x_req, grad_outputs=error)
        r2 = (1.0 - tau) ** 2 / (tau**2 + (1.0 - tau) ** 2)
        beta = max_guidance if tau == 0.0 else min(max_guidance, (1.0 - tau) / (tau * r2))
        x = x + dt * (v.detach() + beta * grad)
    return x
