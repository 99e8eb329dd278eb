"""A world model trained on a 2-D (pusht-shaped) dataset carries its embodiment and sizes in its checkpoint:
calibration, imagination, the fidelity benchmark and fine-tuning read them from there, with no embodiment
or size flag. Disagreement between imagination and the env is flagged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from embodiment_fixtures import write_vector_dataset

from worldloop.common.config import ConfigError, parse_cli
from worldloop.data.dataset import DatasetConfig, split_episodes
from worldloop.data.features import ACTION, STATE
from worldloop.data.stats import compute_stats
from worldloop.rl_finetune.imagination.evaluation import ImaginationEvalConfig
from worldloop.rl_finetune.imagination.policy_ranking import rank_policies
from worldloop.rl_finetune.imagination.ranking import disagreement
from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.checkpoint_inputs import dataset_config_for
from worldloop.world_model.model import WorldModel
from worldloop.world_model.trainer import TrainWorldModelConfig, train

EPISODES, LENGTH, SOURCE, SIZE = 6, 10, 24, 16  # dataset frames 24x24, the model's 16x16


@pytest.fixture(scope="module")
def planar_model(tmp_path_factory) -> dict[str, Path]:
    """A 2-D dataset (agent position in a 512-pixel board, 10 fps, one camera 'top'), successes and failures
    in both splits, and a tiny world model trained on it 2 steps by overrides alone (no embodiment flag)."""
    tmp = tmp_path_factory.mktemp("planar")
    rng = np.random.default_rng(0)
    states = [np.cumsum(rng.normal(0, 8, (LENGTH, 2)), 0) + rng.uniform(150, 350, 2) for _ in range(EPISODES)]
    _, held = split_episodes(list(range(EPISODES)), 0.5, 0)
    success = [i in held[:1] or i not in held and i % 2 == 0 for i in range(EPISODES)]
    root = write_vector_dataset(
        tmp / "pusht_like",
        states,
        [np.concatenate([s[1:], s[-1:]]) for s in states],
        fps=10,
        state_names=["x", "y"],
        image_size=(SOURCE, SOURCE),
        success=success,
    )
    out = tmp / "wm"
    args = [
        f"--dataset.root={root}", "--dataset.resize=crop", "--dataset.held_out_fraction=0.5",
        f"--output_dir={out}", "--train.steps=2", "--train.batch_size=2", "--train.report_to=none",
        "--train.checkpoint_every=2", "--window=3", "--eval.max_windows=0", "--model.cameras=[top]",
        f"--model.dit.image_size={SIZE}", "--model.dit.patch_size=4", "--model.dit.width=32",
        "--model.dit.depth=1", "--model.dit.heads=2", "--model.dit.context_frames=2",
        "--model.dit.output_conv_channels=8", "--model.idm.channels=8", "--model.dit.action_dim=2",
        "--model.idm.action_dim=2", "--model.idm.state_dim=2", "--model.sampler.steps=1",
    ]  # fmt: skip
    train(parse_cli(TrainWorldModelConfig, args))
    return {"data": root, "out": out, "wm": out / "pretrained_model", "held": held}


def planar_policy(path: Path) -> Path:
    torch.manual_seed(0)
    cfg = FlowVLAConfig(
        cameras=("top",), image_size=(SIZE, SIZE), state_dim=2, action_dim=2, chunk_size=4, n_action_steps=2,
        dim=32, heads=2, obs_layers=1, action_layers=1, num_inference_steps=2,
    )  # fmt: skip
    cfg.vision.channels = (8, 16)
    g = np.random.default_rng(0)
    stats = {key: compute_stats(g.normal(256.0, 40.0, size=(500, 2))) for key in (STATE, ACTION)}
    policy = FlowVLAPolicy(cfg, stats).eval()
    torch.nn.init.normal_(policy.action_expert.out_proj.weight, std=0.3)
    policy.save_pretrained(path)
    return path


def test_the_checkpoint_stores_embodiment_sizes_and_calibration(planar_model):
    model = WorldModel.from_pretrained(planar_model["wm"])
    spec = model.embodiment
    assert (
        spec is not None and spec.name == "pusht_like" and spec.joint_names == ("x", "y") and spec.fps == 10
    )
    assert (model.cfg.frame_size, model.cfg.dataset_resize, model.cfg.cameras) == (SIZE, "crop", ("top",))
    # Calibration ran on the 2-D dataset instead of leaving the threshold at 0.5 unchecked.
    report = json.loads((planar_model["out"] / "eval" / "success_calibration.json").read_text())
    assert report["episodes"] == len(planar_model["held"]) and 0 < report["recorded_success"] < 1
    assert 0 <= report["episode_auroc"] <= 1  # both outcomes were replayed, so it is a number
    assert model.cfg.heads.success_threshold == report["threshold"]
    # A later stage's dataset options: repeated values pass, contradicting ones name both values.
    ds = dataset_config_for(model.cfg, DatasetConfig(root=str(planar_model["data"]), image_size=[SIZE, SIZE]))
    assert (ds.image_size, ds.resize, ds.cameras, ds.action_dim) == ([SIZE, SIZE], "crop", ["top"], 2)
    with pytest.raises(
        ConfigError, match=r"--dataset.image_size=\[64, 64\] contradicts .* image_size=\[16, 16\]"
    ):
        dataset_config_for(model.cfg, DatasetConfig(image_size=[64, 64]))
    with pytest.raises(ConfigError, match=r"--dataset.action_dim=4 contradicts .* action_dim=2"):
        dataset_config_for(model.cfg, DatasetConfig(action_dim=4))


def test_imagination_runs_with_no_embodiment_flag(planar_model, tmp_path):
    policy = planar_policy(tmp_path / "policy")
    cfg = ImaginationEvalConfig(
        world_model=str(planar_model["wm"]), horizon=3, batch_envs=2, videos=0,
        starts_dataset=str(planar_model["data"]),
    )  # fmt: skip
    result = rank_policies(
        [str(policy)], cfg, SimEvalConfig(max_steps=3), 2, 0, tmp_path / "r", compare_sim=False
    )
    (record,) = json.loads((tmp_path / "r" / "ranking.json").read_text())["policies"].values()
    episodes = record["imagination"]["per_episode"]
    assert len(episodes) == 2 and 0 <= result["rows"][0]["imagined"] <= 1
    path = np.array(episodes[0]["joint_states"])
    # The start and up to 3 imagined steps (fewer when the success head ends the batch) of the 2-D state.
    assert path.shape[1] == 2 and 2 <= path.shape[0] <= 4
    cfg.embodiment = "worldloop_arm4"
    with pytest.raises(
        ConfigError, match=r"--imagination.embodiment='worldloop_arm4' contradicts .*'pusht_like'"
    ):
        rank_policies([str(policy)], cfg, SimEvalConfig(max_steps=3), 2, 0, tmp_path / "r", compare_sim=False)


def test_fidelity_benchmark_reads_the_frame_size_from_the_checkpoint(planar_model, tmp_path, monkeypatch):
    import benchmarks._common as common
    from benchmarks import world_model_fidelity

    monkeypatch.setattr(common, "RESULTS", tmp_path)  # not into the repository's results
    args = [
        f"--model_path={planar_model['wm']}", f"--dataset.root={planar_model['data']}", "--train_steps=0",
        "--eval.context=2", "--eval.horizon=3", "--eval.stride=3", "--eval.max_windows=2", "--sweep_steps=[1]",
        "--sweep_windows=2", "--speed_batches=[1]", "--speed_frames=2", "--cache_horizon=2", "--cache_batch=1",
        "--name=fidelity_planar",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["world_model_fidelity.py", *args])
    world_model_fidelity.main()  # the dataset is 24x24, the model 16x16: no --dataset.image_size
    figures = json.loads((tmp_path / "fidelity_planar.json").read_text())["figures"]
    assert figures["windows"] == 2 and len(figures["curves"]["ssim"]) == 3
    monkeypatch.setattr(sys, "argv", ["world_model_fidelity.py", *args, "--dataset.image_size=[24,24]"])
    with pytest.raises(ConfigError, match=r"--dataset.image_size=\[24, 24\] contradicts"):
        world_model_fidelity.main()


def test_the_disagreement_flag():
    bc_quickstart = {"success_rate": 0.6, "success_ci95": [0.31, 0.83]}  # imagined 6/10
    sim = {"success_rate": 0.1, "success_ci95": [0.02, 0.40]}  # 1/10 in the sim
    assert disagreement(bc_quickstart, sim) is None  # 0.31-0.83 and 0.02-0.40 overlap
    imagined = {"success_rate": 0.8, "success_ci95": [0.58, 0.92]}  # 16/20
    sentence = disagreement(imagined, {"success_rate": 0.1, "success_ci95": [0.03, 0.30]}, "lerobot_env")
    assert sentence == (
        "imagination 80% (95% CI 58%-92%) vs lerobot_env 10% (95% CI 3%-30%): the intervals do not overlap"
    )
    # Touching intervals overlap.
    assert (
        disagreement(
            {"success_rate": 0.5, "success_ci95": [0.3, 0.7]},
            {"success_rate": 0.1, "success_ci95": [0.0, 0.3]},
        )
        is None
    )


def test_finetuning_evaluates_held_out_starts_in_the_lerobot_env(planar_model, tmp_path):
    pytest.importorskip("gym_pusht")
    from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, finetune

    policy = planar_policy(tmp_path / "policy")
    args = [
        f"--policy.path={policy}", f"--world_model={planar_model['wm']}", f"--output_dir={tmp_path / 'ft'}",
        "--iterations=1", "--env.horizon=3", "--eval.every=1", "--eval.episodes=2", "--eval.batch_envs=2",
        "--eval.backend=lerobot_env", "--eval.env.type=pusht", "--eval.env.task=push the block",
        "--starts.source=dataset", f"--starts.dataset_root={planar_model['data']}", "--starts.count=2",
        "--algorithm.type=grpo", "--algorithm.group_size=2", "--algorithm.starts_per_iteration=1",
        "--algorithm.epochs=1",
    ]  # fmt: skip
    summary = finetune(parse_cli(FinetunePolicyConfig, args))
    before, after = summary["before"], summary["after"]
    # The env ran the held-out starts (no MuJoCo): 2 episodes of 3 steps, counted as evaluation steps.
    assert summary["config"]["eval"]["env"]["max_steps"] == 3 and summary["train_sim_steps"] == 0
    for ev in (before, after):
        assert (ev["reference"], ev["sim_episodes"]) == ("lerobot_env", 2)
        assert 0 <= ev["sim_success"] <= 1 and 0 <= ev["sim_progress"] <= 1  # pusht's coverage
        assert ev["disagreement"] is None or "vs lerobot_env" in ev["disagreement"]
    assert len(summary["evaluations"]) == 2


def test_rank_against_the_lerobot_env_by_max_reward(planar_model, tmp_path, monkeypatch):
    pytest.importorskip("gym_pusht")
    import benchmarks._common
    from benchmarks import imagination_eval
    from worldloop.vla.scripted_pusher import ScriptedPusherConfig, ScriptedPusherPolicy

    for skill in (0.0, 1.0):
        ScriptedPusherPolicy(ScriptedPusherConfig(skill=skill)).save_pretrained(
            tmp_path / "zoo" / f"pusher_{skill}"
        )
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    argv = ["imagination_eval.py", f"--world_model={planar_model['wm']}", "--reference=lerobot_env",
            "--env.type=pusht", "--env.task=push the block", "--horizon=3", "--episodes=2", "--batch_envs=2",
            f"--zoo={tmp_path / 'zoo'}",
            f"--output_dir={tmp_path / 'out'}", "--name=pusht_rank"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    imagination_eval.main()
    figures = json.loads((tmp_path / "results" / "pusht_rank.json").read_text())["figures"]
    assert figures["rank_by"] == "max_reward" and figures["reference"] == "lerobot_env pusht"
    assert figures["judge"]["kind"] in ("drawn_frames", "drawn_and_first_frame", "kinematic")
    saved = json.loads((tmp_path / "out" / "ranking.json").read_text())["policies"]
    for name, row in zip(("pusher_0.0", "pusher_1.0"), figures["policies"]):
        record = saved[name]
        # Both sides ran the same seeded env starts: 2 episodes of 3 steps, scored by their max reward.
        assert [e["seed"] for e in record["env"]["per_episode"]] == [100_000, 100_001]
        assert row["env"] == pytest.approx(np.mean([e["max_reward"] for e in record["env"]["per_episode"]]))
        assert row["imagined"] == pytest.approx(record["imagination"]["mean_max_reward"])
        assert all(0 <= e["max_reward"] <= 1 for e in record["imagination"]["per_episode"])
    assert set(figures["ranking_ci95"]) == {"pearson", "spearman", "mmrv"}


def test_env_starts_are_its_seeded_resets_at_the_model_size(planar_model):
    pytest.importorskip("gym_pusht")
    from worldloop.rl_finetune.imagination.initial_states import lerobot_env_starts
    from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, env_spec, make_env
    from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig

    env = WorldModelEnv(WorldModel.from_pretrained(planar_model["wm"]), WorldModelEnvConfig(horizon=2))
    cfg = LeRobotEnvEvalConfig(type="pusht", task="push the block")
    starts = lerobot_env_starts(env, cfg, 2, seed=7)
    assert starts.frames["top"].shape == (2, 1, 3, SIZE, SIZE) and starts.task == ["push the block"] * 2
    pusht = make_env(env_spec(cfg), 0)
    expected = [pusht.reset(seed=s)[0]["agent_pos"] for s in (7, 8)]
    pusht.close()
    assert np.allclose(starts.state.numpy(), np.stack(expected))
    obs = env.reset(starts, seed=0)  # and imagination starts from them
    assert obs["observation.state"].shape == (2, 2)


def test_open_loop_replay_scores_the_judge_with_its_interval_and_names_it(
    planar_model, tmp_path, monkeypatch
):
    import shutil

    import benchmarks._common as common
    from benchmarks import imagination_eval

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    data = shutil.copytree(planar_model["data"], tmp_path / "replays")
    info = json.loads((data / "meta" / "info.json").read_text())
    success = [i % 2 == 0 for i in range(info["total_episodes"])]  # the replay's reference, written here
    episodes = [{"episode_index": i, "skill": i / 10, "success": s} for i, s in enumerate(success)]
    (data / "meta" / "recording.json").write_text(json.dumps({"episodes": episodes}))
    args = [
        f"--world_model={planar_model['wm']}", f"--replay_dataset={data}", "--replay_split=all",
        f"--horizon={LENGTH - 1}", "--batch_envs=3", "--skill_bins=2", "--threads=1", "--name=replay_planar",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["imagination_eval.py", *args])
    imagination_eval.main()
    figures = json.loads((tmp_path / "results" / "replay_planar.json").read_text())["figures"]
    assert figures["episodes"] == EPISODES and figures["recorded_success"] == pytest.approx(0.5)
    ci = figures["success_head_auroc_ci95"]
    assert ci["low"] <= figures["success_head_auroc"] <= ci["high"]
    judge = WorldModel.from_pretrained(planar_model["wm"]).cfg.heads
    assert figures["judge"]["kind"] == "drawn_frames" and figures["judge"]["reads_state"] == judge.use_state
    assert "colour_reading" not in figures  # no tabletop push here: no cube and square to track
