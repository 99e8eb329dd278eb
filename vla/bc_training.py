"""Behaviour cloning of any registered policy on a local LeRobotDataset, through the shared training loop.

The policy is chosen by `policy.type` (flow_vla | act | diffusion) and configured by the matching section;
stats come from the training episodes only; sim evaluation (optional) runs on the EMA weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import save_json
from worldloop.common.config import ConfigError, save_config
from worldloop.common.rng import torch_seeded
from worldloop.common.training import TrainLoopConfig, run_training
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import SUCCESS
from worldloop.data.stats import dataset_stats
from worldloop.data.windows import PolicySamples
from worldloop.vla.factory import make_policy, policy_classes
from worldloop.vla.flow_vla import FlowVLAConfig
from worldloop.vla.lerobot_adapters import ACTAdapterConfig, DiffusionAdapterConfig
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim


@dataclass
class PolicyChoice:
    type: str = "flow_vla"  # which of the sections below is used
    flow_vla: FlowVLAConfig = field(default_factory=FlowVLAConfig)
    act: ACTAdapterConfig = field(default_factory=ACTAdapterConfig)
    diffusion: DiffusionAdapterConfig = field(default_factory=DiffusionAdapterConfig)

    def selected(self):
        policy_classes(self.type)  # unknown type -> clear error
        return getattr(self, self.type)


@dataclass
class SimEvalDuringTraining:
    episodes: int = 0  # 0: no sim evaluation
    seed: int = 100_000
    env: SimEvalConfig = field(default_factory=SimEvalConfig)


@dataclass
class TrainPolicyConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # Train on the first N training episodes only (0: all); the benchmark of dataset sizes uses this.
    max_episodes: int = 0
    # Train only on episodes that reach `next.success` (demos of mixed skill include failed attempts, e.g.
    # reaching for the wrong cube, which BC would imitate). Needs the dataset's next.success column.
    successful_episodes_only: bool = False
    policy: PolicyChoice = field(default_factory=PolicyChoice)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: SimEvalDuringTraining = field(default_factory=SimEvalDuringTraining)
    output_dir: str = "outputs/policy/tiny"
    resume: bool = False


def _open_dataset(cfg: TrainPolicyConfig, policy_cfg) -> EpisodeDataset:
    ds_cfg = cfg.dataset
    cameras, size = list(policy_cfg.cameras), list(policy_cfg.image_size)
    if ds_cfg.cameras and list(ds_cfg.cameras) != cameras:
        raise ConfigError(
            f"dataset.cameras {ds_cfg.cameras} differ from policy.{cfg.policy.type}.cameras {cameras}"
        )
    if ds_cfg.image_size and list(ds_cfg.image_size) != size:
        raise ConfigError(
            f"dataset.image_size {ds_cfg.image_size} differs from policy.{cfg.policy.type}.image_size {size}"
        )
    ds_cfg.cameras, ds_cfg.image_size = cameras, size
    ds_cfg.state_dim, ds_cfg.action_dim = policy_cfg.state_dim, policy_cfg.action_dim
    return EpisodeDataset(ds_cfg)


def _successful(dataset: EpisodeDataset, episodes: list[int]) -> list[int]:
    if SUCCESS not in dataset.reward_keys:
        raise ConfigError(
            f"successful_episodes_only: dataset {dataset.root} has no {SUCCESS} column to select episodes by"
        )
    cols = dataset.numeric_columns([SUCCESS])
    success = cols[SUCCESS].reshape(-1).astype(bool)
    kept = [ep.index for ep in dataset.select_episodes(episodes) if success[ep.start : ep.end].any()]
    if not kept:
        raise ConfigError(f"successful_episodes_only: none of the {len(episodes)} training episodes succeeds")
    return kept


def train_policy(cfg: TrainPolicyConfig):
    """Train and return the (EMA) policy; writes under `cfg.output_dir` (see common/training.py)."""
    policy_cfg = cfg.policy.selected()
    dataset = _open_dataset(cfg, policy_cfg)
    train_episodes, held_out = dataset.split()
    if cfg.successful_episodes_only:
        train_episodes = _successful(dataset, train_episodes)
    if cfg.max_episodes:
        if cfg.max_episodes > len(train_episodes):
            raise ConfigError(
                f"max_episodes={cfg.max_episodes}, but {dataset.root} has {len(train_episodes)} training episodes"
            )
        train_episodes = train_episodes[: cfg.max_episodes]
    stats = dataset_stats(dataset, train_episodes)
    # The initial weights follow the run's seed (`train.seed` also sets the data order and the noise), so
    # that runs on different seeds are independent draws and a rerun on the same seed starts the same.
    with torch_seeded(cfg.train.seed):
        policy = make_policy(cfg.policy.type, policy_cfg, stats)
    samples = PolicySamples(dataset, train_episodes, chunk_size=policy.training_chunk_size)

    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, output_dir / "train_config.yaml")
    save_json({"train": train_episodes, "held_out": held_out}, output_dir / "episodes.json")

    eval_fn = None
    if cfg.eval.episodes > 0:

        def eval_fn(model, step: int, eval_dir: Path) -> dict[str, float]:
            summary = evaluate_in_sim(
                model, cfg.eval.env, cfg.eval.episodes, cfg.eval.seed, eval_dir, progress_bar=False
            )
            save_json(summary | {"step": step}, eval_dir / "summary.json")
            return {"success_rate": summary["success_rate"], "mean_progress": summary["mean_progress"]}

    return run_training(
        policy,
        samples,
        loss_fn=lambda model, batch: model(batch),
        cfg=cfg.train,
        output_dir=output_dir,
        save_pretrained=lambda model, directory: model.save_pretrained(directory),
        resume=cfg.resume,
        eval_fn=eval_fn,
    )
