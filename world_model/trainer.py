"""Supervised world-model training on a local LeRobotDataset through the shared accelerate loop.

    accelerate launch train_world_model.py --config configs/world_model/tiny.yaml --dataset.root=outputs/data/tabletop

Training windows are `window` consecutive frames of the training episodes (every frame after the first is
a target). Normalisation stats come from the training episodes only. Evaluation rolls the EMA model out
on held-out episodes and writes metrics, a side-by-side video and a horizon plot under output_dir/eval/.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from accelerate import PartialState
from torch.utils.data import ConcatDataset, Dataset

from worldloop.common.checkpoint import atomic_directory, load_matching_weights, save_json
from worldloop.common.config import ConfigError, config_differences, load_config
from worldloop.common.embodiment import EmbodimentSpec, load_embodiment_file
from worldloop.common.rng import torch_seeded
from worldloop.common.training import TrainLoopConfig, run_training
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.embodiment import AUTO, DEFAULT_MARGIN, embodiment_for_dataset
from worldloop.data.features import ENVIRONMENT_STATE
from worldloop.data.stats import Stats, dataset_stats, environment_state_stats, load_stats
from worldloop.data.windows import CounterfactualPairs, WorldModelWindows, pair_collate, repeat_moving_windows
from worldloop.world_model.checkpoint_inputs import dataset_config_for
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.imagined_windows import ImaginedWindows
from worldloop.world_model.metrics import HeldOutWindows, imagine, rollout_fidelity, summarize
from worldloop.world_model.model import EMBODIMENT_FILE, WorldModel
from worldloop.world_model.still_calibration import calibrate_still_threshold
from worldloop.world_model.success_calibration import calibrate_success_threshold
from worldloop.world_model.training_record import write_training_record
from worldloop.world_model.visualize import horizon_plot, side_by_side_video


@dataclass
class EvalConfig:
    context: int = 4  # real frames the rollout starts from
    horizon: int = 30
    max_windows: int = 32  # held-out windows scored (spread over the held-out episodes)
    stride: int = 10  # frames between window starts inside an episode
    video_windows: int = 4  # rows of the side-by-side video
    steps: int = 0  # sampler steps; 0 -> the model's sampler config


@dataclass
class TrainWorldModelConfig:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: WorldModelConfig = field(default_factory=WorldModelConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    window: int = 6  # frames per training window
    # The robot the model is for, stored in its checkpoint for every later stage: "auto" (the built-in spec
    # named by the dataset's robot_type, else from_dataset), "from_dataset" (names, limits and fps derived
    # from the dataset, data/embodiment.py), a built-in name (configs/embodiment/) or a YAML file.
    embodiment: str = AUTO
    embodiment_margin: float = DEFAULT_MARGIN  # from_dataset: share of the recorded range added on each side
    output_dir: str = "outputs/world_model/tiny"
    resume: bool = False
    # Start from this world model's weights (a pretrained_model/ directory) instead of random ones: to
    # fine-tune on new data, or after adding a part (its new parameters start fresh). Stats are recomputed.
    init_from: str = ""
    # Train the outcome heads alone on the (frozen) world model of `init_from`: to fit them again after a
    # change of the heads, or on more labelled episodes; no diffusion pass, so minutes on a CPU. Only
    # model.heads is taken from the command line: the rest of the model config is init_from's.
    heads_only: bool = False
    # The opposite: train the world model with the heads of `init_from` frozen (their config, calibrated
    # threshold included, taken from it too), e.g. to train its frames longer on the video data when its
    # heads were fitted on more labelled episodes than that data has.
    freeze_heads: bool = False
    # With heads_only: also fit the heads on the model's own rollouts of the training episodes (their real
    # labels), the frames they judge in imagination (world_model/imagined_windows.py). Skipped for heads
    # that do not read the judged frame (heads.use_frame=False).
    heads_on_rollouts: bool = True
    # After training, set the heads' success threshold from replays of the held-out episodes
    # (world_model/success_calibration.py); skipped when they are all successes or all failures.
    calibrate_success: bool = True
    # After training (before the success threshold, whose replays it changes), choose the rollout sampler's
    # still-pixel threshold on rollouts of this many windows (eval.context + eval.horizon frames) of the
    # training episodes (world_model/still_calibration.py); 0 leaves `model.sampler.still_threshold` as set.
    # heads_only keeps the sampler of `init_from` (as the rest of its model config), whose frames it does not change.
    still_windows: int = 16
    # Only calibrate the `init_from` model on this dataset (the still-pixel threshold on its training
    # episodes, the success threshold on its held-out ones) and write the result to
    # output_dir/pretrained_model (no training). With dataset.held_out_fraction=0 every episode is used for
    # both: a dataset recorded for calibration, e.g. sim episodes of policies that imagination will not be
    # asked to rank (record_demos.py --policies=[...]).
    calibrate_only: bool = False
    # List each training window where the objects move (observation.environment_state changes by more than
    # object_motion_min, in its own units, within the window) this many times per epoch; 1 lists each once.
    # Needs a dataset that records the objects' state (push does, in metres).
    object_motion_repeat: int = 1
    object_motion_min: float = 0.01


def open_dataset(cfg: TrainWorldModelConfig) -> EpisodeDataset:
    """The dataset with the model's cameras, frame size, state and action sizes enforced (errors name the
    field); the model records the resize its frames go through."""
    dataset = EpisodeDataset(dataset_config_for(cfg.model, cfg.dataset))
    cfg.model.dataset_resize = cfg.dataset.resize
    return dataset


def object_state_size(dataset: EpisodeDataset) -> int:
    """The size of the dataset's `observation.environment_state` (what model.object_state_weight regresses);
    a ConfigError naming the dataset when it records none."""
    if not dataset.environment_state_dim:
        raise ConfigError(
            f"model.object_state_weight > 0 needs {ENVIRONMENT_STATE} in the dataset, but {dataset.root} "
            "records none (sim recordings write it with record_demos.py --environment_state=true)"
        )
    return dataset.environment_state_dim


def training_embodiment(cfg: TrainWorldModelConfig, stored: EmbodimentSpec | None) -> EmbodimentSpec:
    """The embodiment the trained model is for: `cfg.embodiment` resolved on the dataset, or, with
    `embodiment=auto` and a starting model (`init_from`) that stores one, that one. An explicit value that
    differs from the starting model's is an error naming both."""
    if stored is not None and cfg.embodiment == AUTO:
        return stored
    spec = embodiment_for_dataset(cfg.embodiment, cfg.dataset.root, cfg.embodiment_margin)
    if stored is not None and spec != stored:
        raise ConfigError(
            f"--embodiment={cfg.embodiment!r} gives {spec.name!r}, but init_from={cfg.init_from} was trained "
            f"for {stored.name!r} ({'; '.join(spec.differences(stored))})"
        )
    return spec


