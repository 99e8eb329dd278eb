"""pipelines/rl_setting.py (python -m worldloop.pipelines.rl_setting): every stage's command parses with its
script's options, the snapshot pick, config errors, and resuming an interrupted training stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from worldloop.common.config import ConfigError, parse_cli
from worldloop.pipelines.rl_setting import RLSettingConfig, heads_model, pick_snapshot, rl_world_model, stages
from worldloop.sim.recording import RecordingConfig
from worldloop.vla.bc_training import TrainPolicyConfig
from worldloop.world_model.trainer import TrainWorldModelConfig

CONFIGS = {
    "record_demos.py": RecordingConfig,
    "train_world_model.py": TrainWorldModelConfig,
    "train_policy.py": TrainPolicyConfig,
}


def test_every_stage_command_parses(tmp_path, monkeypatch):
    from worldloop.pipelines.quickstart import REPO

    monkeypatch.chdir(REPO)  # the stages' config paths are relative to the repository
    cfg = RLSettingConfig(root=str(tmp_path))
    for stage in stages(cfg, tmp_path):
        parsed = parse_cli(CONFIGS[stage.script], stage.args)
        assert str(tmp_path) in str(stage.produced)
        if stage.script == "train_policy.py":
            assert parsed.train.checkpoint_every == cfg.snapshot_every
            assert parsed.train.keep_checkpoints >= cfg.policy_steps // cfg.snapshot_every
        if stage.name == "fit first-frame heads":
            assert (
                parsed.heads_only and parsed.model.heads.use_first_frame and not parsed.model.heads.use_frame
            )
            assert parsed.train.steps == cfg.heads_steps
    # Mixed-skill data keeps failures (not stopped at success); the three recordings share no seed.
    recordings = {
        s.name: parse_cli(RecordingConfig, s.args)
        for s in stages(cfg, tmp_path)
        if s.script == "record_demos.py"
    }
    wm_cfg, heads_cfg = recordings["record world-model data"], recordings["record heads data"]
    for mixed in (wm_cfg, heads_cfg):
        assert not mixed.terminate_on_success and mixed.skill_range == [0.0, 1.0]
    assert recordings["record expert demos"].skill == 1.0
    seeds = [range(r.seed, r.seed + r.episodes) for r in recordings.values()]
    assert all(set(a).isdisjoint(b) for i, a in enumerate(seeds) for b in seeds[i + 1 :])
    heads = next(s for s in stages(cfg, tmp_path) if s.name == "fit first-frame heads")
    assert f"--dataset.root={heads_cfg.root}" in heads.args
    # More heads data after the first (one dataset), and the heads fitted again on it from the first fit.
    more = recordings["record more heads data"]
    assert more.include == [heads_cfg.root] and more.episodes == cfg.more_heads_episodes
    refit = parse_cli(
        TrainWorldModelConfig,
        next(s for s in stages(cfg, tmp_path) if s.name == "fit heads on more data").args,
    )
    assert refit.dataset.root == more.root and refit.init_from == str(heads.produced)
    assert refit.train.steps == cfg.more_heads_steps and refit.heads_only
    assert heads_model(cfg, tmp_path) == Path(refit.output_dir) / "pretrained_model"
    without = RLSettingConfig(root=str(tmp_path), more_heads_episodes=0)
    assert not [s for s in stages(without, tmp_path) if "more" in s.name]
    assert heads_model(without, tmp_path) == heads.produced
    # Then the frames trained longer from that model, its heads frozen: the world model RL trains in.
    longer = parse_cli(
        TrainWorldModelConfig,
        next(s for s in stages(cfg, tmp_path) if s.name.startswith("train world model longer")).args,
    )
    assert longer.init_from == str(heads_model(cfg, tmp_path)) and longer.freeze_heads
    assert longer.dataset.root == wm_cfg.root and longer.train.steps == cfg.world_model_more_steps
    assert rl_world_model(cfg, tmp_path) == Path(longer.output_dir) / "pretrained_model"
    unchanged = RLSettingConfig(root=str(tmp_path), world_model_more_steps=0)
    assert not [s for s in stages(unchanged, tmp_path) if s.name.startswith("train world model longer")]
    assert rl_world_model(unchanged, tmp_path) == heads_model(unchanged, tmp_path)


def test_an_interrupted_training_stage_resumes(tmp_path):
    cfg = RLSettingConfig(root=str(tmp_path))
    assert not any("--resume=true" in s.args for s in stages(cfg, tmp_path))
    (tmp_path / "world_model" / "base" / "checkpoints").mkdir(parents=True)
    (tmp_path / "world_model" / "base" / "checkpoints" / "last").write_text("0000250")
    resumed = [s.name for s in stages(cfg, tmp_path) if "--resume=true" in s.args]
    assert resumed == ["train world model"]


def test_pick_is_the_latest_snapshot_inside_the_band():
    rows = [
        {"step": 150, "success_rate": 0.15},
        {"step": 200, "success_rate": 0.35},
        {"step": 250, "success_rate": 0.55},
        {"step": 300, "success_rate": 0.75},
        {"step": 350, "success_rate": 0.58},  # back inside after a better one: still the latest inside
    ]
    assert pick_snapshot(rows, [0.2, 0.6])["step"] == 350
    assert pick_snapshot(rows, [0.2, 0.5])["step"] == 200
    with pytest.raises(SystemExit, match="no snapshot"):
        pick_snapshot(rows, [0.8, 0.9])


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="success_band"):
        RLSettingConfig(success_band=[0.6, 0.2]).validate()
    with pytest.raises(ConfigError, match="snapshot_steps"):
        RLSettingConfig(snapshot_steps=[160]).validate()
    with pytest.raises(ConfigError, match="snapshot_steps"):
        RLSettingConfig(snapshot_steps=[2025], policy_steps=2000).validate()
    with pytest.raises(ConfigError, match="world_model_overrides"):
        RLSettingConfig(world_model_overrides=["model.context_noise_max=0.1"]).validate()


def test_world_model_overrides_reach_every_world_model_stage(tmp_path, monkeypatch):
    from worldloop.pipelines.quickstart import REPO

    monkeypatch.chdir(REPO)
    overrides = ["--model.context_noise_max=0.1", "--model.dit.warp_previous_frame=false"]
    cfg = RLSettingConfig(root=str(tmp_path), world_model_overrides=overrides)
    cfg.validate()
    # The world model, both heads fits and the longer run: each loads the one before, so all must agree.
    wm_stages = [s for s in stages(cfg, tmp_path) if s.script == "train_world_model.py"]
    assert len(wm_stages) == 4
    for stage in wm_stages:
        parsed = parse_cli(TrainWorldModelConfig, stage.args)
        assert parsed.model.context_noise_max == 0.1 and not parsed.model.dit.warp_previous_frame, stage.name
    plain = next(
        s for s in stages(RLSettingConfig(root=str(tmp_path)), tmp_path) if s.name == "train world model"
    )
    assert parse_cli(TrainWorldModelConfig, plain.args).model.dit.warp_previous_frame  # tiny.yaml's own
