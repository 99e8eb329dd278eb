"""Keep the policy reading drawn frames as it reads real ones, so what it learns in imagination transfers.

RL in imagination updates the policy on observations the world model drew. Where the drawn frames differ
from real ones (a blurred arm, a cube drawn a few pixels off), the policy can learn to act well on the
drawings and not on the camera: measured on the RL setting, the fine-tuned arm reached the named cube in 73%
of imagined episodes (judged by the sim's rule on the imagined joint states) and in 55% of sim episodes
from the same starts, where the BC policy scored 58% and 57% (benchmarks/results/imagination_eval_gap_*).

The world model's own data has real frames with the actions that followed them. Replaying those actions
open loop in the world model from each episode's first frame gives, every `every` steps, the observation
the policy would see in imagination next to the real observation of the same moment: the same instruction,
(nearly) the same joint state, the frame drawn or filmed. The alignment loss pulls the policy's
observation tokens of the drawn one towards those of the real one (a fixed target: no gradient through
it), so the encoder learns to read both alike and the changes RL makes downstream of it act on the camera
too. The replays use no simulator: recorded data and the world model only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from data.dataset import DatasetConfig, EpisodeDataset
from data.features import STATE, TASK, image_key
from world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig, from_dataset


@dataclass
class ObservationAlignmentConfig:
    weight: float = 0.0  # weight of the alignment loss next to the RL loss; 0: off
    dataset_root: str = ""  # recorded episodes (e.g. the world model's data): real frames and their actions
    # Replayed: up to this many of the episodes world-model training holds out of this dataset (its default
    # 10% split), whose drawn frames have the errors of new starts.
    episodes: int = 60
    every: int = 5  # steps between paired observations (the policy's n_action_steps)
    batch_size: int = 32  # pairs per gradient step
    seed: int = 0

    def validate(self) -> None:
        if self.weight < 0:
            raise ValueError(f"align.weight={self.weight}; expected >= 0 (0: off)")
        if self.weight > 0 and not self.dataset_root:
            raise ValueError("align.weight > 0 needs align.dataset_root: recorded episodes to replay")
        if self.episodes < 1 or self.every < 1 or self.batch_size < 1:
            raise ValueError("align.episodes, align.every and align.batch_size must be >= 1")


@dataclass
class PairedObservations:
    """N moments seen twice: `real` and `imagined` policy batches (frames float [N, 3, H, W] in [0, 1])."""

    real: dict
    imagined: dict

    def __len__(self) -> int:
        return len(self.real[TASK])

    def batch(self, index: torch.Tensor) -> tuple[dict, dict]:
        return _rows(self.real, index), _rows(self.imagined, index)


def _rows(obs: dict, index: torch.Tensor) -> dict:
    return {k: [v[i] for i in index.tolist()] if k == TASK else v[index] for k, v in obs.items()}


@torch.no_grad()
def paired_observations(env: WorldModelEnv, cfg: ObservationAlignmentConfig) -> PairedObservations:
    """Replay up to `cfg.episodes` held-out episodes of `cfg.dataset_root` in `env`'s world model from their
    first frames; pair the observation imagined after every `cfg.every` steps with the recorded one."""
    size = env.world_model.cfg.dit.image_size
    joints = env.embodiment.num_joints
    dataset = EpisodeDataset(
        DatasetConfig(
            root=cfg.dataset_root,
            cameras=list(env.cameras),
            image_size=[size, size],
            state_dim=joints,
            action_dim=joints,
        )
    )
    episodes = dataset.split()[1][: cfg.episodes]
    chosen = dataset.select_episodes(episodes)
    length = min(ep.length for ep in chosen)
    if length <= cfg.every:
        raise ValueError(
            f"align.dataset_root={cfg.dataset_root}: its shortest episode has {length} frames; pairing every "
            f"{cfg.every} steps needs more"
        )
    table = dataset.frame_table()
    starts = from_dataset(dataset, episodes, env.cameras, context=1)
    replay = WorldModelEnv(
        env.world_model,
        WorldModelEnvConfig(
            horizon=length - 1, sampler_steps=env.config.sampler_steps, terminate_on_success=False
        ),
        embodiment=env.embodiment,
    )
    replay.reset(starts, seed=cfg.seed)
    first = torch.tensor([ep.start for ep in chosen])
    real, imagined = [], []
    for t in range(cfg.every, length, cfg.every):
        actions = torch.stack([table.action[first + k] for k in range(t - cfg.every, t)], 1)
        obs, *_ = replay.step(actions)
        rows = first + t
        real.append(
            {
                **{image_key(c): table.images[c][rows].float() / 255 for c in env.cameras},
                STATE: table.state[rows],
                TASK: [table.task[int(r)] for r in rows],
            }
        )
        imagined.append(obs)
    return PairedObservations(_concat(real), _concat(imagined))


def _concat(batches: list[dict]) -> dict:
    return {
        k: sum((b[k] for b in batches), []) if k == TASK else torch.cat([b[k] for b in batches])
        for k in batches[0]
    }


def alignment_loss(policy, real: dict, imagined: dict) -> torch.Tensor:
    """Squared distance of the drawn observation's tokens to the real one's (fixed), relative to the real
    tokens' mean square: scale-free, 0 when the encoder reads both alike."""
    with torch.no_grad():
        target, pad = policy.encode_observation(real)
    tokens, _ = policy.encode_observation(imagined)
    keep = (~pad).unsqueeze(-1).to(tokens.dtype)
    error = ((tokens - target) ** 2 * keep).sum()
    return error / (target**2 * keep).sum().clamp_min(1e-8)
