"""A video diffusion transformer over frames with frame-level AdaLN and block-causal attention.

Each frame is cut into patches (all views of a time step form one frame of tokens, told apart by a view
embedding). Every frame carries its own conditioning vector, the embedding of the action that led to it
plus the embedding of its own noise level, which modulates its tokens through AdaLN in every block
(diffusion forcing: clean context frames and the noisy frame being generated sit in the same sequence).
Time is encoded with rotary embeddings on the frame index, so attention depends only on how far apart two
frames are and cached keys/values stay valid however long a rollout runs.

The patch embedding optionally reads the previous frame beside the current one (as DIAMOND stacks past
frames on the channels): a strong, local "copy what was there" path which keeps static pixels sharp. A
small full-resolution convolution after un-patchifying, reading the output beside the previous frame, lets
neighbouring patches talk (no block seams) and repairs pixel-level errors a patch token cannot express.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from worldloop import cuda_ext
from worldloop.world_model.attention import check_backend, frame_attention

WARP_READS = ("bilinear", "bicubic")


@dataclass
class VideoDiTConfig:
    image_size: int = 64  # frames (or latents) are image_size x image_size
    channels: int = 3  # 3 for pixels, the autoencoder's latent channels otherwise
    num_views: int = 1  # cameras predicted jointly
    patch_size: int = 8
    width: int = 192
    depth: int = 6
    heads: int = 4
    mlp_ratio: float = 4.0
    action_dim: int = 4
    # Also condition each frame on the change of the commanded action (a[t-1] - a[t-2]): with absolute
    # joint targets the motion is otherwise only readable as target minus a pose seen in pixels.
    action_delta: bool = False
    context_frames: int = 4  # earlier frames each frame attends to (block-causal sliding window)
    condition_on_previous_frame: bool = True
    # How many earlier clean frames each frame's pixel paths (the patch input and the output convolution) read,
    # newest first. 2 puts the last step's motion at full resolution beside the frame. On the push recipe (warp,
    # noise-free base, self-rollout phase) it left the drawn cube's one-step slope where 1 has it (0.51 -> 0.52),
    # cost the cube 0.4 px at h30 and lowered the IDM ratio at h30 2.00 -> 1.69 (one seed; docs/experiments.md,
    # 2026-12-06); on the recipe before those it drew the cube moving back (2026-11-26).
    previous_frames: int = 1
    # Also condition each frame on the noise level of the previous frame(s) it reads (GameNGen feeds its
    # context-noise level to the model). Without it a model trained on noisy previous frames cannot tell a
    # clean one from a noisy one, and smooths the clean frames of a rollout too (push: drawn cubes blurred
    # one step ahead from the real past). Its embedding starts at zero: a model fine-tuned with it starts as
    # the one it came from.
    condition_on_previous_noise: bool = False
    # Output = previous frame + a learned change (x0 parameterisation only): static pixels are copied
    # exactly instead of squeezed through a patch token, so the network spends itself on what moves.
    residual_to_previous_frame: bool = True
    # The previous frame is first moved by a predicted per-pixel displacement (in pixels, read bilinearly)
    # and the learned change added to that. A push cube shifts 0.3-1.7 px a step: as a change that is an
    # edge pattern a 16-pixel patch token must draw exactly (push models drew it at slope ~0 of the truth);
    # as a displacement it is one value per pixel, and the loss's gradient through the bilinear read points
    # it the right way. The displacement starts at zero: the model starts as the plain residual.
    warp_previous_frame: bool = False
    # How the warp reads the previous frame at the displacement. A bilinear read at a fractional displacement
    # blurs what it moves, and a rollout warps its own output again every frame: pushed cubes, rendered with
    # hard edges, smeared and faded (drawn at h30 in 0.65-0.74 of the windows where the arm pushes them).
    # `bicubic` (Catmull-Rom) moves by the same fractions with far less blur: at inference on push models,
    # over 3 seeds, the cube was kept in 0.88-0.98 of those windows and r rose, for SSIM@30 -0.012 to -0.018
    # Trained with it, a push model lost the cube in more windows: the push recipe trains bilinearly
    # (`train_warp_read`) and draws bicubically. Reads at whole pixels (nearest, dithered, or both by size)
    # were measured too and not kept (docs/experiments.md, 2026-11-29).
    warp_read: str = "bilinear"
    # The read while the module trains (the teacher-forced pass and the self-rollout phase); "" reads as
    # `warp_read`. In eval mode, as every rollout and benchmark runs, `warp_read` is used.
    train_warp_read: str = ""
    # A small full-resolution convolution on the output and the previous frame (0 disables it): it removes
    # patch seams and, as the tokens cannot, cleans pixel-level errors carried in through the residual.
    output_conv_channels: int = 32
    # The output convolution also reads each pixel's (x, y) position and is modulated (FiLM, after its
    # first layer) by the frame's conditioning vector, action and noise level, as DIAMOND's U-Net is in
    # every block. A patch token moves a small thing (gym-pusht's 4-pixel agent) only by re-drawing its
    # patch; this path can move it where it is: with positions and the action side by side, "which way to
    # the commanded point" is a linear function of a pixel's features.
    output_conv_conditioned: bool = False
    # auto | sdpa | flex | triton (world_model/attention.py): auto runs our Triton kernel on CUDA (training and
    # rollouts), the dense-mask SDPA reference elsewhere.
    attention_backend: str = "auto"

    def validate(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"dit.image_size={self.image_size} is not a multiple of dit.patch_size={self.patch_size}"
            )
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise ValueError(
                f"dit.width={self.width} must split into dit.heads={self.heads} heads of even size"
            )
        check_backend(self.attention_backend)
        if self.residual_to_previous_frame and not self.condition_on_previous_frame:
            raise ValueError("dit.residual_to_previous_frame needs dit.condition_on_previous_frame")
        if self.warp_previous_frame and not self.residual_to_previous_frame:
            raise ValueError(
                "dit.warp_previous_frame moves the residual's previous frame: it needs "
                "dit.residual_to_previous_frame"
            )
        for key, read in (
            ("warp_read", self.warp_read),
            ("train_warp_read", self.train_warp_read or "bilinear"),
        ):
            if read not in WARP_READS:
                raise ValueError(f"dit.{key}={read!r}; expected one of {WARP_READS}")
            if read != "bilinear" and not self.warp_previous_frame:
                raise ValueError(f"dit.{key}={read!r} reads the warp: it needs dit.warp_previous_frame")
        if self.context_frames < 1:
            raise ValueError(f"dit.context_frames={self.context_frames} must be >= 1")
        if self.previous_frames < 1:
            raise ValueError(f"dit.previous_frames={self.previous_frames} must be >= 1")
        if self.previous_frames > 1 and not self.condition_on_previous_frame:
            raise ValueError("dit.previous_frames > 1 needs dit.condition_on_previous_frame")

    @property
    def patches_per_view(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def frame_len(self) -> int:
        return self.patches_per_view * self.num_views


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of noise levels t in [0, 1] (scaled to 0..1000 like DiT)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[..., None] * 1000 * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


def time_rotation(
    time_index: torch.Tensor, head_dim: int, frame_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [F * frame_len, head_dim / 2] of the rotary embedding of each token's frame index."""
    freqs = 1.0 / (
        100.0 ** (torch.arange(0, head_dim, 2, device=time_index.device, dtype=torch.float32) / head_dim)
    )
    angles = time_index.float()[:, None] * freqs[None, :]
    return angles.cos().repeat_interleave(frame_len, 0), angles.sin().repeat_interleave(frame_len, 0)


