"""The DiffusionNFT objective: likelihood-free RL for flow models, shared by world-model post-training
(rollout stability, executability) and the policy in imagination (rl_finetune/policy_rl/nft/nft.py).

For each start state c the G rewards of its candidates are group-normalised and squashed into an
optimality probability

    A_i = (R_i - mean_G R) / (std_G R + eps),        r_i = 1/2 + 1/2 clip(A_i / Z, -1, 1)     in [0, 1].

Written here for the world model, on its x0 output. A generated frame x (the data, in [-1, 1]) is noised on the rectified-flow path x_t = (1 - t) x + t n,
t ~ U[t_min, t_max], with its generated past as clean context, exactly as the rollout saw it. With the
current model's prediction x0_theta, the frozen sampling ("old") model's x0_old and the frozen pre-trained
model's x0_ref (all from the same x_t), DiffusionNFT's implicit positive and negative policies are

    x0_+ = (1 - beta) x0_old + beta x0_theta,         x0_- = (1 + beta) x0_old - beta x0_theta

and the loss is

    L(theta) = E_{i,t} [ r_i ||x0_+ - x||^2 + (1 - r_i) ||x0_- - x||^2 ] + lambda E_{i,t} ||x0_theta - x0_ref||^2.

Velocity form: with x0 = x_t - t v, every x0 above maps to a velocity v = (x_t - x0) / t by the same affine
map, and mixtures whose weights sum to 1 map to the same mixtures of velocities, so this is DiffusionNFT's
velocity loss with the per-noise-level weight t^2 (x0 weighting, the parameterisation that trains on CPU).
Minimising it moves x0_+ towards positives and x0_- towards negatives; since x0_- mirrors x0_+ about x0_old,
the two terms pull theta the same way. The last term is the regulariser to the pre-trained model.

What it reduces to (tested in tests/test_posttrain_objective.py):
- all rewards equal (r_i = 1/2): writing a = x0_old - x and d = x0_theta - x0_old,
  1/2 ||a + beta d||^2 + 1/2 ||a - beta d||^2 = ||a||^2 + beta^2 ||d||^2, i.e. a constant plus
  beta^2 ||x0_theta - x0_old||^2: a pure pull towards the old model, zero gradient at theta = old.
  With no reward signal the model does not move (plus the regulariser).
- all rewards 1 (every sample positive) and beta = 1: ||x0_theta - x||^2, plain supervised flow matching
  (x0 regression) on the model's own samples, i.e. rejection-sampling fine-tuning.
- at theta = old the gradient is beta (2 r_i - 1) d/dtheta ||x0_theta - x||^2: reward-weighted regression
  towards samples with r_i > 1/2 and away from those with r_i < 1/2.

The same objective drives the executability stage (rl_finetune/wm_posttrain/executability.py supplies its reward) and
the policy (rl_finetune/policy_rl/nft/nft.py: a generated action chunk is the data, and `nft_loss` takes
velocities there, DiffusionNFT's own form). `nft_loss` works in whatever space its inputs share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class NFTConfig:
    beta: float = 1.0  # strength of the implicit policies (x0_+ = (1 - beta) x0_old + beta x0_theta)
    advantage_clip: float = 2.0  # Z: group-normalised advantages beyond +-Z saturate r at 0 or 1
    reference_weight: float = 0.1  # lambda: pull towards the pre-trained model
    t_min: float = 0.05  # noise levels at which the loss is taken, t ~ U[t_min, t_max]
    t_max: float = 1.0
    # The sampling ("old") model follows the trained one softly after every step:
    # theta_old <- old_decay * theta_old + (1 - old_decay) * theta. 0 is fully on-policy.
    old_decay: float = 0.5

    def validate(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"nft.beta={self.beta} must be > 0")
        if self.advantage_clip <= 0:
            raise ValueError(f"nft.advantage_clip={self.advantage_clip} must be > 0")
        if self.reference_weight < 0:
            raise ValueError(f"nft.reference_weight={self.reference_weight} must be >= 0")
        if not 0 <= self.t_min < self.t_max <= 1:
            raise ValueError(f"need 0 <= nft.t_min < nft.t_max <= 1, got {self.t_min}, {self.t_max}")
        if not 0 <= self.old_decay < 1:
            raise ValueError(f"nft.old_decay={self.old_decay} must lie in [0, 1)")


def optimality_probability(rewards: torch.Tensor, advantage_clip: float, eps: float = 1e-6) -> torch.Tensor:
    """rewards [B, G] (G candidates per start state) -> r [B, G] in [0, 1]; equal rewards give 1/2."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(
            f"rewards: expected [B, G] with G >= 2 candidates per group, got {list(rewards.shape)}"
        )
    centred = rewards - rewards.mean(1, keepdim=True)
    advantage = centred / (rewards.std(1, keepdim=True) + eps)
    return 0.5 + 0.5 * (advantage / advantage_clip).clamp(-1, 1)


def nft_loss(
    x0_theta: torch.Tensor,
    x0_old: torch.Tensor,
    x0_ref: torch.Tensor,
    data: torch.Tensor,
    r: torch.Tensor,
    cfg: NFTConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The objective of the module docstring.

    x0_theta (with gradients), x0_old, x0_ref, data: [N, ...] predictions and generated samples in the same
    space; r [N] optimality probabilities. Squared errors are averaged over everything but N.
    """
    if not (x0_theta.shape == x0_old.shape == x0_ref.shape == data.shape):
        raise ValueError(
            f"x0_theta {list(x0_theta.shape)}, x0_old {list(x0_old.shape)}, x0_ref {list(x0_ref.shape)} and "
            f"data {list(data.shape)} must have the same shape"
        )
    if r.shape != data.shape[:1]:
        raise ValueError(f"r: expected [{data.shape[0]}], got {list(r.shape)}")
    x0_old, x0_ref, data = x0_old.detach(), x0_ref.detach(), data.detach()
    positive = (1 - cfg.beta) * x0_old + cfg.beta * x0_theta
    negative = (1 + cfg.beta) * x0_old - cfg.beta * x0_theta
    pos_err = (positive - data).pow(2).flatten(1).mean(1)
    neg_err = (negative - data).pow(2).flatten(1).mean(1)
    policy = (r * pos_err + (1 - r) * neg_err).mean()
    reference = (x0_theta - x0_ref).pow(2).flatten(1).mean(1).mean()
    loss = policy + cfg.reference_weight * reference
    logs = {
        "loss/nft": policy.item(),
        "loss/reference": reference.item(),
        "nft/positive_mse": pos_err.mean().item(),
        "nft/negative_mse": neg_err.mean().item(),
    }
    return loss, logs
