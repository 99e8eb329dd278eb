"""World-model post-training with rewards: rollout stability, then executability (either alone, or both).

Each stage is one run of the shared training loop (common/training.py: accelerate, EMA, warmup + cosine,
tqdm, TensorBoard logs, atomic checkpoints, exact resume). What the loop trains is a `PosttrainObjective`,
a module that holds three world models:

    policy     the model being post-trained (only its DiT; the IDM and outcome heads stay frozen: the IDM
               is the executability reward model and must not learn to please itself)
    old        the sampling model of DiffusionNFT, a frozen copy that follows `policy` softly
    reference  the frozen pre-trained model the regulariser pulls towards

All three live in the module's state dict, so a checkpoint holds them all and a resumed run continues
exactly. Its forward (called by the loop on a batch of real start windows) rolls out G candidates per
start state with `old`, scores them with the stage's reward and returns the NFT loss
(rl_finetune/nft.py). Exports are plain world-model checkpoints of `policy` (EMA weights).

Layout: <output_dir>/<k>_<stage>/ is the training loop's output directory of stage k; stage k + 1 starts
from stage k's `pretrained_model/`; every stage regularises towards the original base model;
<output_dir>/pretrained_model/ is the final model (a copy of the last stage's export).
"""

from __future__ import annotations

import copy
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from worldloop.common.checkpoint import atomic_directory, load_json
from worldloop.common.config import ConfigError, save_config
from worldloop.common.ema import follow
from worldloop.common.embodiment import write_embodiment
from worldloop.common.training import TrainLoopConfig, last_checkpoint, run_training
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.windows import WorldModelWindows
from worldloop.rl_finetune.nft import NFTConfig, nft_loss, optimality_probability
from worldloop.rl_finetune.wm_posttrain.denoise import NoisedClip, predict_x0
from worldloop.rl_finetune.wm_posttrain.evaluation import (
    executability_summary,
    fidelity_summary,
    held_out_rollouts,
)
from worldloop.rl_finetune.wm_posttrain.executability import ExecutabilityRewardConfig, executability_reward
from worldloop.rl_finetune.wm_posttrain.rollout_stability import FidelityRewardConfig, clip_fidelity_reward
from worldloop.world_model.checkpoint_inputs import dataset_config_for, embodiment_of
from worldloop.world_model.model import EMBODIMENT_FILE, WorldModel

STAGES = ("stability", "executability")


@dataclass
class RolloutGroupConfig:
    group_size: int = 4  # G candidate futures per start state
    min_length: int = 4  # L ~ U{min_length..max_length} per step (4 is the least jerk needs)
    max_length: int = 8
    context: int = 0  # real frames a rollout starts from; 0 -> the model's dit.context_frames
    sampler_steps: int = 0  # denoising steps per frame; 0 -> the model's own sampler config

    def validate(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"rollouts.group_size={self.group_size}: NFT compares candidates, use >= 2")
        if not 4 <= self.min_length <= self.max_length:
            raise ValueError(
                f"need 4 <= rollouts.min_length <= rollouts.max_length, got {self.min_length}, {self.max_length}"
            )
        if self.context < 0 or self.sampler_steps < 0:
            raise ValueError("rollouts.context and rollouts.sampler_steps must be >= 0")


@dataclass
class WorldModelPath:
    path: str = ""  # the world model to post-train: a pretrained_model/ directory of train_world_model.py


@dataclass
class PosttrainLoopConfig(TrainLoopConfig):
    """The shared loop's settings with post-training defaults: every step costs G rollouts per start state,
    so steps and batches are few, and the learning rate is small (the model is already trained)."""

    steps: int = 200
    batch_size: int = 2
    lr: float = 1e-5
    warmup_steps: int = 10
    ema_decay: float = 0.99
    checkpoint_every: int = 50
    log_every: int = 5


