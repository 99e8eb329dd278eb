"""The world model: video DiT + outcome heads + inverse dynamics, its training loss and its rollouts.

Frames enter and leave as floats in [0, 1] ([B, T, 3, H, W] for one camera, [B, T, V, 3, H, W] for
several); actions, rewards and states in dataset units (normalised inside with the dataset stats).

Action alignment (LeRobot): action[t] is commanded at frame t and leads to frame t+1, so frame t is
generated under action[t-1]. `rollout(context_frames [B, C, ...], context_actions [B, C-1, A],
future_actions [B, H, A])` returns the H frames that follow; future_actions[:, k] leads to frame C+k.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from worldloop.common.checkpoint import load_model_weights, save_tensors
from worldloop.common.config import load_config, save_config
from worldloop.common.embodiment import EmbodimentSpec, load_embodiment_file, write_embodiment
from worldloop.data.features import ACTION, ENVIRONMENT_STATE, STATE
from worldloop.data.stats import ENVIRONMENT_MOTION, Normalizer, Stats, load_stats, save_stats
from worldloop.world_model import flow
from worldloop.world_model.codec import FrameCodec
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiT
from worldloop.world_model.heads import OutcomeHeads
from worldloop.world_model.idm import InverseDynamicsModel
from worldloop.world_model.metrics import moving_mask
from worldloop.world_model.sampler import SamplerConfig, sample

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class NoisedWindow:
    """A training window on the flow path (all encoded: [-1, 1] pixels or latents, [B, T, V, C, h, w])."""

    x: torch.Tensor  # [B, T, ...] the window, noise-free
    clean: torch.Tensor  # [B, T, ...] every frame as context, lightly noised at ctx_t
    ctx_t: torch.Tensor  # [B, T] the context frames' noise levels
    noisy: torch.Tensor  # [B, T-1, ...] frames 1..T-1 as targets, noised at target_t
    noise: torch.Tensor  # [B, T-1, ...] the targets' noise
    target_t: torch.Tensor  # [B, T-1] the targets' noise levels
    base: torch.Tensor | None = None  # [B, T, ...] the noise-free frames behind `clean` (None: x)


@dataclass
class TeacherForcedConditioners:
    """What the DiT reads besides the frames in a teacher-forced pass over T context frames then T-1 targets
    (2T-1 positions)."""

    prev: torch.Tensor  # [B, 2T-1, V, C * k, h, w] each position's k previous (context) frames, newest first
    actions: torch.Tensor  # [B, 2T-1, A'] features of the action that leads to each position's frame
    valid: torch.Tensor  # [B, 2T-1] bool: the action is known and kept
    ctx_t: torch.Tensor  # [B, T] the context frames' noise levels
    target_t: torch.Tensor  # [B, T-1] the targets' noise levels
    index: torch.Tensor  # [2T-1] each position's time index (0..T-1, then 1..T-1)
    prev_t: torch.Tensor  # [B, 2T-1] the noise level of the newest previous frame each position reads
    # [B, T-1, V, C, h, w] the frame each target's residual starts from (None: the newest of prev); the context
    # positions draw no output (`VideoDiT.forward`'s output_frames), so they need none
    residual_base: torch.Tensor | None = None


class TeacherForcedOutput(NamedTuple):
    """What one teacher-forced DiT pass gives for the T-1 targets of a window."""

    out: torch.Tensor  # [B, T-1, ...] the raw output, in the parameterisation's own units
    tokens: torch.Tensor  # [B, T-1, frame_len, D] the last block's tokens (what auxiliary heads read)


@dataclass
class RolloutContext:
    """A rollout's context window before its next frame."""

    last: torch.Tensor  # [B, 1, V, C, h, w] the last frame (encoded, noised as context)
    previous: (
        torch.Tensor
    )  # [B, 1, V, C * dit.previous_frames, h, w] what the next frame's `prev` input reads
    previous_action: torch.Tensor | None  # [B, 1, A] the normalised action that led to it (None: unknown)
    cache: KVCache | None  # keys/values of the last `dit.context_frames` frames (KV-cache path)
    history: dict | None  # every frame's DiT inputs so far (recompute path)
    next_index: int  # the next frame's time index
    last_clean: torch.Tensor  # [B, 1, V, C, h, w] the last frame before context noise (still pixels copy it)

    def index(self) -> torch.Tensor:
        return torch.tensor([self.next_index], device=self.last.device)


def moved_pixels(previous: torch.Tensor, current: torch.Tensor, threshold: float) -> torch.Tensor:
    """[..., C, h, w] twice -> [..., 1, h, w] float, 1 where some channel changed by more than `threshold`,
    grown by one pixel each way (a mover's soft edge counts as moving), else 0."""
    moving = moving_mask(previous, current, threshold).float()
    return F.max_pool2d(moving.flatten(0, -4), 3, stride=1, padding=1).view_as(moving)


def keep_still_pixels(drawn: torch.Tensor, previous: torch.Tensor, threshold: float) -> torch.Tensor:
    """A drawn frame [..., C, h, w] with the pixels that stood still (`moved_pixels` is 0) copied from the
    frame before it (same shape). Gradient flows through the drawn pixels only."""
    return torch.where(moved_pixels(previous, drawn, threshold) > 0, drawn, previous)


def identity_stats(action_dim: int, state_dim: int) -> Stats:
    """Stats that leave values unchanged: for tests and for models built before a dataset is known."""
    return {
        key: {
            "mean": np.zeros(d),
            "std": np.ones(d),
            "min": -np.ones(d),
            "max": np.ones(d),
            "q01": -np.ones(d),
            "q99": np.ones(d),
            "count": np.array([1]),
        }
        for key, d in ((ACTION, action_dim), (STATE, state_dim))
    }


EMBODIMENT_FILE = "embodiment.yaml"  # in a checkpoint directory: the robot the model was trained for