def held_out_windows(dataset: EpisodeDataset, episodes: list[int], cfg: EvalConfig) -> HeldOutWindows | None:
    """Evenly spread evaluation windows from the held-out episodes (None when none is long enough or
    `cfg.max_windows` is 0)."""
    if cfg.max_windows <= 0:
        return None
    try:
        windows = WorldModelWindows(
            dataset, episodes, context=cfg.context, horizon=cfg.horizon, stride=cfg.stride
        )
    except DatasetError:
        return None
    pick = torch.linspace(0, len(windows) - 1, min(cfg.max_windows, len(windows))).round().long().unique()
    items = [windows[int(i)] for i in pick]
    return HeldOutWindows(
        frames=torch.stack([it["frames"] for it in items]).float() / 255,
        actions=torch.stack([it["actions"] for it in items]),
        reward=torch.stack([it["reward"] for it in items]),
        success=torch.stack([it["success"] for it in items]),
        state=torch.stack([it["state"] for it in items]),
        task=[it["task"] for it in items],
        rows=torch.tensor([windows.starts[int(i)][1] for i in pick]),
    )


def make_eval_fn(windows: HeldOutWindows | None, cfg: EvalConfig):
    def evaluate(model: WorldModel, step: int, eval_dir: Path) -> dict[str, float]:
        if windows is None:
            return {}
        imagined = imagine(model, windows, cfg.context, steps=cfg.steps or None)
        curves = rollout_fidelity(model, windows, cfg.context, imagined)
        eval_dir.mkdir(parents=True, exist_ok=True)
        save_json(curves, eval_dir / "metrics.json")
        n = min(cfg.video_windows, len(windows))
        side_by_side_video(windows.frames[:n, cfg.context :], imagined[0][:n], eval_dir / "rollout.mp4")
        horizon_plot(curves, eval_dir / "horizon.png")
        return summarize(curves)

    return evaluate


def new_model(
    cfg: TrainWorldModelConfig,
    dataset: EpisodeDataset,
    train_eps: list[int],
    embodiment: EmbodimentSpec,
    stats: Stats | None = None,
) -> WorldModel:
    """A world model with fresh weights, drawn from `train.seed` (runs on different seeds are independent draws;
    the seed also sets the data order and the noise), normalised by `stats` or else by the training episodes'
    own (their objects' states too, with object_state_weight > 0, which also sets `model.object_state_dim`)."""
    if cfg.model.object_state_weight > 0:
        cfg.model.object_state_dim = object_state_size(dataset)
    if stats is None:
        stats = dataset_stats(dataset, train_eps)
        if cfg.model.object_state_dim:
            stats |= environment_state_stats(dataset, train_eps)
    with torch_seeded(cfg.train.seed):
        return WorldModel(cfg.model, stats, embodiment)


