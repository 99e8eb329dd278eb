"""FlowVLA: images + instruction + joint state -> a chunk of H joint targets, drawn by flow matching.

Observation tokens (per-camera image grids, instruction words, one state token) are fused by a small
transformer; the action expert (pi0-style) is a transformer over the H noisy action tokens that
cross-attends to them and predicts the flow velocity. The observation is encoded once per chunk and the
expert runs once per sampler step, so few-step sampling is cheap.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.data.features import ACTION, STATE, TASK, image_key
from worldloop.data.stats import Stats
from worldloop.vla.flow_vla import flow_matching
from worldloop.vla.flow_vla.configuration_flow_vla import FlowVLAConfig
from worldloop.vla.flow_vla.language_encoder import build_language_encoder
from worldloop.vla.flow_vla.vision_encoder import ImageTokenizer, random_shift
from worldloop.vla.pretrained import PretrainedPolicy


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of t in [0, 1], [B] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ObservationEncoder(nn.Module):
    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        self.cameras = tuple(cfg.cameras)
        self.images = ImageTokenizer(cfg.vision, len(cfg.cameras), tuple(cfg.image_size), cfg.dim)
        self.language = build_language_encoder(cfg.language, cfg.dim)
        self.state = nn.Sequential(nn.Linear(cfg.state_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        # Which kind of token each one is (image / language / state), added before fusion.
        self.kind = nn.Parameter(torch.randn(3, cfg.dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            cfg.dim, cfg.heads, 4 * cfg.dim, cfg.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.fuse = nn.TransformerEncoder(layer, cfg.obs_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.dim)

    def forward(
        self, images: list[torch.Tensor], texts: list[str], state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        text_tokens, text_pad = self.language(texts, state.device)
        condition = None
        if self.images.film is not None:
            keep = (~text_pad).unsqueeze(-1).to(text_tokens.dtype)
            condition = (text_tokens * keep).sum(1) / keep.sum(1).clamp(min=1)  # mean over the words
        image_tokens = self.images(images, condition) + self.kind[0]
        text_tokens = text_tokens + self.kind[1]
        state_token = self.state(state)[:, None] + self.kind[2]
        tokens = torch.cat([image_tokens, text_tokens, state_token], dim=1)
        b = state.shape[0]
        pad = torch.cat(
            [
                torch.zeros(b, image_tokens.shape[1], dtype=torch.bool, device=state.device),
                text_pad,
                torch.zeros(b, 1, dtype=torch.bool, device=state.device),
            ],
            dim=1,
        )
        return self.norm(self.fuse(tokens, src_key_padding_mask=pad)), pad


class ActionExpert(nn.Module):
    """Velocity field v(x_t, t | obs) over a chunk of H actions."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        self.dim = cfg.dim
        self.in_proj = nn.Linear(cfg.action_dim, cfg.dim)
        self.pos = nn.Parameter(torch.randn(cfg.chunk_size, cfg.dim) * 0.02)
        self.time = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        layer = nn.TransformerDecoderLayer(
            cfg.dim, cfg.heads, 4 * cfg.dim, cfg.dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerDecoder(layer, cfg.action_layers)
        self.norm = nn.LayerNorm(cfg.dim)
        self.out_proj = nn.Linear(cfg.dim, cfg.action_dim)
        # Start from v = 0 so the untrained sampler returns the noise mean rather than large outputs.
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, obs: torch.Tensor, obs_pad: torch.Tensor
    ) -> torch.Tensor:
        h = self.in_proj(x) + self.pos + self.time(timestep_embedding(t, self.dim))[:, None]
        h = self.blocks(h, obs, memory_key_padding_mask=obs_pad)
        return self.out_proj(self.norm(h))