@dataclass
class PosttrainConfig:
    world_model: WorldModelPath = field(default_factory=WorldModelPath)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # The robot whose joint limits the executability terms score decoded motion against: "" -> the one the
    # world model's checkpoint stores; a built-in name or YAML file must agree with it (or names it for an
    # older checkpoint, and the post-trained model then stores it).
    embodiment: str = ""
    output_dir: str = "outputs/wm_posttrain"
    stages: list[str] = field(default_factory=lambda: ["stability", "executability"])
    resume: bool = False  # continue the unfinished stage from its last checkpoint, skip finished ones
    start_stride: int = 1  # stride between training start windows within an episode
    eval_start_states: int = 8  # held-out start states scored at each evaluation
    rollouts: RolloutGroupConfig = field(default_factory=RolloutGroupConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)
    fidelity: FidelityRewardConfig = field(default_factory=FidelityRewardConfig)
    executability: ExecutabilityRewardConfig = field(default_factory=ExecutabilityRewardConfig)
    train: PosttrainLoopConfig = field(default_factory=PosttrainLoopConfig)

    def validate(self) -> None:
        if not self.world_model.path:
            raise ConfigError("--world_model.path is required: a world-model pretrained_model/ directory")
        if (
            not self.stages
            or any(s not in STAGES for s in self.stages)
            or len(set(self.stages)) != len(self.stages)
        ):
            raise ConfigError(
                f"stages={self.stages}: expected a non-empty list of distinct names from {STAGES}"
            )
        if self.start_stride < 1 or self.eval_start_states < 0:
            raise ConfigError("start_stride must be >= 1 and eval_start_states >= 0")
        for part in (self.rollouts, self.nft, self.fidelity, self.executability):
            try:
                part.validate()
            except ValueError as e:
                raise ConfigError(str(e)) from e