def training_windows(cfg: TrainWorldModelConfig, dataset: EpisodeDataset, train_eps: list[int]) -> Dataset:
    """The training episodes' `window`-frame windows, those where an object moves listed `object_motion_repeat`
    times; with `model.counterfactual_weight` (not for heads alone), their counterfactual pairs instead
    (batched by `data.windows.pair_collate`)."""
    windows = WorldModelWindows(dataset, train_eps, context=1, horizon=cfg.window - 1)
    if cfg.model.counterfactual_weight > 0 and not cfg.heads_only:
        if cfg.object_motion_repeat != 1:
            raise ConfigError(
                f"object_motion_repeat={cfg.object_motion_repeat} with model.counterfactual_weight="
                f"{cfg.model.counterfactual_weight}: pairs are drawn as recorded; set one of them"
            )
        try:
            pairs = CounterfactualPairs(windows)
        except DatasetError as e:
            raise ConfigError(f"model.counterfactual_weight={cfg.model.counterfactual_weight}: {e}") from e
        print(
            f"counterfactual pairs: {len(pairs)} pairs of windows, from {pairs.starts} starts taken twice or more"
        )
        return pairs
    if cfg.object_motion_repeat == 1:
        return windows
    try:
        return repeat_moving_windows(windows, cfg.object_motion_repeat, cfg.object_motion_min)
    except (DatasetError, ValueError) as e:
        raise ConfigError(f"object_motion_repeat={cfg.object_motion_repeat}: {e}") from e


def train(cfg: TrainWorldModelConfig) -> WorldModel:
    started = time.perf_counter()
    if cfg.window < 2:
        raise ValueError(f"window={cfg.window}: a training window needs at least 2 frames")
    if (cfg.heads_only or cfg.calibrate_only or cfg.freeze_heads) and not cfg.init_from:
        raise ValueError(
            "heads_only / calibrate_only / freeze_heads work on an existing world model: set init_from"
        )
    if cfg.heads_only and cfg.freeze_heads:
        raise ValueError("heads_only and freeze_heads together would train nothing: pick one")
    if cfg.calibrate_only:
        model = WorldModel.from_pretrained(cfg.init_from)
        cfg.model = model.cfg  # the dataset is read as this model sees it
        dataset = open_dataset(cfg)
        model.embodiment = training_embodiment(cfg, model.embodiment)
        train_eps, held_eps = dataset.split()
        if cfg.dataset.held_out_fraction == 0:
            train_eps = held_eps = dataset.episode_indices
        calibrate_exported(model, dataset, train_eps, held_eps, cfg)
        return model
    if cfg.freeze_heads:
        cfg.model.heads = load_config(WorldModelConfig, Path(cfg.init_from) / "config.yaml").heads
    if cfg.heads_only:
        # The frames stay as the frozen model draws them: outside its heads the model is init_from's, config
        # included (its sampler and still-pixel threshold, its warp read), so the rollouts the heads fit on
        # are the ones it draws in imagination; there is nothing new to pick.
        frozen = replace(
            load_config(WorldModelConfig, Path(cfg.init_from) / "config.yaml"), heads=cfg.model.heads
        )
        set_aside = config_differences(frozen, cfg.model)
        if set_aside:
            print(
                f"heads_only: the model outside its heads is {cfg.init_from}'s; not applied: {', '.join(set_aside)}"
            )
        cfg = replace(cfg, model=frozen, still_windows=0)
    dataset = open_dataset(cfg)
    stored = Path(cfg.init_from, EMBODIMENT_FILE) if cfg.init_from else None
    embodiment = training_embodiment(
        cfg, load_embodiment_file(stored) if stored and stored.is_file() else None
    )
    print(f"embodiment: {embodiment.name} ({embodiment.num_joints} joints, {embodiment.fps} fps)")
    train_eps, held_eps = dataset.split()
    # Heads fitted on a frozen model must see inputs normalised as the model was trained.
    stats = load_stats(Path(cfg.init_from) / "stats.json") if cfg.heads_only else None
    model = new_model(cfg, dataset, train_eps, embodiment, stats)
    # heads_only loads the frozen model on resume too: the rollouts the heads fit on are drawn before the
    # checkpoint's (identical) weights are restored.
    if cfg.init_from and (not cfg.resume or cfg.heads_only):
        fresh = load_matching_weights(model, Path(cfg.init_from) / "model.safetensors")
        frozen_fresh = [k for k in fresh if not k.startswith("heads.")]
        if cfg.heads_only and frozen_fresh:
            raise ValueError(
                f"heads_only=True but {cfg.init_from}/model.safetensors does not fit its config.yaml outside the "
                f"heads ({', '.join(frozen_fresh[:4])}...): those parts would stay random"
            )
    if cfg.heads_only:
        model.freeze_all_but_heads()
    if cfg.freeze_heads:
        model.heads.requires_grad_(False)
    windows = training_windows(cfg, dataset, train_eps)
    # Heads that do not read the judged frame (heads.use_frame=False) gain nothing from drawn ones.
    if cfg.heads_only and cfg.heads_on_rollouts and model.cfg.heads.use_frame:
        windows = ConcatDataset(
            [windows, ImaginedWindows(model, dataset, train_eps, cfg.window, seed=cfg.train.seed)]
        )
    eval_windows = held_out_windows(dataset, held_eps, cfg.eval)
    model = run_training(
        model,
        windows,
        loss_fn=lambda m, batch: m(batch, heads_only=cfg.heads_only),
        cfg=cfg.train,
        output_dir=cfg.output_dir,
        save_pretrained=lambda m, path: m.save_pretrained(path),
        resume=cfg.resume,
        eval_fn=make_eval_fn(eval_windows, cfg.eval),
        collate_fn=pair_collate if isinstance(windows, CounterfactualPairs) else None,
    )
    calibrate_exported(model, dataset, train_eps, held_eps, cfg)
    state = PartialState()
    if state.is_main_process:
        write_training_record(
            Path(cfg.output_dir) / "pretrained_model",
            seconds=time.perf_counter() - started,
            steps=cfg.train.steps,
            processes=state.num_processes,
            resumed=cfg.resume,
            init_from=cfg.init_from,
        )
    return model


