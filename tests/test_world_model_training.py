"""World-model training: overfitting, checkpoints, exact resume, the trainer end to end, DDP, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worldloop.common.config import ConfigError, parse_cli
from worldloop.common.training import TrainLoopConfig, run_training
from worldloop.data.dataset import DatasetConfig, DatasetError, EpisodeDataset
from worldloop.data.stats import dataset_stats
from worldloop.data.windows import WorldModelWindows
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.idm import InverseDynamicsConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.trainer import TrainWorldModelConfig, train
from worldloop.world_model.training_record import recipe_time

REPO = Path(__file__).resolve().parents[1]
SIZE = 16


def tiny_model_config() -> WorldModelConfig:
    dit = VideoDiTConfig(
        image_size=SIZE, patch_size=4, width=32, depth=1, heads=2, context_frames=2, output_conv_channels=8
    )
    return WorldModelConfig(dit=dit, idm=InverseDynamicsConfig(channels=8))


def test_loss_decreases_when_overfitting_one_batch():
    torch.manual_seed(0)
    model = WorldModel(tiny_model_config())
    frames = torch.rand(4, 4, 3, SIZE, SIZE)
    actions = torch.randn(4, 4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        torch.manual_seed(1)  # same noise every step: a fixed objective
        loss, _ = model.compute_loss(frames, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_save_and_load_pretrained_round_trip(tmp_path):
    torch.manual_seed(0)
    model = WorldModel(tiny_model_config())
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.1)
    model.save_pretrained(tmp_path / "wm")
    assert {p.name for p in (tmp_path / "wm").iterdir()} == {"config.yaml", "model.safetensors", "stats.json"}
    loaded = WorldModel.from_pretrained(tmp_path / "wm")
    ctx, ctx_a, fut = torch.rand(1, 2, 3, SIZE, SIZE), torch.randn(1, 1, 4), torch.randn(1, 3, 4)
    state = torch.randn(1, 3, 4)
    a = model.eval().rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(0), future_state=state)
    b = loaded.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(0), future_state=state)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_from_pretrained_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.yaml is missing"):
        WorldModel.from_pretrained(tmp_path)


def _windows(root: Path, window: int = 3):
    ds = EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"]))
    return ds, WorldModelWindows(ds, context=1, horizon=window - 1)


def _run(model, windows, out: Path, steps: int, losses: list, resume: bool = False):
    cfg = TrainLoopConfig(
        steps=steps,
        batch_size=2,
        warmup_steps=10,
        checkpoint_every=2,
        log_every=1,
        report_to="none",
        ema_decay=0.9,
    )

    def loss_fn(m, batch):
        loss, logs = m(batch)
        losses.append(loss.item())
        return loss, logs

    return run_training(model, windows, loss_fn, cfg, out, lambda m, p: m.save_pretrained(p), resume=resume)


def test_resume_gives_the_bit_identical_next_step_loss(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=2, length=8, image_size=(SIZE, SIZE))
    ds, windows = _windows(root)
    stats = dataset_stats(ds)
    torch.manual_seed(0)
    straight: list[float] = []
    _run(WorldModel(tiny_model_config(), stats), windows, tmp_path / "a", 3, straight)
    torch.manual_seed(0)
    first: list[float] = []
    _run(WorldModel(tiny_model_config(), stats), windows, tmp_path / "b", 2, first)
    resumed: list[float] = []
    torch.manual_seed(123)  # a resumed run must not depend on the fresh process's RNG or init
    _run(WorldModel(tiny_model_config(), stats), windows, tmp_path / "b", 3, resumed, resume=True)
    assert first == straight[:2]
    assert resumed == straight[2:]
    assert (tmp_path / "b" / "pretrained_model" / "model.safetensors").is_file()


def tiny_train_args(root: Path, out: Path, steps: int = 2) -> list[str]:
    return [
        f"--dataset.root={root}",
        f"--output_dir={out}",
        f"--train.steps={steps}",
        "--train.batch_size=2",
        "--train.report_to=none",
        "--train.checkpoint_every=1",
        "--window=3",
        f"--model.dit.image_size={SIZE}",
        "--model.dit.patch_size=4",
        "--model.dit.width=32",
        "--model.dit.depth=1",
        "--model.dit.heads=2",
        "--model.dit.context_frames=2",
        "--model.dit.output_conv_channels=8",
        "--model.idm.channels=8",
        "--eval.context=2",
        "--eval.horizon=3",
        "--eval.stride=2",
        "--dataset.held_out_fraction=0.3",
    ]


@pytest.mark.slow
def test_trainer_end_to_end_writes_checkpoint_and_eval_artefacts(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(SIZE, SIZE))
    out = tmp_path / "run"
    cfg = parse_cli(TrainWorldModelConfig, tiny_train_args(root, out))
    model = train(cfg)
    assert isinstance(model, WorldModel)
    loaded = WorldModel.from_pretrained(out / "pretrained_model")
    assert loaded.cfg.dit.width == 32
    eval_dir = out / "eval" / "0000002"
    assert {"metrics.json", "rollout.mp4", "horizon.png"} <= {p.name for p in eval_dir.iterdir()}
    assert (out / "rollout.mp4").exists() is False


def test_bad_config_and_dataset_errors(tmp_path, tiny_lerobot_dataset):
    with pytest.raises(ConfigError, match="unknown"):
        parse_cli(TrainWorldModelConfig, ["--model.dit.widht=3"])
    root = tiny_lerobot_dataset(tmp_path, episodes=2, length=8, image_size=(SIZE, SIZE))
    args = tiny_train_args(root, tmp_path / "run")
    with pytest.raises(DatasetError, match="image"):  # model is 64x64, the data 16x16
        train(parse_cli(TrainWorldModelConfig, [*args, "--model.dit.image_size=64"]))
    with pytest.raises(
        ConfigError, match=r"--dataset.cameras=\['wrist'\] contradicts .* cameras=\['front'\]"
    ):
        train(parse_cli(TrainWorldModelConfig, [*args, "--dataset.cameras=[wrist]"]))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(parse_cli(TrainWorldModelConfig, [*args, f"--dataset.root={tmp_path / 'nope'}"]))
    with pytest.raises(KeyError, match="actions"):
        WorldModel(tiny_model_config())({"frames": torch.zeros(1, 3, 1, 3, SIZE, SIZE)})


@pytest.mark.slow
def test_two_process_cpu_ddp_smoke(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=4, length=8, image_size=(SIZE, SIZE))
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(REPO / "train_world_model.py"),
        *tiny_train_args(root, out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "pretrained_model" / "model.safetensors").is_file()
    assert "world_size" in (out / "checkpoints" / "0000002" / "training_state" / "state.json").read_text()


def test_heads_only_training_changes_the_heads_and_nothing_else(tmp_path, tiny_lerobot_dataset, capsys):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(SIZE, SIZE))
    args = tiny_train_args(root, tmp_path / "heads", steps=3)
    with pytest.raises(ValueError, match="init_from"):
        train(parse_cli(TrainWorldModelConfig, [*args, "--heads_only=true"]))
    base_cfg = tiny_model_config()
    base_cfg.heads.use_state = False
    base_cfg.sampler.still_threshold = 0.2  # how the frozen model draws: kept, not picked again
    # likewise the warp read: the rollouts the heads fit on are read as the frozen model reads them
    base_cfg.dit.condition_on_previous_frame = base_cfg.dit.residual_to_previous_frame = True
    base_cfg.dit.warp_previous_frame, base_cfg.dit.warp_read = True, "bicubic"
    torch.manual_seed(0)
    WorldModel(base_cfg).save_pretrained(tmp_path / "base")  # heads without state: refitted with it
    args += ["--heads_only=true", f"--init_from={tmp_path / 'base'}", "--model.heads.use_state=true"]
    trained = train(parse_cli(TrainWorldModelConfig, [*args, "--train.lr=1e-2"]))
    base = WorldModel.from_pretrained(tmp_path / "base").state_dict()
    after = trained.state_dict()
    frozen = [k for k in base if not k.startswith("heads.")]
    assert frozen and all(torch.equal(base[k], after[k]) for k in frozen)
    assert any(not torch.equal(base[k], after[k]) for k in base if k.startswith("heads."))
    assert any(k.startswith("heads.state_embed") for k in after)
    assert trained.cfg.sampler.still_threshold == 0.2 and trained.cfg.dit.warp_read == "bicubic"
    said = capsys.readouterr().out  # the run's own sampler (threshold 0) and read were set aside
    assert "not applied: " in said and "sampler.still_threshold" in said and "dit.warp_read" in said
    assert not (tmp_path / "heads" / "eval" / "still_calibration.json").exists()
    # Heads that judge from the episode's first frame and the joint state alone: fitted through the same
    # windows, then calibrated by replays that pass the reset frame (the trainer's last stage).
    first_only = ["--model.heads.use_first_frame=true", "--model.heads.use_frame=false"]
    refit = train(
        parse_cli(TrainWorldModelConfig, [*args, *first_only, f"--output_dir={tmp_path / 'first'}"])
    )
    assert refit.cfg.heads.use_first_frame and not refit.cfg.heads.use_frame
    reloaded = WorldModel.from_pretrained(tmp_path / "first" / "pretrained_model")
    assert reloaded.cfg.heads.use_first_frame and not reloaded.cfg.heads.use_frame
    # a model config outside the heads that does not fit the frozen weights is set aside, not trained on
    narrow = train(
        parse_cli(
            TrainWorldModelConfig, [*args, "--model.dit.width=64", "--output_dir=" + str(tmp_path / "x")]
        )
    )
    assert narrow.cfg.dit.width == base_cfg.dit.width
    assert all(torch.equal(base[k], narrow.state_dict()[k]) for k in frozen)


def test_frozen_heads_training_changes_everything_but_the_heads(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(SIZE, SIZE))
    args = tiny_train_args(root, tmp_path / "longer", steps=3)
    with pytest.raises(ValueError, match="init_from"):
        train(parse_cli(TrainWorldModelConfig, [*args, "--freeze_heads=true"]))
    base_cfg = tiny_model_config()
    base_cfg.heads.use_state, base_cfg.heads.success_threshold = False, 0.85  # not the CLI's defaults
    torch.manual_seed(0)
    WorldModel(base_cfg).save_pretrained(tmp_path / "base")
    args += ["--freeze_heads=true", f"--init_from={tmp_path / 'base'}", "--calibrate_success=false"]
    with pytest.raises(ValueError, match="pick one"):
        train(parse_cli(TrainWorldModelConfig, [*args, "--heads_only=true"]))
    trained = train(parse_cli(TrainWorldModelConfig, [*args, "--train.lr=1e-2"]))
    base = WorldModel.from_pretrained(tmp_path / "base").state_dict()
    after = trained.state_dict()
    heads = [k for k in base if k.startswith("heads.")]
    assert heads and all(torch.equal(base[k], after[k]) for k in heads)
    assert any(not torch.equal(base[k], after[k]) for k in base if k.startswith("dit."))
    # the heads' config (what they read, their calibrated threshold) is theirs, not the command line's
    exported = WorldModel.from_pretrained(tmp_path / "longer" / "pretrained_model")
    assert exported.cfg.heads == base_cfg.heads


def test_train_seed_sets_the_initial_weights(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(SIZE, SIZE))

    def trained(seed: int, name: str) -> dict[str, torch.Tensor]:
        args = tiny_train_args(root, tmp_path / name, steps=1)
        extra = [
            "--eval.max_windows=0",
            "--still_windows=0",
            "--calibrate_success=false",
            f"--train.seed={seed}",
        ]
        torch.manual_seed(len(name))  # what ran before in the process must not matter
        return train(parse_cli(TrainWorldModelConfig, args + extra)).state_dict()

    a, again, other = trained(0, "a"), trained(0, "again"), trained(1, "other")
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert not torch.equal(a["dit.patch.weight"], other["dit.patch.weight"])


def test_training_time_travels_with_the_model_through_init_from(tmp_path, tiny_lerobot_dataset):
    """Each run records its seconds in pretrained_model/training.json with the record of the model it started
    from nested, so a two-phase recipe's time is read from the second model alone; a start without a record
    or a resumed run makes the total a lower bound (`complete` False)."""
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=8, image_size=(SIZE, SIZE))
    train(parse_cli(TrainWorldModelConfig, tiny_train_args(root, tmp_path / "one", steps=2)))
    second = [
        *tiny_train_args(root, tmp_path / "two", steps=3),
        f"--init_from={tmp_path / 'one' / 'pretrained_model'}",
    ]
    train(parse_cli(TrainWorldModelConfig, second))
    timed = recipe_time(tmp_path / "two" / "pretrained_model")
    assert [p["steps"] for p in timed["phases"]] == [2, 3] and timed["complete"]
    assert all(p["seconds"] > 0 and p["processes"] == 1 for p in timed["phases"])
    assert timed["minutes"] == pytest.approx(sum(p["seconds"] for p in timed["phases"]) / 60)
    assert recipe_time(tmp_path / "one" / "pretrained_model")["phases"] == timed["phases"][:1]
    WorldModel(tiny_model_config()).save_pretrained(tmp_path / "unrecorded")
    assert recipe_time(tmp_path / "unrecorded") is None
    third = [*tiny_train_args(root, tmp_path / "three"), f"--init_from={tmp_path / 'unrecorded'}"]
    train(parse_cli(TrainWorldModelConfig, third))
    partial = recipe_time(tmp_path / "three" / "pretrained_model")
    assert len(partial["phases"]) == 1 and not partial["complete"]
    train(
        parse_cli(TrainWorldModelConfig, [*tiny_train_args(root, tmp_path / "one", steps=3), "--resume=true"])
    )
    resumed = recipe_time(tmp_path / "one" / "pretrained_model")
    assert resumed["phases"][0]["resumed"] and not resumed["complete"]