class WorldModel(nn.Module):
    def __init__(
        self, cfg: WorldModelConfig, stats: dict | None = None, embodiment: EmbodimentSpec | None = None
    ):
        """`embodiment`: the robot the model acts for (saved with it); None for a model built before a
        dataset is known, or loaded from a checkpoint written before embodiments were stored."""
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embodiment = embodiment
        if embodiment is not None:
            for what, dim in (("dit.action_dim", cfg.dit.action_dim), ("idm.state_dim", cfg.idm.state_dim)):
                if dim != embodiment.num_joints:
                    raise ValueError(
                        f"world model {what}={dim} but embodiment {embodiment.name!r} has "
                        f"{embodiment.num_joints} joints"
                    )
        self.dit = VideoDiT(cfg.dit)
        self.heads = OutcomeHeads(cfg.heads, cfg.dit.num_views, cfg.idm.state_dim)
        self.codec = FrameCodec(cfg.autoencoder)
        self.pixel_size = cfg.frame_size
        if self.codec.latent and self.codec.latent_shape() != (cfg.dit.channels, cfg.dit.image_size):
            c, size = self.codec.latent_shape()
            raise ValueError(
                f"autoencoder {cfg.autoencoder.path} makes {c}x{size}x{size} latents from "
                f"{cfg.autoencoder.image_size}px frames: set dit.channels={c} and dit.image_size={size}"
            )
        if not self.codec.latent and cfg.dit.channels != 3:
            raise ValueError(f"dit.channels={cfg.dit.channels}: pixel space (no autoencoder.path) needs 3")
        self.idm = InverseDynamicsModel(cfg.idm, 3, cfg.dit.num_views)
        self.stats = stats or identity_stats(cfg.dit.action_dim, cfg.idm.state_dim)
        for key, dim in ((ACTION, cfg.dit.action_dim), (STATE, cfg.idm.state_dim)):
            if key not in self.stats or len(self.stats[key]["mean"]) != dim:
                raise ValueError(
                    f"world model stats need {key!r} of size {dim} (mean/std); got {sorted(self.stats)}"
                )
        self.normalizer = Normalizer(self.stats, {ACTION: "mean_std", STATE: "mean_std"})
        self.object_state = None
        if cfg.object_state_dim:
            for key, name in ((ENVIRONMENT_STATE, "object_state"), (ENVIRONMENT_MOTION, "object_motion")):
                size = len(self.stats.get(key, {}).get("mean", ()))
                if size != cfg.object_state_dim:
                    raise ValueError(
                        f"world model object_state_dim={cfg.object_state_dim} needs stats of {key!r} of that "
                        f"size; got {size or 'none'}"
                    )
                mean, std = (
                    torch.as_tensor(self.stats[key][f], dtype=torch.float32) for f in ("mean", "std")
                )
                self.register_buffer(f"{name}_mean", mean, persistent=False)
                self.register_buffer(
                    f"{name}_scale", std.square().mean().sqrt().clamp_min(1e-6), persistent=False
                )
            self.object_state = nn.Linear(cfg.dit.frame_len * cfg.dit.width, 2 * cfg.object_state_dim)

    # ---- normalisation -------------------------------------------------------------------------------
    def normalize_action(self, a: torch.Tensor) -> torch.Tensor:
        return self.normalizer.normalize(ACTION, a)

    def action_features(self, a: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """The DiT's action input for normalised actions a [B, N, A]: a itself and, with `dit.action_delta`,
        the change from the action before it (`previous` [B, 1, A] before a[:, 0]; zero change if unknown)."""
        if not self.cfg.dit.action_delta:
            return a
        before = torch.cat([a[:, :1] if previous is None else previous, a[:, :-1]], 1)
        return torch.cat([a, a - before], -1)

    def lead_action_features(self, a: torch.Tensor) -> torch.Tensor:
        """Per-frame conditioning for a window's normalised actions a [B, T, A] (a[:, t] leads frame t to
        t + 1): frame i gets the features of action i - 1; frame 0 gets zeros (it is masked as invalid)."""
        feats = self.action_features(a)
        return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1)

    def unnormalize_action(self, a: torch.Tensor) -> torch.Tensor:
        return self.normalizer.unnormalize(ACTION, a)

    def normalize_state(self, s: torch.Tensor) -> torch.Tensor:
        return self.normalizer.normalize(STATE, s)

    def outcomes(
        self,
        pixels: torch.Tensor,
        task: list[str] | None,
        state: torch.Tensor | None,
        first: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The heads on frames [B, ..., V, 3, H, W] in [-1, 1], with the frames' joint states [B, ..., S] in
        dataset units (read only with `heads.use_state`) and the episode's first frame [B, V, 3, H, W] in
        [-1, 1] (read only with `heads.use_first_frame`)."""
        heads = self.cfg.heads
        if heads.use_state and state is None:
            raise ValueError(
                "heads.use_state=True: the outcome heads need the joint state of each frame "
                "(observation.state in training, `future_state` in a rollout)"
            )
        if heads.use_first_frame and first is None:
            raise ValueError(
                "heads.use_first_frame=True: the outcome heads need the episode's first frame "
                "(`first_frame` of a WorldModelWindows item in training, the reset frame in a rollout)"
            )
        return self.heads(
            pixels,
            task,
            self.normalize_state(state.float()) if heads.use_state else None,
            first if heads.use_first_frame else None,
        )

    def _first_frame(self, first_frame: torch.Tensor | None) -> torch.Tensor | None:
        """A batch's `first_frame` [B, (V,) 3, H, W] (uint8 or [0, 1]) -> [B, V, 3, H, W] in [-1, 1]."""
        if first_frame is None:
            return None
        first, _ = self._with_views(first_frame[:, None], "first_frame")
        return self.frames_in(first[:, 0])

    def heads_loss(
        self,
        frames: torch.Tensor,
        outcomes: dict[str, torch.Tensor],
        state: torch.Tensor | None = None,
        task: list[str] | None = None,
        first_frame: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss of the outcome heads alone on windows (arguments as `compute_loss`; the rest of the model is
        left alone): to fit the heads again, or on more labelled episodes, without the diffusion model."""
        if not outcomes:
            raise KeyError("heads-only training needs next.reward/success/done labels; the batch has none")
        pixels, _ = self._with_views(frames, "frames")
        loss = self.outcome_heads_loss(self.frames_in(pixels), outcomes, state, task, first_frame)
        return loss, {"loss/heads": loss.item()}

    @staticmethod
    def frames_in(frames: torch.Tensor) -> torch.Tensor:
        """[0, 1] (or uint8) -> [-1, 1]."""
        if frames.dtype == torch.uint8:
            frames = frames.float() / 255
        return frames * 2 - 1

    @staticmethod
    def frames_out(x: torch.Tensor) -> torch.Tensor:
        return ((x.clamp(-1, 1) + 1) / 2).contiguous()

    def _with_views(self, frames: torch.Tensor, name: str) -> tuple[torch.Tensor, bool]:
        """Accept [B, T, C, H, W] for one camera; return [B, T, V, C, H, W] and whether we added V."""
        d = self.cfg.dit
        if frames.dim() == 5 and d.num_views == 1:
            frames = frames.unsqueeze(2)
            added = True
        else:
            added = False
        size = self.pixel_size
        if frames.dim() != 6 or tuple(frames.shape[2:]) != (d.num_views, 3, size, size):
            raise ValueError(
                f"{name}: expected [B, T, {d.num_views}, 3, {size}, {size}] "
                f"(or [B, T, 3, H, W] with one camera), got {list(frames.shape)}"
            )
        return frames, added

    # ---- training ------------------------------------------------------------------------------------
    def freeze_all_but_heads(self) -> WorldModel:
        """For heads-only training (`forward(..., heads_only=True)`): only the outcome heads get gradients."""
        self.requires_grad_(False)
        self.heads.requires_grad_(True)
        return self

    def forward(self, batch: dict, heads_only: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
        """Training loss on a batch of `data.windows.WorldModelWindows` items (what the shared loop calls);
        `heads_only`: the outcome heads' loss alone (`heads_loss`)."""
        needed = ("frames",) if heads_only else ("frames", "actions")
        missing = [k for k in needed if k not in batch]
        if missing:
            raise KeyError(
                f"world-model batch lacks {missing}; has {sorted(batch)} (expected WorldModelWindows items)"
            )
        outcomes = {k: batch[k] for k in ("reward", "success", "done") if k in batch}
        if heads_only:
            return self.heads_loss(
                batch["frames"], outcomes, batch.get("state"), batch.get("task"), batch.get("first_frame")
            )
        return self.compute_loss(
            batch["frames"],
            batch["actions"],
            outcomes,
            batch.get("state"),
            batch.get("task"),
            batch.get("first_frame"),
            batch.get("environment_state"),
        )

    def compute_loss(
        self,
        frames: torch.Tensor,
        actions: torch.Tensor,
        outcomes: dict[str, torch.Tensor] | None = None,
        state: torch.Tensor | None = None,
        task: list[str] | None = None,
        first_frame: torch.Tensor | None = None,
        environment_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Teacher-forced diffusion-forcing loss over a window, plus head and IDM losses.

        frames [B, T, (V,) C, H, W] in [0, 1]; actions [B, T, A]; outcomes: optional `next.reward`,
        `next.success`, `next.done` of each frame [B, T] as keys `reward`, `success`, `done`; state [B, T, S]
        (read by the IDM with idm.use_state and by the heads with heads.use_state);
        task: the B instructions (read by the outcome heads); first_frame [B, (V,) 3, H, W]: the episode's
        first frame (read by the heads with heads.use_first_frame); environment_state [B, T, E]: each frame's
        recorded object state (needed with object_state_weight > 0).
        Every frame 1..T-1 is a target, denoised from its own noise level while seeing clean (lightly
        noised) earlier frames, the same view it has in a KV-cache rollout.
        Steps: encode_window, noise_window, sample_action_keep, self_force_context (with self_forcing),
        compute_conditioners, compute_model_output, motion_weights, diffusion_loss (through
        wrap_model_output), outcome_heads_loss (with outcomes), object_state_loss (with
        object_state_weight), self_rollout_loss (with self_rollout_frames), counterfactual_loss (with
        counterfactual_weight: window i of the batch's first half and window i of its second are a
        counterfactual pair), drawn_idm_loss (with self_rollout_idm_weight), idm_loss.
        """
        cfg = self.cfg
        if cfg.object_state_weight > 0 and environment_state is None:
            raise ValueError(
                f"object_state_weight={cfg.object_state_weight} but the batch has no environment_state: "
                f"train on a dataset that records {ENVIRONMENT_STATE}, or set object_state_weight=0"
            )
        pixels, x, a = self.encode_window(frames, actions)
        window = self.noise_window(x)
        keep = self.sample_action_keep(window.target_t)
        if cfg.self_forcing > 0:
            window = self.self_force_context(window, a)
        base = window.x if window.base is None else window.base
        cond = self.compute_conditioners(window.clean, window.ctx_t, window.target_t, a, keep, base=base)
        out, tokens = self.compute_model_output(window.clean, window.noisy, cond)
        weights = self.motion_weights(x)
        loss, x0_mse = self.diffusion_loss(out, window, weights)
        logs = {"loss/diffusion": loss.item(), "loss/x0_mse": x0_mse.item()}
        if cfg.object_state_weight > 0:
            object_loss = self.object_state_loss(tokens, environment_state)
            loss = loss + cfg.object_state_weight * object_loss
            logs["loss/object_state"] = object_loss.item()
        if outcomes:
            head_loss = self.outcome_heads_loss(pixels, outcomes, state, task, first_frame)
            loss = loss + cfg.head_loss_weight * head_loss
            logs["loss/heads"] = head_loss.item()
        if cfg.self_rollout_frames > 0:
            paired = cfg.counterfactual_weight > 0
            drawn = self.self_rollout(x, a, paired=paired)
            rollout_loss = self.self_rollout_loss(x, drawn, weights)
            loss = loss + cfg.self_rollout_weight * rollout_loss
            logs["loss/self_rollout"] = rollout_loss.item()
            if paired:
                pair_loss = self.counterfactual_loss(x, drawn)
                loss = loss + cfg.counterfactual_weight * pair_loss
                logs["loss/counterfactual"] = pair_loss.item()
            if cfg.self_rollout_idm_weight > 0:
                drawn_idm_loss = self.drawn_idm_loss(x, a, drawn)
                loss = loss + cfg.self_rollout_idm_weight * drawn_idm_loss
                logs["loss/drawn_idm"] = drawn_idm_loss.item()
        idm_loss = self.idm_loss(pixels, a, state)
        logs["loss/idm"] = idm_loss.item()
        loss = loss + cfg.idm_loss_weight * idm_loss
        logs["loss/total"] = loss.item()
        return loss, logs

    def encode_window(
        self, frames: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalise and encode a window: frames [B, T, (V,) 3, H, W] in [0, 1] (or uint8) and actions
        [B, T, A] in dataset units -> pixels [B, T, V, 3, H, W] in [-1, 1], the DiT's frames x [B, T, V, C, h, w]
        (the pixels themselves, or their latents) and the normalised actions [B, T, A]."""
        pixels, _ = self._with_views(frames, "frames")
        pixels = self.frames_in(pixels)
        x = self.codec.encode(pixels)
        b, t_len = x.shape[:2]
        if t_len < 2:
            raise ValueError(f"training windows need at least 2 frames, got {t_len}")
        a_dim = self.cfg.dit.action_dim
        if actions.shape[:2] != (b, t_len) or actions.shape[-1] != a_dim:
            raise ValueError(f"actions: expected [{b}, {t_len}, {a_dim}], got {list(actions.shape)}")
        return pixels, x, self.normalize_action(actions)

    def noise_window(self, x: torch.Tensor) -> NoisedWindow:
        """Sample noise levels and noise the window x [B, T, ...] (encoded): every frame as
        context at a level ~ U(0, context_noise_max), frames 1..T-1 as targets at levels drawn from
        `noise_distribution` above `noise_floor`. Draws from the global RNG: context levels, context noise,
        target levels, target noise, in that order."""
        cfg = self.cfg
        b, t_len = x.shape[:2]
        ctx_t = torch.rand(b, t_len, device=x.device) * cfg.context_noise_max
        clean = flow.add_noise(x, torch.randn_like(x), ctx_t)
        target_t = flow.sample_training_t((b, t_len - 1), cfg.noise_distribution, device=x.device)
        target_t = cfg.noise_floor + (1 - cfg.noise_floor) * target_t
        noise = torch.randn_like(x[:, 1:])
        return NoisedWindow(x, clean, ctx_t, flow.add_noise(x[:, 1:], noise, target_t), noise, target_t)

    def sample_action_keep(self, target_t: torch.Tensor) -> torch.Tensor:
        """Action dropout: which targets [B, T-1] (shaped like their noise levels) see their
        action (True) and which are trained unconditionally for classifier-free guidance (one global draw)."""
        return torch.rand(target_t.shape, device=target_t.device) >= self.cfg.action_dropout

    def self_force_context(self, window: NoisedWindow, a: torch.Tensor) -> NoisedWindow:
        """Self-forcing (`self_forcing` > 0): the window with context frames 1..T-1 of a `self_forcing`
        share of its B windows replaced by the model's own no-grad estimates of them, from one teacher-forced
        pass at noise levels ~ U(0.5, 1) (where a few-step sampler works), re-noised as context. a [B, T, A]:
        the normalised actions."""
        cfg = self.cfg
        x, clean = window.x, window.clean
        b = x.shape[0]
        with torch.no_grad():
            own_t = 0.5 + 0.5 * torch.rand(window.target_t.shape, device=x.device)
            own_noisy = flow.add_noise(x[:, 1:], torch.randn_like(x[:, 1:]), own_t)
            all_actions = torch.ones_like(window.target_t, dtype=torch.bool)
            cond = self.compute_conditioners(clean, window.ctx_t, own_t, a, all_actions, base=x)
            own = self.clamp_pixels(
                self.wrap_model_output(
                    self.compute_model_output(clean, own_noisy, cond).out, own_noisy, own_t
                )
            )
            own_noised = flow.add_noise(own, torch.randn_like(own), window.ctx_t[:, 1:])
            pick = (torch.rand(b, device=x.device) < cfg.self_forcing).view(b, *[1] * (x.dim() - 1))
            clean = torch.cat([clean[:, :1], torch.where(pick, own_noised, clean[:, 1:])], 1)
            base = torch.cat([x[:, :1], torch.where(pick, own, x[:, 1:])], 1)
        return replace(window, clean=clean, base=base)

    def self_rollout(self, x: torch.Tensor, a: torch.Tensor, paired: bool = False) -> list[torch.Tensor]:
        """The model's own rollout of a window's last `self_rollout_frames` frames: from the real frames
        before them (x [B, T, ...] encoded) under the window's normalised actions a [B, T, A], as `rollout`
        draws frames (the model's sampler, noise from the global RNG). With `paired`, window i of the second
        half is drawn from the same noise as window i of the first (B even). Returns the k drawn frames, each
        [B, 1, ...] (encoded): the last `self_rollout_grad_frames` are built with gradient, the others without."""
        cfg = self.cfg
        k = cfg.self_rollout_frames
        c = x.shape[1] - k
        if c < 1:
            raise ValueError(
                f"self_rollout_frames={k} needs training windows of more than {k} frames, got {x.shape[1]}"
            )
        if paired and x.shape[0] % 2:
            raise ValueError(
                f"paired self-rollout needs an even batch (two halves of pairs), got {x.shape[0]}"
            )
        with torch.no_grad():
            context = self.context_from_encoded(x[:, :c], a[:, : c - 1])
        frames = []
        for j in range(k):
            with torch.set_grad_enabled(j >= k - cfg.self_rollout_grad_frames):
                a_norm = a[:, c - 1 + j : c + j]
                feats = self.action_features(a_norm, context.previous_action)
                noise = None
                if paired:
                    noise = torch.randn(x[: x.shape[0] // 2, :1].shape, device=x.device).repeat(
                        2, *[1] * (x.dim() - 1)
                    )
                x0 = self.denoise_next_frame(context, feats, cfg.sampler, None, noise)
                if j < k - 1:  # the last frame is no one's context
                    context = self.append_to_context(context, x0, feats, a_norm, None)
            frames.append(x0)
        return frames

    def self_rollout_loss(
        self, x: torch.Tensor, drawn: list[torch.Tensor], weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """MSE of the self-rollout's frames that carry gradient (`drawn`, what `self_rollout` returned) against
        the real ones (x [B, T, ...] encoded), weighted by `weights` [B, T-1, ...] (`motion_weights`) when
        given."""
        m = self.cfg.self_rollout_grad_frames
        return self.frame_loss(
            torch.cat(drawn[-m:], 1), x[:, x.shape[1] - m :], None if weights is None else weights[:, -m:]
        )

    def counterfactual_loss(self, x: torch.Tensor, drawn: list[torch.Tensor]) -> torch.Tensor:
        """MSE of the drawn difference between counterfactual pairs against the real difference, over the
        self-rollout's frames that carry gradient (`drawn`, from `self_rollout(..., paired=True)`): window i of
        x [B, T, ...]'s first half against window i of its second. Unweighted: where a pair's futures differ is
        already where the term looks."""
        m, n = self.cfg.self_rollout_grad_frames, x.shape[0] // 2
        d, r = torch.cat(drawn[-m:], 1), x[:, x.shape[1] - m :]
        return F.mse_loss(d[:n] - d[n:], r[:n] - r[n:])

    def drawn_idm_loss(self, x: torch.Tensor, a: torch.Tensor, drawn: list[torch.Tensor]) -> torch.Tensor:
        """The IDM's action error on the self-rollout's frames that carry gradient (`drawn`, pixels), each
        read with the frame before it (drawn, or the last real one), against the normalised actions a [B, T, A]
        that were commanded between them. The IDM's weights are detached here: this term moves the drawing
        toward frames that show their action, never the IDM toward frames that are drawn (it learns from real
        frames only, `idm_loss`)."""
        m, k = self.cfg.self_rollout_grad_frames, len(drawn)
        t_len = x.shape[1]
        before = drawn[-m - 1] if k > m else x[:, t_len - m - 1 : t_len - m]
        seq = torch.cat([before, *drawn[-m:]], 1)  # [B, m + 1, V, 3, H, W]
        frozen = {name: p.detach() for name, p in self.idm.named_parameters()}
        pred = torch.func.functional_call(
            self.idm, frozen, (seq[:, :-1].flatten(0, 1), seq[:, 1:].flatten(0, 1))
        )
        return F.mse_loss(pred, a[:, t_len - m - 1 : t_len - 1].flatten(0, 1))

    def motion_weights(self, x: torch.Tensor) -> torch.Tensor | None:
        """Loss weights [B, T-1, V, 1, h, w] of frames 1..T-1 of an encoded window x [B, T, V, C, h, w]:
        1 + motion_loss_weight where a frame moved since the one before it (`moved_pixels` at
        motion_threshold; with motion_loss_span `window`: where any frame of the window moved since the one
        before it), else 1; None when motion_loss_weight is 0."""
        cfg = self.cfg
        if cfg.motion_loss_weight == 0:
            return None
        moved = moved_pixels(x[:, :-1], x[:, 1:], cfg.motion_threshold)
        if cfg.motion_loss_span == "window":
            moved = moved.amax(1, keepdim=True).expand_as(moved)
        return 1 + cfg.motion_loss_weight * moved

    @staticmethod
    def frame_loss(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """MSE of frames, or with weights (broadcast over channels) their weighted mean divided by the
        weights' mean."""
        if weights is None:
            return F.mse_loss(pred, target)
        weights = weights.expand_as(pred)
        return (weights * (pred - target).square()).mean() / weights.mean()

    def compute_conditioners(
        self,
        clean: torch.Tensor,
        ctx_t: torch.Tensor,
        target_t: torch.Tensor,
        a: torch.Tensor,
        keep: torch.Tensor,
        base: torch.Tensor | None = None,
    ) -> TeacherForcedConditioners:
        """What the DiT reads besides the frames in the teacher-forced layout (T context frames,
        then T-1 targets): context frames clean [B, T, ...] at levels ctx_t [B, T], targets at levels target_t
        [B, T-1], normalised actions a [B, T, A] (frame i is generated under action i - 1; frame 0 has none),
        keep [B, T-1]: which targets see their action; base [B, T, ...]: the noise-free frames behind clean
        (read with `previous_frames_share_noise`)."""
        b, t_len = clean.shape[:2]
        dev = clean.device
        lead_actions = self.lead_action_features(a)  # frame i <- action i-1
        has_action = torch.ones(b, t_len, dtype=torch.bool, device=dev)
        has_action[:, 0] = False
        # [B, T+1, ...]: position i reads frames i-1, i-2, ...; a target frame i reads what context frame i does
        prev = self.previous_frames(clean, base, ctx_t)
        residual_base = None
        if self.cfg.noise_free_residual_base:  # what `prev` reads newest, from the noise-free frames
            residual_base = self.previous_frames(clean if base is None else base)[
                :, 1:t_len, :, : clean.shape[3]
            ]
        return TeacherForcedConditioners(
            prev=torch.cat([prev[:, :t_len], prev[:, 1:t_len]], 1),
            actions=torch.cat([lead_actions, lead_actions[:, 1:]], 1),
            valid=torch.cat([has_action, keep], 1),
            ctx_t=ctx_t,
            target_t=target_t,
            index=torch.cat([torch.arange(t_len, device=dev), torch.arange(1, t_len, device=dev)]),
            prev_t=torch.cat([ctx_t[:, :1], ctx_t[:, :-1], ctx_t[:, :-1]], 1),
            residual_base=residual_base,
        )

    def previous_frames(
        self, clean: torch.Tensor, base: torch.Tensor | None = None, ctx_t: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The DiT's `prev` input for every frame of clean [B, T, V, C, h, w] and for the frame after them:
        [B, T+1, V, C * k, h, w] with k = dit.previous_frames, position i holding frames i-1, i-2, ... i-k
        (newest first) stacked on channels; frames before the first repeat the first.
        With `previous_frames_share_noise` and base (the noise-free frames behind clean, noised at levels
        ctx_t [B, T]), the older frames carry the newest one's noise: each is the newest plus (1 - t) times the
        noise-free change back to it, so their difference is the motion alone."""
        k, t_len = self.cfg.dit.previous_frames, clean.shape[1]
        index = (
            (torch.arange(t_len + 1)[:, None] - torch.arange(1, k + 1)[None]).clamp(min=0).to(clean.device)
        )
        picked = clean[:, index]  # [B, T+1, k, V, C, h, w]
        if self.cfg.previous_frames_share_noise and base is not None:
            older = base[:, index]
            signal = (1 - ctx_t[:, index[:, 0]])[..., None, None, None, None, None]  # the newest frame's
            picked = picked[:, :, :1] - signal * (older[:, :, :1] - older)
        b, n, _, v, c, h, w = picked.shape
        return picked.transpose(2, 3).reshape(b, n, v, k * c, h, w)

    def compute_model_output(
        self, clean: torch.Tensor, noisy: torch.Tensor, cond: TeacherForcedConditioners
    ) -> TeacherForcedOutput:
        """One teacher-forced DiT pass: context frames clean [B, T, ...] and noisy targets
        [B, T-1, ...] scaled for the parameterisation -> the targets' raw output (in the parameterisation's
        own units: x0, velocity or the EDM network output) and last-block tokens."""
        cfg = self.cfg
        sd, par = cfg.sigma_data, cfg.parameterisation
        seq = torch.cat(
            [flow.input_scale(clean, cond.ctx_t, par, sd), flow.input_scale(noisy, cond.target_t, par, sd)], 1
        )
        out, _, tokens = self.dit(
            seq,
            cond.prev,
            cond.actions,
            cond.valid,
            torch.cat([cond.ctx_t, cond.target_t], 1),
            cond.index,
            teacher_forced=True,
            return_internals=True,
            prev_t=cond.prev_t,
            base=cond.residual_base,
            output_frames=noisy.shape[1],
        )
        return TeacherForcedOutput(out, tokens[:, clean.shape[1] :])

    def wrap_model_output(self, out: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The DiT's raw output for frames x_t at noise levels t [B, F] -> their denoised estimate x0
        (encoded units, not clamped). Used by the loss and by each denoising step of a rollout."""
        return flow.to_x0(out, x_t, t, self.cfg.parameterisation, self.cfg.sigma_data)

    def clamp_pixels(self, x0: torch.Tensor) -> torch.Tensor:
        """A denoised estimate clamped to [-1, 1] in pixel space; latents have no fixed range."""
        return x0 if self.codec.latent else x0.clamp(-1, 1)

    def diffusion_loss(
        self, out: torch.Tensor, window: NoisedWindow, weights: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames' loss: the raw output for the targets [B, T-1, ...] against the
        parameterisation's target (MSE), and, without gradient, the MSE of the denoised estimate to the
        clean frames (a log). `weights` [B, T-1, ...] (`motion_weights`, with `motion_loss_weight`) weigh the
        MSE's pixels."""
        cfg = self.cfg
        sd, par = cfg.sigma_data, cfg.parameterisation
        x = window.x[:, 1:]
        target = flow.training_target(x, window.noise, window.noisy, window.target_t, par, sd)
        diffusion = self.frame_loss(out, target, weights)
        with torch.no_grad():
            x0_mse = F.mse_loss(self.wrap_model_output(out, window.noisy, window.target_t), x)
        return diffusion, x0_mse

    def outcome_heads_loss(
        self,
        pixels: torch.Tensor,
        outcomes: dict[str, torch.Tensor],
        state: torch.Tensor | None,
        task: list[str] | None,
        first_frame: torch.Tensor | None,
    ) -> torch.Tensor:
        """The outcome heads' loss: their predictions for frames 1..T-1 of pixels [B, T, V, 3, H, W] in
        [-1, 1] against the labels of transitions 0..T-2 (outcomes [B, T] each: reward by MSE, success and
        done by BCE on logits); state [B, T, S] and first_frame [B, (V,) 3, H, W] in [0, 1] as `compute_loss`."""
        pred = self.outcomes(
            pixels[:, 1:], task, None if state is None else state[:, 1:], self._first_frame(first_frame)
        )
        b = pixels.shape[0]
        loss = torch.zeros((), device=pred["reward"].device)
        if "reward" in outcomes:
            loss = loss + F.mse_loss(pred["reward"], outcomes["reward"][:, :-1].float().reshape(b, -1))
        for key, name in (("success", "success_logit"), ("done", "done_logit")):
            if key in outcomes:
                label = outcomes[key][:, :-1].float().reshape(b, -1)
                loss = loss + F.binary_cross_entropy_with_logits(pred[name], label)
        return loss

    def object_state_loss(self, tokens: torch.Tensor, environment_state: torch.Tensor) -> torch.Tensor:
        """Huber loss of the object-state head on the targets' tokens [B, T-1, frame_len, D] against frames
        1..T-1 of environment_state [B, T, E] (dataset units) and their change since the frame before, each
        centred and scaled (see `object_state_weight`); the two halves weigh the same."""
        s = environment_state.float()
        pred_state, pred_motion = self.object_state(tokens.flatten(2)).chunk(2, -1)
        state = (s[:, 1:] - self.object_state_mean) / self.object_state_scale
        motion = (s[:, 1:] - s[:, :-1] - self.object_motion_mean) / self.object_motion_scale
        return 0.5 * (F.huber_loss(pred_state, state) + F.huber_loss(pred_motion, motion))

    def idm_loss(self, pixels: torch.Tensor, a: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """The inverse dynamics' loss: actions 0..T-2 predicted from consecutive frames of pixels
        [B, T, V, 3, H, W] in [-1, 1] (and the states [B, T, S] with idm.use_state) against the normalised
        actions a [B, T, A] (MSE)."""
        s = None
        if self.cfg.idm.use_state:
            if state is None:
                raise ValueError("idm.use_state=True but the batch has no observation.state")
            s = self.normalize_state(state[:, :-1]).flatten(0, 1)
        idm_pred = self.idm(pixels[:, :-1].flatten(0, 1), pixels[:, 1:].flatten(0, 1), s)
        return F.mse_loss(idm_pred, a[:, :-1].flatten(0, 1))

    # ---- rollouts ------------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(
        self,
        context_frames: torch.Tensor,
        context_actions: torch.Tensor,
        future_actions: torch.Tensor,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        sampler: SamplerConfig | None = None,
        task: list[str] | None = None,
        future_state: torch.Tensor | None = None,
        first_frame: torch.Tensor | None = None,
        judge: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Imagine the frames that follow the context under `future_actions`, one frame at a time.

        context_frames [B, C, (V,) 3, H, W] in [0, 1]; context_actions [B, C-1, A] (between context frames);
        future_actions [B, H, A]; task: the B instructions the reward/success heads judge by; future_state
        [B, H, S]: the joint positions at each generated frame (needed by heads.use_state); first_frame
        [B, (V,) 3, H, W] in [0, 1]: the episode's first, real frame (read by heads.use_first_frame; the first
        context frame when not given).
        `steps` overrides the sampler's step count. With `use_cache` each frame's
        keys/values are computed once and kept for the next `dit.context_frames` frames; without it every denoising
        step re-runs the whole history (the reference path, same result up to float error).
        Returns frames [B, H, (V,) 3, H, W] in [0, 1], rewards [B, H] and success probabilities [B, H],
        both for the transition into each generated frame (None for both with `judge=False`, or when the
        heads read the joint state and no `future_state` is given: frames only). Deterministic given
        `generator`.
        Steps: encode_context, then per frame rollout_step (denoise_next_frame, decode_frame,
        append_to_context) and judge_frame.
        """
        sampler = sampler or self.cfg.sampler
        if steps is not None:
            sampler = replace(sampler, steps=steps)
        sampler.validate()
        if sampler.guidance_scale != 1.0 and self.cfg.action_dropout == 0:
            # Its action-free estimate would be a frame the model never learnt to draw.
            raise ValueError(
                f"sampler.guidance_scale={sampler.guidance_scale} needs a model trained with model.action_dropout "
                "> 0; this one had 0"
            )
        ctx, squeeze = self._check_rollout_inputs(
            context_frames, context_actions, future_actions, future_state
        )
        # heads that read the state need it
        judge = judge and (future_state is not None or not self.cfg.heads.use_state)
        first = self._first_frame(ctx[:, 0] if first_frame is None else first_frame)
        context = self.encode_context(ctx, context_actions, generator, use_cache)
        frames, rewards, success = [], [], []
        for k in range(future_actions.shape[1]):
            context, pixels = self.rollout_step(context, future_actions[:, k : k + 1], sampler, generator)
            frames.append(pixels)
            if judge:
                reward, p_success = self.judge_frame(
                    pixels[:, 0], task, None if future_state is None else future_state[:, k], first
                )
                rewards.append(reward)
                success.append(p_success)
        gen = self.frames_out(torch.cat(frames, 1))
        if squeeze:
            gen = gen.squeeze(2)
        if not judge:
            return gen, None, None
        return gen, torch.stack(rewards, 1), torch.stack(success, 1)

    def _check_rollout_inputs(
        self,
        context_frames: torch.Tensor,
        context_actions: torch.Tensor,
        future_actions: torch.Tensor,
        future_state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, bool]:
        """Shape checks of `rollout`'s inputs; returns the context frames as [B, C, V, 3, H, W] (still in
        [0, 1]) and whether a camera axis was added to them."""
        ctx, squeeze = self._with_views(context_frames, "context_frames")
        b, c = ctx.shape[:2]
        if c < 1:
            raise ValueError("context_frames needs at least one frame")
        a_dim = self.cfg.dit.action_dim
        if tuple(context_actions.shape) != (b, c - 1, a_dim):
            raise ValueError(
                f"context_actions: expected [{b}, {c - 1}, {a_dim}] (the actions between the {c} context frames), "
                f"got {list(context_actions.shape)}"
            )
        if future_actions.dim() != 3 or future_actions.shape[0] != b or future_actions.shape[2] != a_dim:
            raise ValueError(f"future_actions: expected [{b}, H, {a_dim}], got {list(future_actions.shape)}")
        if future_state is not None and tuple(future_state.shape[:2]) != tuple(future_actions.shape[:2]):
            raise ValueError(
                f"future_state: expected [{b}, {future_actions.shape[1]}, S] (one per future action), "
                f"got {list(future_state.shape)}"
            )
        return ctx, squeeze

    def noise_as_context(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Encoded frames x -> the same frames noised at `context_noise_rollout`, as a rollout keeps them in
        its context (one draw of x's shape from `generator`)."""
        dev = x.device
        noise = torch.randn(x.shape, generator=generator, device=dev)
        return flow.add_noise(x, noise, torch.tensor(self.cfg.context_noise_rollout, device=dev))

    def encode_context(
        self,
        ctx: torch.Tensor,
        context_actions: torch.Tensor,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> RolloutContext:
        """Prepare a rollout's context: frames ctx [B, C, V, 3, H, W] in [0, 1] and the C-1 actions
        between them [B, C-1, A] in dataset units -> the rollout's starting point: frames encoded, noised as
        context (`noise_as_context`) and run through the DiT once (into a KV cache with `use_cache`, else
        kept as the history every denoising step re-runs)."""
        x = self.codec.encode(self.frames_in(ctx))
        return self.context_from_encoded(x, self.normalize_action(context_actions), generator, use_cache)

    def context_from_encoded(
        self,
        x: torch.Tensor,
        context_actions: torch.Tensor,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> RolloutContext:
        """`encode_context` from frames already encoded (x [B, C, V, C', h, w]) and normalised actions
        [B, C-1, A]."""
        b, c = x.shape[:2]
        dev = x.device
        a_ctx = self.lead_action_features(
            torch.cat([context_actions, torch.zeros(b, 1, self.cfg.dit.action_dim, device=dev)], 1)
        )
        previous = context_actions[:, -1:] if c > 1 else None
        valid = torch.ones(b, c, dtype=torch.bool, device=dev)
        valid[:, 0] = False
        clean = self.noise_as_context(x, generator)
        prev = self.previous_frames(clean)
        empty = (
            None
            if use_cache
            else {
                "x": clean[:, :0],
                "prev": prev[:, :0],
                "a": a_ctx[:, :0],
                "valid": valid[:, :0],
                "t": torch.zeros(b, 0, device=dev),
                "index": torch.zeros(0, dtype=torch.long, device=dev),
            }
        )
        cache, history = self._context_pass(
            clean, prev[:, :c], a_ctx, valid, torch.arange(c, device=dev), None, empty
        )
        return RolloutContext(clean[:, -1:], prev[:, c:], previous, cache, history, c, x[:, -1:])

    def rollout_step(
        self,
        context: RolloutContext,
        action: torch.Tensor,
        sampler: SamplerConfig,
        generator: torch.Generator | None = None,
    ) -> tuple[RolloutContext, torch.Tensor]:
        """One imagined frame: action [B, 1, A] in dataset units (it leads the context's last
        frame to the new one) -> the context with the new frame appended and the frame [B, 1, V, 3, H, W]
        in [-1, 1]. Draws the frame's noise, then its context noise, from `generator`."""
        a_norm = self.normalize_action(action)
        a = self.action_features(a_norm, context.previous_action)
        x0 = self.denoise_next_frame(context, a, sampler, generator)
        pixels = self.decode_frame(x0)
        return self.append_to_context(context, x0, a, a_norm, generator), pixels

    def denoise_next_frame(
        self,
        context: RolloutContext,
        a: torch.Tensor,
        sampler: SamplerConfig,
        generator: torch.Generator | None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The sampler from pure noise to the next frame given the context and its action
        features a [B, 1, A'] (`action_features`) -> x0 [B, 1, V, C, h, w] (encoded; clamped to [-1, 1] in
        pixel space). With guidance, each step also asks for the action-free estimate. `noise` (shaped as the
        frame) is the starting noise where given, else it is drawn from `generator`."""
        b = a.shape[0]
        yes = torch.ones(b, 1, dtype=torch.bool, device=a.device)

        def denoise(x_t, t):
            cond = self.next_frame_x0(x_t, t, context, a, yes)
            if sampler.guidance_scale == 1.0:
                return cond, None
            return cond, self.next_frame_x0(x_t, t, context, a, ~yes)

        if noise is None:
            noise = torch.randn(context.last.shape, generator=generator, device=a.device)
        x0 = self.clamp_pixels(sample(denoise, noise, sampler, generator))
        if sampler.still_threshold > 0:
            x0 = keep_still_pixels(x0, context.last_clean, sampler.still_threshold)
        return x0

    def next_frame_x0(
        self,
        x_t: torch.Tensor,
        t: float,
        context: RolloutContext,
        a: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        """One denoiser call: the next frame x_t [B, 1, V, C, h, w] at noise level t, after the context, under
        action features a [B, 1, A'] (ignored where valid [B, 1] is False) -> its x0 estimate (encoded, not
        clamped). Reads the KV cache, or re-runs the whole history on the recompute path."""
        cfg = self.cfg
        tt = torch.full((x_t.shape[0], 1), t, device=x_t.device)
        inp = flow.input_scale(x_t, tt, cfg.parameterisation, cfg.sigma_data)
        prev, index, history = context.previous, context.index(), context.history
        base = context.last_clean if cfg.noise_free_residual_base else None
        if history is None:
            out, _ = self.dit(
                inp,
                prev,
                a,
                valid,
                tt,
                index,
                kv_cache=context.cache,
                prev_t=self._rollout_prev_t(tt),
                base=base,
            )
        else:
            t_all = torch.cat([history["t"], tt], 1)
            out, _ = self.dit(
                torch.cat([history["x"], inp], 1),
                torch.cat([history["prev"], prev], 1),
                torch.cat([history["a"], a], 1),
                torch.cat([history["valid"], valid], 1),
                t_all,
                torch.cat([history["index"], index]),
                prev_t=self._rollout_prev_t(t_all),
                base=base,
                output_frames=1,
            )
        return self.wrap_model_output(out, x_t, tt)

    def decode_frame(self, x0: torch.Tensor) -> torch.Tensor:
        """A generated frame x0 (encoded) -> pixels in [-1, 1] (the latents decoded)."""
        return self.codec.decode(x0) if self.codec.latent else x0

    def append_to_context(
        self,
        context: RolloutContext,
        x0: torch.Tensor,
        a: torch.Tensor,
        a_norm: torch.Tensor,
        generator: torch.Generator | None,
    ) -> RolloutContext:
        """The context window after the new frame x0 [B, 1, V, C, h, w] (encoded), generated
        under action features a [B, 1, A'] from the normalised action a_norm [B, 1, A]: the frame noised as
        context (`noise_as_context`) and run through the DiT (the KV cache keeps the last
        `dit.context_frames` frames)."""
        clean = self.noise_as_context(x0, generator)
        yes = torch.ones(x0.shape[0], 1, dtype=torch.bool, device=x0.device)
        cache, history = self._context_pass(
            clean, context.previous, a, yes, context.index(), context.cache, context.history
        )
        # the next frame reads this one, then the newest k-1 of what this one read
        previous = torch.cat([clean, context.previous[:, :, :, : -clean.shape[3]]], 3)
        return RolloutContext(clean, previous, a_norm, cache, history, context.next_index + 1, x0)

    def judge_frame(
        self,
        pixels: torch.Tensor,
        task: list[str] | None,
        state: torch.Tensor | None,
        first: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads' readout of a generated frame [B, V, 3, H, W] in [-1, 1] (state [B, S] in
        dataset units, the episode's first frame [B, V, 3, H, W] in [-1, 1]) -> reward [B] and success
        probability [B] of the transition into it."""
        out = self.outcomes(pixels, task, state, first)
        return out["reward"], torch.sigmoid(out["success_logit"])

    def _rollout_prev_t(self, t: torch.Tensor) -> torch.Tensor:
        """The previous frames' noise level in a rollout, shaped like t [B, F]: every frame a rollout keeps
        carries context_noise_rollout (the first context frame reads itself, noised the same)."""
        return torch.full_like(t, self.cfg.context_noise_rollout)

    def _context_pass(self, clean, prev, a, valid, index, cache, history):
        """Run frames as (lightly noised) context: returns the updated KV cache, or the history the
        recompute path re-runs at every denoising step."""
        cfg = self.cfg
        t = torch.full(clean.shape[:2], cfg.context_noise_rollout, device=clean.device)
        inp = flow.input_scale(clean, t, cfg.parameterisation, cfg.sigma_data)
        if history is None:
            prev_t = self._rollout_prev_t(t)
            _, kv = self.dit(inp, prev, a, valid, t, index, kv_cache=cache, prev_t=prev_t, output_frames=0)
            keep = cfg.dit.context_frames * cfg.dit.frame_len
            new_cache = [
                (torch.cat([c[0], k], 2)[:, :, -keep:], torch.cat([c[1], v], 2)[:, :, -keep:])
                if c
                else (k, v)
                for c, (k, v) in zip(cache or [None] * len(kv), kv)
            ]
            return new_cache, None
        history = {
            "x": torch.cat([history["x"], inp], 1),
            "prev": torch.cat([history["prev"], prev], 1),
            "a": torch.cat([history["a"], a], 1),
            "valid": torch.cat([history["valid"], valid], 1),
            "t": torch.cat([history["t"], t], 1),
            "index": torch.cat([history["index"], index]),
        }
        return None, history

    @torch.no_grad()
    def infer_actions(self, frames: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """IDM over consecutive frames: [B, T, (V,) 3, H, W] in [0, 1] -> actions [B, T-1, A] (dataset units)."""
        x, _ = self._with_views(frames, "frames")
        x = self.frames_in(x)
        b, t = x.shape[:2]
        s = self.normalize_state(state[:, :-1]).flatten(0, 1) if state is not None else None
        pred = self.idm(x[:, :-1].flatten(0, 1), x[:, 1:].flatten(0, 1), s)
        return self.unnormalize_action(pred.view(b, t - 1, -1))

    # ---- checkpoints ---------------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_config(self.cfg, path / "config.yaml")
        save_tensors(self.state_dict(), path / "model.safetensors")
        save_stats(self.stats, path / "stats.json")
        if self.embodiment is not None:
            write_embodiment(self.embodiment, path / EMBODIMENT_FILE)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | torch.device = "cpu") -> WorldModel:
        path = Path(path)
        if not (path / "config.yaml").is_file():
            raise FileNotFoundError(f"{path} is not a world-model checkpoint: config.yaml is missing")
        cfg = load_config(WorldModelConfig, path / "config.yaml")
        stored = path / EMBODIMENT_FILE
        embodiment = load_embodiment_file(stored) if stored.is_file() else None
        model = cls(cfg, load_stats(path / "stats.json"), embodiment)
        load_model_weights(model, path / "model.safetensors")
        return model.to(device).eval()