def calibrate_exported(
    model: WorldModel,
    dataset: EpisodeDataset,
    train_episodes: list[int],
    held_episodes: list[int],
    cfg: TrainWorldModelConfig,
) -> None:
    """Calibrate the sampler's still-pixel threshold on `train_episodes` (with `still_windows`), then the
    success threshold on `held_episodes` (with `calibrate_success`), and write the model into
    output_dir/pretrained_model; the tables behind the choices go to output_dir/eval/. The main process alone
    calibrates (it alone writes); other processes return their model as trained."""
    if not PartialState().is_main_process:
        return
    output_dir = Path(cfg.output_dir)
    changed = calibrate_still(model.eval(), dataset, train_episodes, cfg, output_dir)
    if cfg.calibrate_success:
        changed = calibrate_success(model, dataset, held_episodes, output_dir) or changed
    if changed:
        with atomic_directory(output_dir / "pretrained_model") as tmp:
            model.save_pretrained(tmp)


def calibrate_still(
    model: WorldModel,
    dataset: EpisodeDataset,
    episodes: list[int],
    cfg: TrainWorldModelConfig,
    output_dir: Path,
) -> bool:
    """Set `model.cfg.sampler.still_threshold` from rollouts of `cfg.still_windows` windows of `episodes`
    (report in output_dir/eval/still_calibration.json); False when skipped."""
    if cfg.still_windows <= 0:
        return False
    windows = held_out_windows(dataset, episodes, replace(cfg.eval, max_windows=cfg.still_windows))
    if windows is None:
        print(
            f"still-pixel threshold left at {model.cfg.sampler.still_threshold}: no training episode has "
            f"{cfg.eval.context + cfg.eval.horizon} frames"
        )
        return False
    report = calibrate_still_threshold(model, windows, cfg.eval.context)
    model.cfg.sampler.still_threshold = report["threshold"]
    best = next(r for r in report["candidates"] if r["threshold"] == report["threshold"])
    print(
        f"still-pixel threshold {report['threshold']} (mean SSIM {best['mean_ssim']:.4f} over h1-"
        f"{report['horizon']} on {report['windows']} training windows; copy-last "
        f"{report['copy_last']['mean_ssim']:.4f})"
    )
    save_json(report, output_dir / "eval" / "still_calibration.json")
    return True


def calibrate_success(
    model: WorldModel, dataset: EpisodeDataset, episodes: list[int], output_dir: Path
) -> bool:
    """Set the heads' success threshold from replays of `episodes` (report in
    output_dir/eval/success_calibration.json); False when the episodes cannot calibrate it."""
    try:
        report = calibrate_success_threshold(model.eval(), dataset, episodes)
    except ValueError as e:
        print(f"success threshold left at {model.cfg.heads.success_threshold}: {e}")
        return False
    model.cfg.heads.success_threshold = report["threshold"]
    firmness = report["bootstrap_picks"][f"{report['threshold']:g}"]
    print(
        f"success threshold {report['threshold']} (balanced accuracy "
        f"{max(r['balanced_accuracy'] for r in report['candidates']):.3f} on {report['episodes']} held-out "
        f"replays; picked in {firmness:.0%} of bootstrap resamples)"
    )
    save_json(report, output_dir / "eval" / "success_calibration.json")
    return True
