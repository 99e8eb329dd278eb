"""pipelines/push_setting.py (python -m worldloop.pipelines.push_setting): every stage's and every printed
benchmark command parses, the seeds stay apart, the judge follows the world model, the zoo is assembled under the
names the ranking reports, and bad config names the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from command_fixtures import ROOT, parse_command

from worldloop.common.config import ConfigError, parse_cli
from worldloop.pipelines.push_setting import (
    RUNS,
    PushSettingConfig,
    assemble_zoo,
    commands,
    judge_dir,
    snapshots,
    stages,
)
from worldloop.sim.recording import RecordingConfig
from worldloop.vla.bc_training import TrainPolicyConfig
from worldloop.world_model.trainer import TrainWorldModelConfig

CONFIGS = {
    "record_demos.py": RecordingConfig,
    "train_world_model.py": TrainWorldModelConfig,
    "train_policy.py": TrainPolicyConfig,
}


def _world_model(tmp_path: Path) -> Path:
    wm = tmp_path / "world_model" / "push_run" / "pretrained_model"
    wm.mkdir(parents=True)
    (wm / "model.safetensors").write_bytes(b"")
    return wm


def test_every_stage_command_parses_and_the_seeds_stay_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the stages' config paths are relative to the repository
    cfg = PushSettingConfig(world_model=str(_world_model(tmp_path)), root=str(tmp_path / "setting"))
    cfg.validate()
    root = Path(cfg.root)
    parsed = {s.name: parse_cli(CONFIGS[s.script], s.args) for s in stages(cfg, root)}
    assert all(str(root) in str(s.produced) for s in stages(cfg, root))
    # Policies: every snapshot the zoo and the judge read is kept; the judge's are trained on another seed.
    for name, p in parsed.items():
        if name.startswith("train judge policy"):
            assert p.train.seed == 1 and p.train.keep_checkpoints == 0
        elif name.startswith("train zoo policy"):
            assert p.train.seed == 0 and p.train.keep_checkpoints == 0
    zoo_runs = {n.removeprefix("train zoo policy ") for n in parsed if n.startswith("train zoo policy")}
    assert zoo_runs == set(RUNS)
    # The judge's data: its policies' episodes after the scripted ones, cubes' positions recorded, failures kept.
    mix = parsed["record judge policies' episodes"]
    scripted = parsed["record judge scripted data"]
    assert mix.include == [scripted.root] and mix.environment_state and not mix.terminate_on_success
    assert mix.policies == [str(p) for p in snapshots(root, "judge_policies", cfg.judge_policies).values()]
    assert all("judge_policies" in p for p in mix.policies)
    # Seeds: each recording's range apart from the others and from the ranking's and RL's starts.
    recordings = [p for p in parsed.values() if isinstance(p, RecordingConfig)]
    ranges = [range(r.seed, r.seed + r.episodes * max(1, len(r.policies))) for r in recordings] + [
        range(100_000, 100_050),
        range(200_000, 200_100),
    ]
    assert all(set(a).isdisjoint(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    # The judge: heads alone on the given world model, written under that model's run name.
    judge = parsed["fit the drawn-frame judge"]
    assert judge.heads_only and judge.init_from == cfg.world_model and judge.dataset.root == mix.root
    assert Path(judge.output_dir) == judge_dir(cfg, root) and judge_dir(cfg, root).name == "push_run"


def test_printed_benchmark_commands_parse(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = PushSettingConfig(world_model=str(_world_model(tmp_path)), root=str(tmp_path / "setting"))
    printed = commands(cfg, Path(cfg.root))
    assert set(printed) == {"replays", "real_frames", "ranking", "rl_drawn", "rl_first_frame"}
    for name, command in printed.items():
        parsed = parse_command(command, name)
        assert str(judge_dir(cfg, Path(cfg.root)) / "pretrained_model") == parsed.world_model, name
    assert parse_command(printed["rl_drawn"], "rl_drawn").observe == "drawn"


def test_the_zoo_is_assembled_under_the_ranked_names(tmp_path):
    cfg = PushSettingConfig(world_model=str(_world_model(tmp_path)), root=str(tmp_path / "setting"))
    root = Path(cfg.root)
    for src in snapshots(root, "zoo_runs", cfg.zoo).values():
        src.mkdir(parents=True)
        (src / "model.safetensors").write_bytes(b"w")
        (src / "config.yaml").write_text("type: flow\n")
    zoo = assemble_zoo(cfg, root)
    assert sorted(p.name for p in zoo.iterdir()) == sorted(
        ["flow_4k_step1000", "flow_4k_step2000", "flow_4k_step3000", "flow_4k_step4000"]
        + ["flow_10k_step10000", "act_step200", "act_step1000", "diffusion_step1000"]
    )
    assert (zoo / "act_step200" / "model.safetensors").read_bytes() == b"w"
    missing = snapshots(root, "zoo_runs", ["diffusion:1000"])["diffusion_step1000"]
    (missing / "model.safetensors").unlink()
    shutil.rmtree(zoo / "diffusion_step1000")
    with pytest.raises(ConfigError, match="diffusion"):
        assemble_zoo(cfg, root)


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="world_model is required"):
        PushSettingConfig().validate()
    with pytest.raises(ConfigError, match="world_model: .* no model.safetensors"):
        PushSettingConfig(world_model=str(tmp_path)).validate()
    wm = str(_world_model(tmp_path))
    with pytest.raises(ConfigError, match="zoo: 'flow_2k:1000'"):
        PushSettingConfig(world_model=wm, zoo=["flow_2k:1000"]).validate()
    with pytest.raises(ConfigError, match="judge_policies: step 500 of act"):
        PushSettingConfig(world_model=wm, judge_policies=["act:500"]).validate()
