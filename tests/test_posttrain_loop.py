"""The post-training stages end to end on a tiny dataset: both stages, one alone, exact resume, config errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_lerobot_dataset
from test_posttrain_objective import tiny_world_model

from worldloop.common.checkpoint import load_tensors
from worldloop.common.config import ConfigError, parse_cli
from worldloop.rl_finetune.wm_posttrain.posttrain import (
    PosttrainConfig,
    run_posttraining,
    warn_if_candidates_alike,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One dataset and base model for the module: writing a LeRobotDataset takes seconds."""
    tmp = tmp_path_factory.mktemp("posttrain")
    root = make_tiny_lerobot_dataset(tmp / "dataset", episodes=4, length=12, image_size=(16, 16))
    base = tmp / "base"
    tiny_world_model().save_pretrained(base)
    return root, base


def _args(root: Path, base: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        f"--world_model.path={base}",
        f"--dataset.root={root}",
        f"--output_dir={out}",
        "--rollouts.group_size=2",
        "--rollouts.min_length=4",
        "--rollouts.max_length=5",
        "--fidelity.ssim_window=7",
        "--eval_start_states=2",
        f"--train.steps={steps}",
        "--train.batch_size=2",
        "--train.checkpoint_every=1",
        "--train.log_every=1",
        "--train.warmup_steps=10",
        "--train.lr=1e-3",
        "--train.report_to=none",
        *extra,
    ]


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_tensors(directory / "model.safetensors")


def test_both_stages_run_in_order_and_export_a_world_model(setup, tmp_path):
    root, base = setup
    final = run_posttraining(parse_cli(PosttrainConfig, _args(root, base, tmp_path / "out", 1)))
    assert final == tmp_path / "out" / "pretrained_model"
    first = _weights(tmp_path / "out" / "0_stability" / "pretrained_model")
    second, start = _weights(final), _weights(base)
    last_stage = _weights(tmp_path / "out" / "1_executability" / "pretrained_model")
    assert all(torch.equal(second[k], last_stage[k]) for k in second)
    assert any(not torch.equal(first[k], start[k]) for k in start if k.startswith("dit."))
    assert any(not torch.equal(second[k], first[k]) for k in start if k.startswith("dit."))
    assert all(torch.equal(second[k], start[k]) for k in start if k.startswith("idm."))
    assert (tmp_path / "out" / "posttrain_config.yaml").is_file()


def test_one_stage_alone_and_exact_resume(setup, tmp_path):
    root, base = setup
    straight = tmp_path / "straight"
    run_posttraining(parse_cli(PosttrainConfig, _args(root, base, straight, 2, "--stages=[stability]")))
    assert not (straight / "1_executability").exists()

    interrupted = tmp_path / "interrupted"
    run_posttraining(parse_cli(PosttrainConfig, _args(root, base, interrupted, 1, "--stages=[stability]")))
    with pytest.raises(ConfigError, match="--resume=true"):
        run_posttraining(
            parse_cli(PosttrainConfig, _args(root, base, interrupted, 2, "--stages=[stability]"))
        )
    run_posttraining(
        parse_cli(PosttrainConfig, _args(root, base, interrupted, 2, "--stages=[stability]", "--resume=true"))
    )
    a = _weights(straight / "0_stability" / "pretrained_model")
    b = _weights(interrupted / "0_stability" / "pretrained_model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_config_errors_name_the_field(setup, tmp_path):
    root, base = setup
    with pytest.raises(ConfigError, match="stages"):
        run_posttraining(
            parse_cli(PosttrainConfig, _args(root, base, tmp_path / "o", 1, "--stages=[sharpness]"))
        )
    with pytest.raises(ConfigError, match="group_size"):
        run_posttraining(
            parse_cli(PosttrainConfig, _args(root, base, tmp_path / "o", 1, "--rollouts.group_size=1"))
        )
    with pytest.raises(ConfigError, match="world_model.path"):
        run_posttraining(PosttrainConfig())


def test_shipped_config_parses():
    cfg = parse_cli(PosttrainConfig, ["--config", str(REPO / "configs" / "posttrain" / "tiny.yaml")])
    cfg.world_model.path = cfg.world_model.path or "x"
    cfg.validate()
    assert cfg.stages == ["stability", "executability"]


def test_a_model_trained_only_at_high_noise_is_flagged_for_stability_alone():
    model = tiny_world_model()
    model.cfg.noise_floor = 0.3
    with pytest.warns(UserWarning, match="noise_floor"):
        warn_if_candidates_alike(model, ["stability", "executability"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_candidates_alike(model, ["executability"])  # its reward does not compare candidates
        model.cfg.noise_floor = 0.0
        warn_if_candidates_alike(model, ["stability"])


@pytest.mark.slow
def test_two_process_post_training(setup, tmp_path):
    """Post-training through a 2-process launch (gloo on CPU): both stages finish and say so in their state."""
    import os
    import subprocess
    import sys

    root, base = setup
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(REPO / "posttrain_world_model.py"), *_args(root, base, out, 2)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "pretrained_model" / "model.safetensors").is_file()
    for stage in ("0_stability", "1_executability"):
        state = (out / stage / "checkpoints" / "0000002" / "training_state" / "state.json").read_text()
        assert '"world_size": 2' in state, state
