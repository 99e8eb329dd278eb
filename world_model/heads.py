"""Reward / success / done heads: the world model tells the policy how it is doing.

The heads read a frame's pixels (every camera), the instruction and the robot's joint positions at that
frame. Frame i's outputs are the labels of the transition i-1 -> i (`next.reward`, `next.success`,
`next.done` of step i-1 in LeRobot's alignment). In a rollout they read the generated frame; in training,
the real one.

Why pixels, and why the joint state. The first heads read the DiT's 16 tokens of a frame: on held-out
episodes their success AUROC was 0.67-0.69 (0.999 on training episodes), with or without the joint state:
at 16x16 pixels a token is too coarse to tell which cube the gripper is at, so the heads learned the
training episodes by heart. A small convolutional encoder at full resolution, with a spatial soft-argmax
(where the instruction's object is) and frames shifted by a few pixels in training, reached 0.91 on
held-out real frames, 0.992 when fitted on 1,440 episodes (docs/results/success_head_tiny_heads.json,
benchmarks/results/success_head.json).
In imagination the joint positions are not drawn but integrated from the commanded actions
(`WorldModelEnv`); the frame tells where things are. Generated frames drift from real ones over a long
rollout: heads fitted on real frames only misjudge them, so they are fitted on the model's own rollouts
too (world_model/imagined_windows.py).

Success depends on the instruction as much as on the picture ("reach the red cube" and "reach the blue
cube" differ only in words): its hashed words (common/text.py) modulate the image features (FiLM) before
the spatial pooling, so the pooling looks for the named object. Without a task the embedding is zero.

The episode's first frame (`use_first_frame`). In imagination only the first frame is real: the one the
episode starts from. Where the objects stand can be read from it, sharp, before any drawing error. In a
task whose objects stay put until touched (reach), that frame and the joint state (exact in imagination)
tell whether the fingertip is at the named object, whatever the drawn frame looks like. `use_frame=False`
judges from those two alone: the verdict no longer depends on how well the model draws a near miss, only
on where the policy moved the arm. Measured on reach (docs/results/
imagination_eval_first_state_50ep_sweep.json): open-loop replays of other policies' sim episodes judged
with balanced accuracy 0.72 (pixel heads 0.64); the policy zoo's largest imagined-vs-sim gap 18 points at
the calibrated threshold (pixel heads 34), and with 150 episodes per policy Spearman 0.94, MMRV 0.011.
Keep `use_frame` where what is judged moves (push): the first frame cannot show where it went.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from worldloop.common.text import hashed_batch


@dataclass
class OutcomeHeadsConfig:
    channels: int = 64  # of the convolutional encoder's last layer (and the hidden width)
    use_state: bool = True  # also read the joint positions of the frame (see the module docstring)
    dropout: float = 0.1  # on the mixed features, against learning the training episodes by heart
    # In training, frames are shifted by up to this many pixels (one random shift per batch). Without it
    # the heads learned where things sit in the training episodes' pixels: held-out success AUROC 0.75
    # against 0.998 with a 2-pixel shift, in the same experiment.
    augment_shift: int = 2
    task_buckets: int = 1024
    task_words: int = 16
    # The success probability above which an imagined step counts as a success. Heads-only fitting sets
    # it from the model's open-loop replays of held-out episodes (world_model/success_calibration.py): an
    # episode succeeds when any of its ~50 steps crosses it, so occasional per-frame false alarms add up.
    success_threshold: float = 0.5
    # Also read the episode's first frame, the real one imagination starts from (module docstring).
    use_first_frame: bool = False
    # Read the frame being judged. False (with use_first_frame and use_state) judges from the first frame
    # and the joint state alone: for tasks whose objects stay put until reached.
    use_frame: bool = True

    def validate(self) -> None:
        if self.channels < 1:
            raise ValueError(f"heads.channels={self.channels} must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"heads.dropout={self.dropout} must lie in [0, 1)")
        if self.augment_shift < 0:
            raise ValueError(f"heads.augment_shift={self.augment_shift} must be >= 0")
        if not 0 < self.success_threshold < 1:
            raise ValueError(f"heads.success_threshold={self.success_threshold} must lie in (0, 1)")
        if not (self.use_frame or self.use_first_frame):
            raise ValueError(
                "heads.use_frame=False needs heads.use_first_frame=True: the heads must see a frame"
            )


class OutcomeHeads(nn.Module):
    def __init__(self, cfg: OutcomeHeadsConfig | None = None, num_views: int = 1, state_dim: int = 0):
        super().__init__()
        cfg = cfg or OutcomeHeadsConfig()
        cfg.validate()
        if cfg.use_state and state_dim < 1:
            raise ValueError("heads.use_state=True needs the state size (idm.state_dim) to be >= 1")
        self.cfg, self.num_views = cfg, num_views
        c = cfg.channels
        # Three stride-2 layers: an 8x8 map at 64 px, a cell per 8x8 pixels (a cube is ~6 px wide).
        self.encoder = nn.Sequential(
            nn.Conv2d(3, c // 2, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(c // 2, c, 4, 2, 1),
            nn.SiLU(),
            nn.Conv2d(c, c, 4, 2, 1),
            nn.SiLU(),
        )
        self.task_embed = nn.EmbeddingBag(cfg.task_buckets + 1, c, mode="mean", padding_idx=0)
        self.film = nn.Linear(c, 2 * c)
        self.state_embed = nn.Sequential(nn.Linear(state_dim, c), nn.SiLU()) if cfg.use_state else None
        per_view = c + 2  # pooled features and the soft-argmax location
        images = int(cfg.use_frame) + int(cfg.use_first_frame)
        width = images * num_views * per_view + c + (c if cfg.use_state else 0)
        self.mix = nn.Sequential(nn.Linear(width, c), nn.SiLU(), nn.Dropout(cfg.dropout))
        self.out = nn.Linear(c, 3)  # reward (normalised), success logit, done logit

    def task_features(self, task: list[str] | None, batch: int, device: torch.device) -> torch.Tensor:
        """[B, channels] embedding of B instructions (zeros when there are none)."""
        if task is None:
            return torch.zeros(batch, self.cfg.channels, device=device)
        if len(task) != batch:
            raise ValueError(f"outcome heads: {len(task)} instructions for a batch of {batch}")
        ids = hashed_batch(list(task), self.cfg.task_buckets, self.cfg.task_words)
        return self.task_embed(ids.to(device))

    def _where(self, images: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        """images [N*V, 3, H, W], task features [N, C] -> [N*V, C + 2]: the image's features pooled where the
        instruction's object is, and that place (a spatial soft-argmax in [-1, 1])."""
        f = self.encoder(images)  # [N*V, C, h, w]
        gain, bias = self.film(task).repeat_interleave(self.num_views, 0).chunk(2, -1)
        f = f * (1 + gain[..., None, None]) + bias[..., None, None]
        h, w = f.shape[-2:]
        weights = torch.softmax(f.flatten(2).mean(1), -1)  # [N*V, h*w]: where the named object is
        pooled = (f.flatten(2) * weights[:, None]).sum(-1)
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, h, device=f.device),
            torch.linspace(-1, 1, w, device=f.device),
            indexing="ij",
        )
        where = torch.stack([(weights * xs.flatten()).sum(-1), (weights * ys.flatten()).sum(-1)], -1)
        return torch.cat([pooled, where], -1)

    def forward(
        self,
        frames: torch.Tensor,
        task: list[str] | None = None,
        state: torch.Tensor | None = None,
        first: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """frames [B, ..., V, 3, H, W] in [-1, 1], task: B instructions, state [B, ..., S] (normalised joint
        positions, read with `use_state`), first [B, V, 3, H, W] in [-1, 1] (the episode's first frame, read
        with `use_first_frame`) -> reward, success_logit, done_logit [B, ...]."""
        cfg, v = self.cfg, self.num_views
        if frames.dim() < 5 or frames.shape[-4] != v or frames.shape[-3] != 3:
            raise ValueError(
                f"outcome heads: expected frames [B, ..., {v}, 3, H, W], got {list(frames.shape)}"
            )
        lead = frames.shape[:-4]
        b, n = lead[0], lead.numel()

        def per_frame(x: torch.Tensor) -> torch.Tensor:
            """[B, F] features of an episode -> [N, F], one row per judged frame."""
            return x.view(b, *[1] * (len(lead) - 1), -1).expand(*lead, -1).reshape(n, -1)

        t_b = self.task_features(task, b, frames.device)  # [B, C]
        t = per_frame(t_b)
        shift = cfg.augment_shift
        dy, dx = torch.randint(-shift, shift + 1, (2,)).tolist() if self.training and shift > 0 else (0, 0)

        def shifted(images: torch.Tensor) -> torch.Tensor:
            # One shift for the frames and the first frame: where things are relative to each other stays.
            return torch.roll(images, (dy, dx), (-2, -1)) if dy or dx else images

        parts = []
        if cfg.use_frame:
            parts.append(self._where(shifted(frames.reshape(n * v, *frames.shape[-3:])), t).view(n, -1))
        if cfg.use_first_frame:
            if first is None or tuple(first.shape) != (b, *frames.shape[-4:]):
                got = None if first is None else list(first.shape)
                raise ValueError(
                    f"outcome heads read the episode's first frame (heads.use_first_frame): expected "
                    f"[{b}, {', '.join(map(str, frames.shape[-4:]))}], got {got}"
                )
            anchor = self._where(shifted(first.reshape(b * v, *first.shape[-3:])), t_b).view(b, -1)
            parts.append(per_frame(anchor))
        parts.append(t)
        if self.state_embed is not None:
            if state is None or tuple(state.shape[:-1]) != tuple(lead):
                got = None if state is None else list(state.shape)
                raise ValueError(
                    f"outcome heads read the joint state (heads.use_state): expected state "
                    f"[{', '.join(map(str, lead))}, S], got {got}"
                )
            parts.append(self.state_embed(state.reshape(n, -1)))
        reward, success, done = self.out(self.mix(torch.cat(parts, -1))).view(*lead, 3).unbind(-1)
        return {"reward": reward, "success_logit": success, "done_logit": done}
