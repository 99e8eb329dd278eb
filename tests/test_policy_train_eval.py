"""train_policy.py on a tiny LeRobot dataset (resume included) and evaluate_policy.py --backend sim."""

from __future__ import annotations

import json

import pytest
import torch

from worldloop import evaluate_policy, train_policy
from worldloop.common.checkpoint import load_json
from worldloop.common.config import ConfigError, parse_cli
from worldloop.data.features import ACTION
from worldloop.vla.bc_training import TrainPolicyConfig
from worldloop.vla.bc_training import train_policy as train_bc
from worldloop.vla.factory import load_policy
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim

TINY_POLICY = [
    "--policy.flow_vla.image_size=[16,16]",
    "--policy.flow_vla.vision.channels=[8,16]",
    "--policy.flow_vla.dim=32",
    "--policy.flow_vla.heads=2",
    "--policy.flow_vla.obs_layers=1",
    "--policy.flow_vla.action_layers=1",
    "--policy.flow_vla.chunk_size=4",
    "--policy.flow_vla.n_action_steps=2",
]


def test_train_policy_writes_a_loadable_policy_and_resumes(shared_tiny_dataset_root, tmp_path):
    out = tmp_path / "run"
    args = [
        f"--dataset.root={shared_tiny_dataset_root}",
        "--dataset.held_out_fraction=0.25",
        *TINY_POLICY,
        "--train.steps=4",
        "--train.batch_size=4",
        "--train.checkpoint_every=2",
        "--train.warmup_steps=1",
        "--train.report_to=none",
        f"--output_dir={out}",
    ]
    train_policy.main(args)
    policy = load_policy(out / "pretrained_model")
    assert policy.chunk_size == 4 and len(load_json(out / "episodes.json")["train"]) == 3
    # Normalisation stats come from the training data: action = state + 0.5 in the fixture.
    assert abs(policy.stats[ACTION]["mean"][0] - policy.stats["observation.state"]["mean"][0] - 0.5) < 1e-6
    train_policy.main([*args, "--train.steps=6", "--resume=true"])
    assert (out / "checkpoints" / "0000006").is_dir()


def test_train_seed_sets_the_policys_initial_weights(shared_tiny_dataset_root, tmp_path):
    def trained(seed: int, name: str) -> dict[str, torch.Tensor]:
        args = [
            f"--dataset.root={shared_tiny_dataset_root}",
            *TINY_POLICY,
            "--train.steps=1",
            "--train.batch_size=4",
            "--train.report_to=none",
            f"--train.seed={seed}",
            f"--output_dir={tmp_path / name}",
        ]
        torch.manual_seed(len(name))  # what ran before in the process must not matter
        return train_bc(parse_cli(TrainPolicyConfig, args)).state_dict()

    a, again, other = trained(0, "a"), trained(0, "again"), trained(1, "other")
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert any(not torch.equal(a[k], other[k]) for k in a if a[k].is_floating_point())


def test_train_policy_rejects_mismatched_cameras(shared_tiny_dataset_root, tmp_path):
    with pytest.raises(ConfigError, match="dataset.cameras"):
        train_policy.main(
            [
                f"--dataset.root={shared_tiny_dataset_root}",
                "--dataset.cameras=[front]",
                f"--output_dir={tmp_path}",
            ]
        )


@pytest.fixture
def saved_policy(tmp_path):
    import vla_fixtures

    from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy, VisionConfig

    torch.manual_seed(0)
    cfg = FlowVLAConfig(image_size=(32, 32), vision=VisionConfig(channels=(8, 16)), dim=32, heads=2)
    path = tmp_path / "policy"
    FlowVLAPolicy(cfg, vla_fixtures.make_stats()).save_pretrained(path)
    return path


def test_evaluate_in_sim_runs_lock_step_groups(saved_policy, tmp_path):
    policy = load_policy(saved_policy)
    cfg = SimEvalConfig(task="reach", max_steps=3, batch_envs=2, videos=1)
    summary = evaluate_in_sim(policy, cfg, episodes=3, seed=7, video_dir=tmp_path, progress_bar=False)
    assert summary["episodes"] == 3 and [r["seed"] for r in summary["per_episode"]] == [7, 8, 9]
    assert all(1 <= r["length"] <= 3 for r in summary["per_episode"])
    assert all(r["task"].startswith("reach the") for r in summary["per_episode"])
    assert 0.0 <= summary["success_ci95"][0] <= summary["success_rate"] <= summary["success_ci95"][1] <= 1.0
    videos = list((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0


def test_evaluate_policy_cli_writes_summary(saved_policy, tmp_path):
    out = tmp_path / "eval"
    evaluate_policy.main(
        [
            "--backend=sim",
            f"--policy.path={saved_policy}",
            "--episodes=2",
            "--sim.max_steps=2",
            "--sim.videos=0",
            f"--output_dir={out}",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["policy_path"] == str(saved_policy)
    with pytest.raises(ConfigError, match="backend"):
        evaluate_policy.main(["--backend=real", f"--policy.path={saved_policy}"])


def test_successful_episodes_only_trains_on_the_episodes_that_succeed(shared_tiny_dataset_root, tmp_path):
    out = tmp_path / "run"
    args = [
        f"--dataset.root={shared_tiny_dataset_root}",
        "--dataset.held_out_fraction=0",
        *TINY_POLICY,
        "--train.steps=1",
        "--train.batch_size=2",
        "--train.report_to=none",
        f"--output_dir={out}",
    ]
    train_policy.main([*args, "--successful_episodes_only=true"])
    # The fixture's even episodes end in next.success, the odd ones do not.
    assert load_json(out / "episodes.json")["train"] == [0, 2]


def test_successful_episodes_only_needs_a_success_column(tmp_path):
    from conftest import make_tiny_lerobot_dataset

    root = make_tiny_lerobot_dataset(
        tmp_path / "no_rewards", episodes=2, cameras=("front", "wrist"), with_rewards=False
    )
    with pytest.raises(ConfigError, match="next.success"):
        train_policy.main(
            [
                f"--dataset.root={root}",
                *TINY_POLICY,
                "--successful_episodes_only=true",
                f"--output_dir={tmp_path}",
            ]
        )


def test_evaluate_in_sim_depends_on_its_seed_alone(saved_policy):
    # The policy samples its actions with noise from torch's global generators: an episode's outcome must
    # not depend on what drew from them before, and the evaluation must not shift the caller's stream.
    policy = load_policy(saved_policy)
    cfg = SimEvalConfig(task="reach", max_steps=3, batch_envs=2)
    torch.manual_seed(1)
    first = evaluate_in_sim(policy, cfg, episodes=3, seed=7, progress_bar=False)["per_episode"]
    after = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after)
    torch.manual_seed(2)
    torch.rand(100)
    again = evaluate_in_sim(policy, cfg, episodes=3, seed=7, progress_bar=False)["per_episode"]
    assert [r["progress"] for r in first] == [r["progress"] for r in again]
    other = evaluate_in_sim(policy, cfg, episodes=3, seed=8, progress_bar=False)["per_episode"]
    assert [r["progress"] for r in first[1:]] != [r["progress"] for r in other[:2]]  # seeds 8, 9: new noise