class LatentSteering(nn.Module):
    """The mean of the sampler's initial noise from the observation tokens: [B, T, D] -> [B, H, A].

    Zero at initialisation, so a freshly added head leaves the policy's behaviour unchanged."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        self.chunk_size, self.action_dim = cfg.chunk_size, cfg.action_dim
        self.net = nn.Sequential(
            nn.LayerNorm(cfg.dim),
            nn.Linear(cfg.dim, cfg.steering_hidden),
            nn.SiLU(),
            nn.Linear(cfg.steering_hidden, cfg.steering_hidden),
            nn.SiLU(),
            nn.Linear(cfg.steering_hidden, cfg.chunk_size * cfg.action_dim),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, obs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, pad = obs
        keep = (~pad).to(tokens.dtype)[..., None]
        pooled = (tokens * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.net(pooled).view(-1, self.chunk_size, self.action_dim)


class FlowVLAPolicy(PretrainedPolicy):
    """The built-in VLA. Outputs unnormalised absolute joint targets; see `vla.policy` for the batch."""

    name = "flow_vla"
    config_class = FlowVLAConfig

    def __init__(self, config: FlowVLAConfig, stats: Stats):
        super().__init__(config, stats)
        self.chunk_size = config.chunk_size
        self.observation_encoder = ObservationEncoder(config)
        self.action_expert = ActionExpert(config)
        self.latent_steering = LatentSteering(config) if config.steering_hidden else None

    def enable_latent_steering(self, hidden: int, std: float = 1.0) -> None:
        """Add a latent steering head (`FlowVLAConfig.steering_hidden`) to a policy that has none; the head
        starts at mean 0, so with std 1 the policy's behaviour is unchanged. Saved with the policy."""
        if self.latent_steering is not None:
            raise ValueError(
                f"{type(self).__name__} already has a latent steering head (steering_hidden="
                f"{self.config.steering_hidden})"
            )
        self.config.steering_hidden, self.config.steering_std = hidden, std
        self.config.__post_init__()
        device = next(self.parameters()).device
        self.latent_steering = LatentSteering(self.config).to(device)

    # ---- observation ---------------------------------------------------------------------------------
    def _check_batch(self, batch: dict) -> None:
        missing = [k for k in (*[image_key(c) for c in self.config.cameras], STATE, TASK) if k not in batch]
        if missing:
            raise KeyError(f"{type(self).__name__}: batch is missing {missing}; it has {sorted(batch)}")
        if batch[STATE].shape[-1] != self.config.state_dim:
            raise ValueError(
                f"{STATE}: expected last dimension {self.config.state_dim}, got shape {tuple(batch[STATE].shape)}"
            )

    def encode_observation(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Observation tokens and their padding mask; reuse them for every sampler step."""
        self._check_batch(batch)
        images = [batch[image_key(c)] for c in self.config.cameras]
        texts = batch[TASK]
        if isinstance(texts, str):
            texts = [texts] * batch[STATE].shape[0]
        state = self.normalizer.normalize(STATE, batch[STATE].float())
        return self.observation_encoder(images, list(texts), state)

    def velocity_fn(self, obs: tuple[torch.Tensor, torch.Tensor]) -> flow_matching.VelocityFn:
        tokens, pad = obs
        return lambda x, t: self.action_expert(x, t, tokens, pad)

    # ---- training ------------------------------------------------------------------------------------
    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Flow-matching BC loss on `batch[action]` [B, H, A] (padded steps masked by `action_is_pad`)."""
        actions = batch[ACTION]
        if actions.dim() != 3 or actions.shape[1:] != (self.chunk_size, self.action_dim):
            raise ValueError(
                f"{ACTION}: expected [B, {self.chunk_size}, {self.action_dim}], got {tuple(actions.shape)}"
            )
        target = self.normalizer.normalize(ACTION, actions.float())
        if self.config.augment_shift:
            batch = dict(batch)
            for camera in self.config.cameras:
                key = image_key(camera)
                batch[key] = random_shift(batch[key], self.config.augment_shift)
        obs = self.encode_observation(batch)
        b = target.shape[0]
        alpha = torch.full((b,), self.config.time_beta_alpha, device=target.device)
        t = 1.0 - torch.distributions.Beta(alpha, torch.ones_like(alpha)).sample() * 0.999
        noise = torch.randn_like(target)
        x_t = (1 - t)[:, None, None] * noise + t[:, None, None] * target
        pred = self.action_expert(x_t, t, *obs)
        err = F.mse_loss(pred, target - noise, reduction="none").mean(-1)
        valid = (
            ~batch["action_is_pad"] if "action_is_pad" in batch else torch.ones_like(err, dtype=torch.bool)
        )
        loss = (err * valid).sum() / valid.sum().clamp(min=1)
        return loss, {"flow_mse": float(loss.detach())}

    # ---- sampling ------------------------------------------------------------------------------------
    def noise_mean(self, obs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor | float:
        """The mean of the sampler's initial noise: the steering head's output, or 0 without one."""
        return 0.0 if self.latent_steering is None else self.latent_steering(obs)

    @property
    def noise_std(self) -> float:
        return 1.0 if self.latent_steering is None else self.config.steering_std

    def initial_noise(
        self,
        obs: tuple[torch.Tensor, torch.Tensor],
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The sampler's x_0 [B, H, A]: `noise` if given, else drawn from N(`noise_mean`, `noise_std`^2 I)."""
        if noise is not None:
            return noise
        tokens = obs[0]
        eps = torch.randn(
            tokens.shape[0], self.chunk_size, self.action_dim, generator=generator, device=tokens.device
        )
        return self.noise_mean(obs) + self.noise_std * eps

    @torch.no_grad()
    def predict_action_chunk(
        self,
        batch: dict,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_steps: int | None = None,
    ) -> torch.Tensor:
        """Deterministic Euler integration of the flow from `noise` (drawn with `generator` if not given,
        around the steering head's mean when the policy has one)."""
        steps = num_steps or self.config.num_inference_steps
        obs = self.encode_observation(batch)
        x = flow_matching.euler_sample(
            self.velocity_fn(obs), self.initial_noise(obs, noise, generator), steps
        )
        return self.normalizer.unnormalize(ACTION, x)

    def sample_stochastic(
        self,
        batch: dict,
        generator: torch.Generator | None = None,
        num_steps: int | None = None,
        noise_level: float | None = None,
    ) -> flow_matching.StochasticChunk:
        """A chunk from the noise-injected sampler, in normalised space, with per-step log-probs (for RL).

        `unnormalize_actions(result.actions)` gives joint targets; `log_prob(batch, result.chain)` re-scores
        the chain under the current weights (differentiably).
        """
        with torch.no_grad():
            obs = self.encode_observation(batch)
            return flow_matching.stochastic_sample(
                self.velocity_fn(obs),
                self.initial_noise(obs, None, generator),
                num_steps or self.config.num_inference_steps,
                self.config.sde_noise_level if noise_level is None else noise_level,
                generator,
            )

    def log_prob(self, batch: dict, chain: torch.Tensor, noise_level: float | None = None) -> torch.Tensor:
        """[B] log p(chain | obs) of a denoising chain [B, K+1, H, A] whose last entry is the chunk."""
        level = self.config.sde_noise_level if noise_level is None else noise_level
        obs = self.encode_observation(batch)
        steps = flow_matching.chain_step_log_probs(self.velocity_fn(obs), chain, level)
        return steps.sum(dim=1) + flow_matching.gaussian_log_prob(
            chain[:, 0], self.noise_mean(obs), self.noise_std
        )

    def predict_action_chunk_with_prefix(
        self,
        batch: dict,
        prefix: torch.Tensor,
        inference_delay: int,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        num_steps: int | None = None,
    ) -> torch.Tensor:
        """Real-time chunking: a new chunk whose start follows `prefix` [B, P, A] (unnormalised), the part of
        the previous chunk not yet executed; its first `inference_delay` actions run while this one is
        computed, so they carry full weight and the rest of the prefix a decaying one."""
        if prefix.dim() != 3 or prefix.shape[2] != self.action_dim or prefix.shape[1] > self.chunk_size:
            raise ValueError(
                f"prefix: expected [B, P <= {self.chunk_size}, {self.action_dim}], got {tuple(prefix.shape)}"
            )
        with torch.no_grad():
            obs = self.encode_observation(batch)
        x = flow_matching.rtc_inpaint(
            self.velocity_fn(obs),
            self.initial_noise(obs, noise, generator),
            num_steps or self.config.num_inference_steps,
            self.normalizer.normalize(ACTION, prefix.float()),
            inference_delay,
            self.config.rtc_max_guidance,
        )
        return self.normalizer.unnormalize(ACTION, x.detach())

    def unnormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self.normalizer.unnormalize(ACTION, actions)