def rotate_by_time(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary embedding on the frame index: x [B, heads, L, D], rotation from `time_rotation`."""
    cos, sin = (r.to(x.dtype) for r in rotation)
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


def _read_at(frames: torch.Tensor, flow: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """Read of frames [N, C, H, W] at each pixel's position plus flow [N, 2, H, W] (pixels); `mode` is
    grid_sample's (bilinear, or bicubic: Catmull-Rom)."""
    hgt, wid = frames.shape[-2:]
    ys, xs = torch.meshgrid(
        torch.arange(hgt, device=flow.device, dtype=flow.dtype),
        torch.arange(wid, device=flow.device, dtype=flow.dtype),
        indexing="ij",
    )
    # grid_sample's coordinates with align_corners=True: -1 is the first pixel's centre, +1 the last one's.
    gx = (xs + flow[:, 0]) * (2 / max(wid - 1, 1)) - 1
    gy = (ys + flow[:, 1]) * (2 / max(hgt - 1, 1)) - 1
    grid = torch.stack([gx, gy], -1)
    return F.grid_sample(frames, grid, mode=mode, padding_mode="border", align_corners=True)


def warp(frames: torch.Tensor, flow: torch.Tensor, mode: str = "bilinear") -> torch.Tensor:
    """frames [..., C, H, W] read at each pixel's own position plus flow [..., 2, H, W] (x then y, in pixels;
    `mode` bilinear or bicubic, edges repeated): out[y, x] = frames[y + flow_y, x + flow_x]. Zero flow returns
    the frames.

    The gradient with respect to the flow is the frame's central difference at the read position (half a
    pixel each way). Bilinear reading's own is one-sided at whole pixels: on a hard-edged object (the push
    cubes are rendered without anti-aliasing) it is zero on both edges when the object moved right or down,
    so from zero flow such moves could never be learnt. The gradient with respect to the frames is the
    read's own."""
    *lead, c, hgt, wid = frames.shape
    frames, flow = frames.reshape(-1, c, hgt, wid), flow.reshape(-1, 2, hgt, wid)
    held = flow.detach()
    out = _read_at(frames, held, mode)
    if flow.requires_grad:
        with torch.no_grad():
            dx = held.new_tensor([0.5, 0.0]).view(1, 2, 1, 1)
            dy = held.new_tensor([0.0, 0.5]).view(1, 2, 1, 1)
            grad_x = _read_at(frames, held + dx) - _read_at(frames, held - dx)
            grad_y = _read_at(frames, held + dy) - _read_at(frames, held - dy)
        # Zero in value: only its gradient counts.
        out = out + grad_x * (flow[:, :1] - held[:, :1]) + grad_y * (flow[:, 1:] - held[:, 1:])
    return out.view(*lead, c, hgt, wid)


class FrameBlock(nn.Module):
    def __init__(self, cfg: VideoDiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.RMSNorm(d // cfg.heads)
        self.k_norm = nn.RMSNorm(d // cfg.heads)
        self.proj = nn.Linear(d, d)
        hidden = int(d * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, d))
        self.ada = nn.Linear(d, 6 * d)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        rotation: tuple[torch.Tensor, torch.Tensor],
        teacher_forced: bool,
        cache: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [B, L, D] tokens of F frames, cond [B, F, D]. Returns new x and this input's (k, v)."""
        cfg, fl = self.cfg, self.cfg.frame_len
        b, length, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(F.silu(cond)).chunk(6, dim=-1)
        h = cuda_ext.adaln_modulate(x, shift1, scale1, fl)
        q, k, v = self.qkv(h).view(b, length, 3, cfg.heads, d // cfg.heads).permute(2, 0, 3, 1, 4)
        q = rotate_by_time(self.q_norm(q), rotation)
        k = rotate_by_time(self.k_norm(k), rotation)
        new_kv = (k, v)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        a = frame_attention(q, k, v, fl, cfg.context_frames, teacher_forced, cfg.attention_backend)
        x = cuda_ext.gated_residual(x, self.proj(a.transpose(1, 2).reshape(b, length, d)), gate1, fl)
        x = cuda_ext.gated_residual(x, self.mlp(cuda_ext.adaln_modulate(x, shift2, scale2, fl)), gate2, fl)
        return x, new_kv


class VideoDiT(nn.Module):
    def __init__(self, cfg: VideoDiTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d, p = cfg.width, cfg.patch_size
        in_ch = cfg.channels * (1 + cfg.previous_frames if cfg.condition_on_previous_frame else 1)
        self.patch = nn.Linear(in_ch * p * p, d)
        self.pos = nn.Parameter(torch.randn(cfg.patches_per_view, d) * 0.02)
        self.view = nn.Parameter(torch.zeros(cfg.num_views, d))
        action_in = cfg.action_dim * (2 if cfg.action_delta else 1)
        self.action_embed = nn.Sequential(nn.Linear(action_in, d), nn.SiLU(), nn.Linear(d, d))
        # Stands in for the action when there is none (the first frame) or it is dropped for guidance.
        self.null_action = nn.Parameter(torch.zeros(d))
        self.noise_embed = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.previous_noise_embed = None
        if cfg.condition_on_previous_noise:
            self.previous_noise_embed = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
            nn.init.zeros_(self.previous_noise_embed[-1].weight)
            nn.init.zeros_(self.previous_noise_embed[-1].bias)
        self.blocks = nn.ModuleList([FrameBlock(cfg) for _ in range(cfg.depth)])
        self.final_ada = nn.Linear(d, 2 * d)
        # Per pixel: the change, then (warp_previous_frame) the displacement x, y of the previous frame.
        self.final = nn.Linear(d, p * p * (cfg.channels + (2 if cfg.warp_previous_frame else 0)))
        for layer in (self.final_ada, self.final):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.refine = self.refine_film = None
        if cfg.output_conv_channels:
            c, h = cfg.channels, cfg.output_conv_channels
            coords = 2 if cfg.output_conv_conditioned else 0
            self.refine = nn.Sequential(
                nn.Conv2d(in_ch + coords, h, 3, padding=1),
                nn.SiLU(),
                nn.Conv2d(h, h, 3, padding=1),
                nn.SiLU(),
                nn.Conv2d(h, c, 3, padding=1),
            )
            nn.init.zeros_(self.refine[-1].weight)
            nn.init.zeros_(self.refine[-1].bias)
            if cfg.output_conv_conditioned:
                self.refine_film = nn.Linear(d, 2 * h)  # zero-initialised: starts as the plain convolution
                nn.init.zeros_(self.refine_film.weight)
                nn.init.zeros_(self.refine_film.bias)

    def conditioning(
        self,
        actions: torch.Tensor,
        action_valid: torch.Tensor,
        t: torch.Tensor,
        prev_t: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """actions [B, F, A] (normalised) with action_valid [B, F] bool, noise levels t [B, F] and those of
        the previous frames read, prev_t [B, F] (with condition_on_previous_noise; None: 0) -> [B, F, D]."""
        act = torch.where(action_valid[..., None], self.action_embed(actions), self.null_action)
        cond = act + self.noise_embed(timestep_embedding(t, self.cfg.width))
        if self.previous_noise_embed is not None:
            prev_t = torch.zeros_like(t) if prev_t is None else prev_t
            cond = cond + self.previous_noise_embed(timestep_embedding(prev_t, self.cfg.width))
        return cond

    def forward(
        self,
        x: torch.Tensor,
        prev: torch.Tensor | None,
        actions: torch.Tensor,
        action_valid: torch.Tensor,
        t: torch.Tensor,
        time_index: torch.Tensor,
        teacher_forced: bool = False,
        kv_cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        return_internals: bool = False,
        prev_t: torch.Tensor | None = None,
        base: torch.Tensor | None = None,
        output_frames: int | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Denoise F frames.

        x: [B, F, V, C, H, W]; prev: [B, F, V, C * previous_frames, H, W] each frame's earlier clean frames,
        newest first (when configured); actions
        [B, F, A]; action_valid, t: [B, F]; time_index: [F] frame indices (for rotary time); kv_cache: per
        block the keys/values of earlier frames these frames attend to; prev_t [B, F]: the noise level of the
        newest previous frame each frame reads (read with condition_on_previous_noise; None: 0); base
        [B, F, V, C, H, W] (or the output frames' alone): the frame each frame's residual starts from
        (residual_to_previous_frame; None: the newest frame of prev); output_frames: draw the output of the
        last `output_frames` frames only (None: all F; 0: none). Every frame still attends and is attended to,
        so those outputs are exactly what a full pass gives them; frames that only serve as context (the
        teacher-forced layout's first T, a KV-cache fill) skip the output layers and the pixel convolution.
        Returns the output [B, F', V, C, H, W] (F' = output_frames, or F; None when 0) and per block the
        keys/values of these frames (for appending to a cache); with `return_internals`, also the last block's
        tokens [B, F, frame_len, D] (what auxiliary heads on the frames being drawn read).
        """
        cfg = self.cfg
        b, nf, nv, c, hgt, wid = x.shape
        if (nv, c, hgt, wid) != (cfg.num_views, cfg.channels, cfg.image_size, cfg.image_size):
            raise ValueError(
                f"VideoDiT expects frames [B, F, {cfg.num_views}, {cfg.channels}, {cfg.image_size}, "
                f"{cfg.image_size}], got {list(x.shape)}"
            )
        inp = torch.cat([x, prev], 3) if cfg.condition_on_previous_frame else x
        tokens = self.patch(self._patchify(inp)) + self.pos  # [B, F, V, P, D]
        tokens = (tokens + self.view[:, None]).reshape(b, nf * cfg.frame_len, cfg.width)
        cond = self.conditioning(actions, action_valid, t, prev_t)
        rotation = time_rotation(time_index, cfg.width // cfg.heads, cfg.frame_len)
        new_kv = []
        for i, block in enumerate(self.blocks):
            tokens, kv = block(tokens, cond, rotation, teacher_forced, kv_cache[i] if kv_cache else None)
            new_kv.append(kv)
        n = nf if output_frames is None else output_frames
        if not 0 <= n <= nf:
            raise ValueError(f"output_frames={output_frames}: expected 0..{nf} (the frames given)")
        out = self.output(tokens[:, (nf - n) * cfg.frame_len :], cond[:, nf - n :], prev, base) if n else None
        if return_internals:
            return out, new_kv, tokens.view(b, nf, cfg.frame_len, cfg.width)
        return out, new_kv

    def output(
        self,
        tokens: torch.Tensor,
        cond: torch.Tensor,
        prev: torch.Tensor | None,
        base: torch.Tensor | None,
    ) -> torch.Tensor:
        """The output [B, n, V, C, H, W] of the last n frames from their last-block tokens [B, n * frame_len, D]
        and conditioning cond [B, n, D]; prev and base as `forward` takes them (their last n frames are read).
        With the warp, the previous frame is read by `warp_read`, or while training by `train_warp_read`."""
        cfg = self.cfg
        b, n, c = cond.shape[0], cond.shape[1], cfg.channels
        prev = None if prev is None else prev[:, prev.shape[1] - n :]
        shift, scale = self.final_ada(F.silu(cond)).chunk(2, -1)
        h = cuda_ext.adaln_modulate(tokens, shift, scale, cfg.frame_len)
        out = self._unpatchify(self.final(h), b, n)
        if cfg.residual_to_previous_frame:
            base = prev[:, :, :, :c] if base is None else base[:, base.shape[1] - n :]
            if cfg.warp_previous_frame:
                read = cfg.train_warp_read or cfg.warp_read if self.training else cfg.warp_read
                base = warp(base, out[:, :, :, c:], read)
                out = out[:, :, :, :c]
            out = out + base
        if self.refine is not None:
            both = torch.cat([out, prev], 3) if cfg.condition_on_previous_frame else out
            out = out + self.refine_output(both, cond).view_as(out)
        return out

    def refine_output(self, frames: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """The output convolution's correction for frames [B, F, V, C', H, W] (output, and previous frame when
        configured) with the frames' conditioning cond [B, F, D] -> [B * F * V, C, H, W]."""
        b, nf, nv, _, hgt, wid = frames.shape
        # Channels-last: oneDNN's convolutions with these few channels ran 2x faster so on one CPU core
        # (forward and backward); the convolution was ~70% of a tiny.yaml training step.
        x = frames.flatten(0, 2)
        if self.refine_film is None:
            return self.refine(x.contiguous(memory_format=torch.channels_last)).contiguous()
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, hgt, device=x.device, dtype=x.dtype),
            torch.linspace(-1, 1, wid, device=x.device, dtype=x.dtype),
            indexing="ij",
        )
        x = torch.cat([x, torch.stack([xs, ys]).expand(x.shape[0], -1, -1, -1)], 1)
        scale, shift = self.refine_film(cond).repeat_interleave(nv, 1).flatten(0, 1).chunk(2, -1)
        h = self.refine[0](x.contiguous(memory_format=torch.channels_last))
        h = h * (1 + scale[..., None, None]) + shift[..., None, None]
        return self.refine[2:](self.refine[1](h)).contiguous()

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B, F, V, C, H, W] -> [B, F, V, patches, C * p * p] (row-major patches)."""
        p = self.cfg.patch_size
        b, nf, nv, c, hgt, wid = x.shape
        x = x.reshape(b, nf, nv, c, hgt // p, p, wid // p, p)
        return x.permute(0, 1, 2, 4, 6, 3, 5, 7).reshape(b, nf, nv, (hgt // p) * (wid // p), c * p * p)

    def _unpatchify(self, h: torch.Tensor, b: int, nf: int) -> torch.Tensor:
        """[B, F * V * patches, C' * p * p] -> [B, F, V, C', H, W]."""
        cfg = self.cfg
        p, n = cfg.patch_size, cfg.image_size // cfg.patch_size
        c = h.shape[-1] // (p * p)
        h = h.view(b, nf, cfg.num_views, n, n, p, p, c)
        return h.permute(0, 1, 2, 7, 3, 5, 4, 6).reshape(b, nf, cfg.num_views, c, n * p, n * p)