class PosttrainObjective(nn.Module):
    """policy / old / reference world models and one stage's reward; forward(batch) -> (loss, logs)."""

    def __init__(
        self,
        base: WorldModel,
        reference: WorldModel,
        stage: str,
        cfg: PosttrainConfig,
    ):
        super().__init__()
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} unknown; expected one of {STAGES}")
        if stage == "executability" and base.cfg.idm.use_state:
            raise ValueError(
                "the executability reward decodes actions from generated frames alone, but this model's IDM "
                "reads the joint state (idm.use_state=True), which a rollout does not have"
            )
        self.stage, self.cfg = stage, cfg
        self.spec = embodiment_of(base, cfg.embodiment)
        self.policy = base
        self.policy.heads.requires_grad_(False)
        self.policy.idm.requires_grad_(False)
        self.old = copy.deepcopy(base).requires_grad_(False).eval()
        self.reference = reference.requires_grad_(False).eval()
        self.context = cfg.rollouts.context or base.cfg.dit.context_frames

    def follow_policy(self) -> None:
        """theta_old <- d theta_old + (1 - d) theta (DiffusionNFT's soft update of the sampling model)."""
        follow(self.old, self.policy, self.cfg.nft.old_decay)

    def rewards(
        self, generated: torch.Tensor, real: torch.Tensor, last_context: torch.Tensor, commanded: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Rewards [N] of candidate clips and every term [N] (both stages' terms, only one is optimised)."""
        fidelity, fid_terms = clip_fidelity_reward(generated, real, self.cfg.fidelity)
        decoded = self.reference.infer_actions(torch.cat([last_context, generated], 1))
        executable, exec_terms = executability_reward(decoded, commanded, self.spec, self.cfg.executability)
        terms = {f"fidelity/{k}": v for k, v in fid_terms.items()}
        terms.update({f"exec/{k}": v for k, v in exec_terms.items()})
        terms["exec/reward"] = executable
        return (fidelity if self.stage == "stability" else executable), terms

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, c, g = self.cfg, self.context, self.cfg.rollouts.group_size
        frames, actions = batch["frames"], batch["actions"].float()
        if frames.dtype == torch.uint8:
            frames = frames.float() / 255
        length = int(torch.randint(cfg.rollouts.min_length, cfg.rollouts.max_length + 1, ()))
        if frames.shape[1] < c + length:
            raise ValueError(
                f"start windows hold {frames.shape[1]} frames; context {c} + length {length} needed"
            )
        if self.training:
            self.follow_policy()

        # G candidates per start state, sampled by the old model on its own predictions.
        frames = frames[:, : c + length].repeat_interleave(g, 0)
        actions = actions[:, : c + length].repeat_interleave(g, 0)
        commanded = actions[:, c - 1 : c - 1 + length]
        steps = cfg.rollouts.sampler_steps or None
        with torch.no_grad():
            generated, _, _ = self.old.rollout(frames[:, :c], actions[:, : c - 1], commanded, steps=steps)
            reward, terms = self.rewards(generated, frames[:, c:], frames[:, c - 1 : c], commanded)
            r = optimality_probability(reward.view(-1, g), cfg.nft.advantage_clip).flatten()

        # The candidate clip with its real context, as the DiT sees it (pixels in [-1, 1] or latents of the
        # frozen codec; in latent space the decoded frames are re-encoded, which is close to, not exactly, the
        # latents the rollout produced).
        x = self.policy.codec.encode(WorldModel.frames_in(torch.cat([frames[:, :c], generated], 1)))
        noised = NoisedClip.draw(x, c, cfg.nft.t_min, cfg.nft.t_max)
        x0_theta = predict_x0(self.policy, x, actions, noised)[:, c - 1 :]
        # Passes whose result is known are skipped (each costs as much as the policy's forward pass):
        # on-policy (old_decay 0) the old model is the policy; without the regulariser x0_ref is unused.
        with torch.no_grad():
            if cfg.nft.old_decay == 0:
                x0_old = x0_theta.detach()
            else:
                x0_old = predict_x0(self.old, x, actions, noised)[:, c - 1 :]
            if cfg.nft.reference_weight == 0:
                x0_ref = x0_theta.detach()
            else:
                x0_ref = predict_x0(self.reference, x, actions, noised)[:, c - 1 :]
        loss, logs = nft_loss(x0_theta, x0_old, x0_ref, x[:, c:], r, cfg.nft)
        logs.update({k: float(v.mean()) for k, v in terms.items()})
        logs["reward/mean"] = float(reward.mean())
        logs["reward/group_std"] = float(reward.view(-1, g).std(1).mean())
        logs["rollout/length"] = float(length)
        return loss, logs


def _posttrain_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
    return model(batch)


def _save_policy(model: nn.Module, directory: Path) -> None:
    model.policy.save_pretrained(directory)


def _open_data(
    cfg: PosttrainConfig, base: WorldModel, context: int
) -> tuple[WorldModelWindows, WorldModelWindows | None]:
    # The dataset is checked against what the model reads: errors then name the camera or feature.
    ds = dataset_config_for(base.cfg, cfg.dataset)
    dataset = EpisodeDataset(ds)
    train_eps, held_out_eps = dataset.split()
    horizon = cfg.rollouts.max_length
    train = WorldModelWindows(dataset, train_eps, context=context, horizon=horizon, stride=cfg.start_stride)
    if not held_out_eps:
        print(f"dataset {ds.root}: no held-out episodes (dataset.held_out_fraction=0): no evaluation")
        return train, None
    try:
        held_out = WorldModelWindows(dataset, held_out_eps, context=context, horizon=horizon, stride=horizon)
    except DatasetError:
        print(
            f"dataset {ds.root}: held-out episodes are shorter than context + rollouts.max_length: no evaluation"
        )
        return train, None
    return train, held_out


def run_stage(
    stage: str,
    base: WorldModel,
    reference: WorldModel,
    train_windows: WorldModelWindows,
    eval_windows: WorldModelWindows | None,
    cfg: PosttrainConfig,
    stage_dir: Path,
    resume: bool,
) -> WorldModel:
    """One stage through the shared loop; returns the exported (EMA) world model."""
    objective = PosttrainObjective(base, reference, stage, cfg)
    count = min(cfg.eval_start_states, len(eval_windows)) if eval_windows is not None else 0
    eval_indices = torch.linspace(0, len(eval_windows) - 1, count).round().long().tolist() if count else []

    def evaluate(model: nn.Module, step: int, eval_dir: Path) -> dict[str, float]:
        if not eval_indices:
            return {}
        result = held_out_rollouts(
            model.policy,
            eval_windows,
            eval_indices,
            objective.context,
            cfg.rollouts.max_length,
            cfg.fidelity,
            seed=cfg.train.seed,
        )
        return {
            **fidelity_summary(result, [1, cfg.rollouts.max_length]),
            **executability_summary(result, objective.spec),
        }

    exported = run_training(
        objective,
        train_windows,
        _posttrain_loss,
        cfg.train,
        stage_dir,
        _save_policy,
        resume=resume,
        eval_fn=evaluate,
    )
    return exported.policy


def warn_if_candidates_alike(model: WorldModel, stages: list[str]) -> None:
    """Rollout stability learns only from how a group's candidates differ. A model trained only at high
    noise levels (noise_floor > 0) regresses its x0 estimate whatever the noise, so its candidates barely
    differ: measured on the tiny model, floor 0.3 gave a group reward std of 0.003 and no gain, floor 0 twice
    that spread and a 0.78 paired win rate (README, issue 6)."""
    if "stability" in stages and model.cfg.noise_floor > 0:
        warnings.warn(
            f"the world model was trained at noise levels >= {model.cfg.noise_floor} (model.noise_floor): "
            "its rollouts hardly depend on the sampling noise, so rollout-stability candidates barely differ "
            "and post-training has little to learn from. Fine-tune it down to noise 0 first "
            "(--model.noise_floor=0.0 --model.sampler.steps=4).",
            stacklevel=2,
        )


def run_posttraining(cfg: PosttrainConfig) -> Path:
    """Run the configured stages in order; the last one's export is copied to <output_dir>/pretrained_model."""
    cfg.validate()
    reference = WorldModel.from_pretrained(cfg.world_model.path)
    spec = embodiment_of(reference, cfg.embodiment)
    warn_if_candidates_alike(reference, cfg.stages)
    context = cfg.rollouts.context or reference.cfg.dit.context_frames
    train_windows, eval_windows = _open_data(cfg, reference, context)
    output = Path(cfg.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    save_config(cfg, output / "posttrain_config.yaml")
    current = Path(cfg.world_model.path)
    for k, stage in enumerate(cfg.stages):
        stage_dir = output / f"{k}_{stage}"
        checkpoint = last_checkpoint(stage_dir)
        if checkpoint is not None and not cfg.resume:
            raise ConfigError(
                f"{stage_dir} holds checkpoints; pass --resume=true to continue, or another output_dir"
            )
        done = load_json(checkpoint / "training_state" / "state.json")["step"] if checkpoint else 0
        if done >= cfg.train.steps:
            exported = stage_dir / "pretrained_model"
            # Interrupted between the last checkpoint and the export: the checkpoint holds the same weights.
            current = exported if exported.is_dir() else checkpoint / "pretrained_model"
            print(f"stage {stage}: finished earlier ({done} steps), using {current}")
            continue
        print(f"stage {stage}: from {current}" + (f", resuming at step {done}" if checkpoint else ""))
        base = WorldModel.from_pretrained(current)
        base.embodiment = spec  # stored in the export (an older checkpoint gets the one it was named)
        stage_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, stage_dir / "posttrain_config.yaml")  # the settings this stage last ran with
        run_stage(stage, base, reference, train_windows, eval_windows, cfg, stage_dir, checkpoint is not None)
        current = stage_dir / "pretrained_model"
    final = output / "pretrained_model"
    with atomic_directory(final) as tmp:
        for name in ("config.yaml", "model.safetensors", "stats.json"):
            shutil.copy2(current / name, tmp / name)
        write_embodiment(spec, tmp / EMBODIMENT_FILE)
    return final
