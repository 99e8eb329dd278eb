"""The closed loop on tiny models: the policy's sim episodes are recorded and appended to the world model's
data, the world model is fine-tuned on the grown data, the policy again in imagination; two rounds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from imagination_fixtures import IMAGE_SIZE, tiny_policy, tiny_world_model

from worldloop.common.training import TrainLoopConfig
from worldloop.data.recording import grow_dataset
from worldloop.rl_finetune.closed_loop import finetune_world_model, oversampled, run_closed_loop
from worldloop.rl_finetune.closed_loop_config import LoopConfig
from worldloop.rl_finetune.policy_rl.finetune import (
    FinetuneEvalConfig,
    FinetunePolicyConfig,
    PolicyPath,
    StartsConfig,
)
from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.sim.experts import ScriptedExpert
from worldloop.sim.recording import RecordingConfig, record_actor_episodes, record_demos
from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.vla.sim_recording import record_policies
from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import WorldModelEnvConfig

STEPS = 4  # frames per episode (sim and imagination)


def _base_dataset(root, episodes=4):
    cfg = RecordingConfig(
        root=str(root), task="reach", episodes=episodes, skill_range=[0.0, 1.0], image_size=16,
        cameras=["front"], max_steps=STEPS, terminate_on_success=False, image_writer_threads=0,
    )  # fmt: skip
    return record_demos(cfg)


def _config(tmp_path, rounds=2):
    wm, policy = tmp_path / "wm", tmp_path / "policy"
    tiny_world_model().save_pretrained(wm)
    tiny_policy().save_pretrained(policy)
    train = TrainLoopConfig(steps=3, batch_size=2, warmup_steps=1, lr=1e-3, ema_decay=0.0, report_to="none")
    return FinetunePolicyConfig(
        policy=PolicyPath(str(policy)), world_model=str(wm), output_dir=str(tmp_path / "loop"), iterations=1,
        env=WorldModelEnvConfig(horizon=STEPS),
        algorithm=GRPOConfig(group_size=2, starts_per_iteration=2, epochs=1, minibatch_size=8, lr=1e-3),
        starts=StartsConfig(count=3, seed=0),
        eval=FinetuneEvalConfig(every=1, episodes=2, seed=100, batch_envs=2, max_gap=1.0,
                                sim=SimEvalConfig(task="reach", max_steps=STEPS, batch_envs=2, videos=0)),
        loop=LoopConfig(rounds=rounds, dataset_root=str(_base_dataset(tmp_path / "data")), episodes=2, seed=1000,
                        window=3, world_model_train=train),
    )  # fmt: skip


@pytest.mark.slow  # two full rounds (record, aggregate, world-model and policy fine-tune, sim evaluation)
def test_two_round_loop_grows_the_data_and_changes_the_world_model(tmp_path):
    cfg = _config(tmp_path)
    result = run_closed_loop(cfg)
    out = tmp_path / "loop"
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    # The data grows by the recorded episodes each round; failures are kept.
    assert result["initial"]["dataset"]["episodes"] == 4
    assert [r["dataset"]["episodes"] for r in rounds] == [6, 8]
    assert [r["dataset"]["frames"] for r in rounds] == [6 * STEPS, 8 * STEPS]
    assert [r["recorded"]["seeds"] for r in rounds] == [[1000, 1001], [1002, 1003]]
    # Sim steps: recording steps the sim once per recorded frame, training never.
    assert all(r["recorded"]["sim_steps"] == r["recorded"]["frames"] == 2 * STEPS for r in rounds)
    assert result["sim_steps"]["training"] == 0 and result["sim_steps"]["evaluation"] > 0
    assert all(r["world_model"]["sim_steps"] == 0 and r["policy"]["train_sim_steps"] == 0 for r in rounds)
    assert all(r["world_model"]["loss_first_tenth"] > 0 and r["world_model"]["windows"] > 0 for r in rounds)
    # The world model was fine-tuned from its weights, round after round.
    first = WorldModel.from_pretrained(cfg.world_model).state_dict()
    last = WorldModel.from_pretrained(result["final"]["world_model"]).state_dict()
    assert any(not torch.equal(first[k], last[k]) for k in first)
    assert result["final"]["world_model"] == str(out / "round_2" / "world_model" / "pretrained_model")
    # Round 2 starts from round 1's policy and world model.
    assert rounds[1]["policy"]["path"] == str(out / "round_2" / "policy" / "pretrained_model")
    saved = json.loads((out / "round_2" / "policy" / "summary.json").read_text())
    assert saved["policy"] == str(out / "round_1" / "policy" / "pretrained_model")
    assert saved["world_model"] == str(out / "round_2" / "world_model" / "pretrained_model")
    # Per-round JSON and the plot.
    assert json.loads((out / "round_1" / "round.json").read_text())["round"] == 1
    assert len(json.loads((out / "closed_loop.json").read_text())["rounds"]) == 2
    assert (out / "closed_loop.png").stat().st_size > 0


def test_heads_only_world_model_step_changes_the_heads_alone(tmp_path):
    cfg = _config(tmp_path, rounds=1)
    loop = dataclasses.replace(cfg.loop, heads_only=True, calibrate_success=True, held_out_fraction=0.5)
    path, logs = finetune_world_model(
        cfg.world_model, Path(loop.dataset_root), loop, tmp_path / "wm_ft", "cpu"
    )
    before = WorldModel.from_pretrained(cfg.world_model).state_dict()
    after = WorldModel.from_pretrained(path).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("heads.") for k in changed)
    assert logs["heads_only"] and logs["loss_first_tenth"] > 0
    # The threshold reported is the one saved (calibrated, or left as it was when the held-out episodes
    # are all successes or all failures).
    assert WorldModel.from_pretrained(path).cfg.heads.success_threshold == logs["success_threshold"][1]


def test_recorded_windows_are_oversampled_to_their_share():
    class Windows:
        starts = [(episode, 10 * episode) for episode in range(10) for _ in range(3)]  # 3 windows each

        def __len__(self):
            return len(self.starts)

        def __getitem__(self, i):
            return self.starts[i]

    windows = Windows()
    assert oversampled(windows, 8, 0.0) == (windows, 6)
    assert oversampled(windows, 10, 0.5) == (windows, 0)  # nothing recorded yet
    data, recorded = oversampled(windows, 8, 0.5)  # 24 others: 6 recorded windows x 4
    items = [data[i] for i in range(len(data))]
    assert recorded == 6 and len(items) == 48
    assert sum(episode >= 8 for episode, _ in items) == 24


def test_loop_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="loop.dataset_root"):
        LoopConfig(rounds=1).validate()
    with pytest.raises(ValueError, match="loop.recorded_fraction"):
        LoopConfig(recorded_fraction=1.0).validate()
    cfg = _config(tmp_path, rounds=1)
    cfg.loop.seed = 99  # episodes 99, 100 overlap the evaluation seeds 100, 101
    with pytest.raises(ValueError, match="overlap the eval seeds"):
        run_closed_loop(cfg)


def test_recorded_episodes_keep_failures_and_grow_only_compatible_data(tmp_path):
    env_cfg = TabletopEnvConfig(task="reach", image_size=16, cameras=("front",), max_steps=STEPS,
                                terminate_on_success=False)  # fmt: skip
    env = TabletopEnv(env_cfg)
    try:
        episodes = record_actor_episodes(env, ScriptedExpert(env), tmp_path / "a", [0, 1])
    finally:
        env.close()
    assert [e["length"] for e in episodes] == [STEPS, STEPS]
    meta = json.loads((tmp_path / "a" / "meta" / "recording.json").read_text())
    assert meta["complete"] and [e["seed"] for e in meta["episodes"]] == [0, 1]
    assert all(isinstance(e["success"], bool) for e in meta["episodes"])
    grown = grow_dataset([tmp_path / "a", tmp_path / "a"], tmp_path / "twice")
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    assert LeRobotDatasetMetadata("local/twice", root=grown).total_episodes == 4
    other = _base_dataset(tmp_path / "front", episodes=1)  # front only; the next one adds a wrist camera
    cfg = RecordingConfig(root=str(tmp_path / "both"), task="reach", episodes=1, image_size=16,
                          cameras=["front", "wrist"], max_steps=STEPS, image_writer_threads=0)  # fmt: skip
    both = record_demos(cfg)
    with pytest.raises(ValueError, match="observation.images.wrist"):
        grow_dataset([other, both], tmp_path / "mixed")
    with pytest.raises(FileExistsError):
        grow_dataset([tmp_path / "a"], grown)


def test_kl_reference_can_be_another_policy(tmp_path):
    from worldloop.rl_finetune.policy_rl.finetune import make_trainer
    from worldloop.world_model.world_model_env import WorldModelEnv

    bc = tmp_path / "bc"
    tiny_policy(seed=5).save_pretrained(bc)
    cfg = FinetunePolicyConfig(policy=PolicyPath("unused"), world_model="unused", reference_policy=str(bc))
    trainer = make_trainer(cfg, tiny_policy(seed=0), WorldModelEnv(tiny_world_model()))
    reference, original = trainer.reference.state_dict(), tiny_policy(seed=5).state_dict()
    assert all(torch.equal(reference[k], original[k]) for k in original)
    assert not all(torch.equal(reference[k], v) for k, v in trainer.policy.state_dict().items())


def test_record_policies_appends_each_policys_episodes_after_the_included_data(tmp_path):
    """`record_demos.py --policies=[a, b] --include=[experts]`: expert episodes first, then each policy's,
    on the seeds the docs promise; a policy reading another camera is refused before anything is written."""
    experts = _base_dataset(tmp_path / "experts", episodes=2)
    paths = []
    for k in range(2):
        tiny_policy(seed=k).save_pretrained(tmp_path / f"p{k}")
        paths.append(str(tmp_path / f"p{k}"))
    cfg = RecordingConfig(
        root=str(tmp_path / "grown"), task="reach", episodes=3, seed=500, image_size=IMAGE_SIZE,
        cameras=["front"], max_steps=STEPS, terminate_on_success=False, image_writer_threads=0,
        policies=paths, include=[str(experts)],
    )  # fmt: skip
    root = record_policies(cfg)
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata("local/grown", root=root)
    assert meta.total_episodes == 2 + 2 * 3 and meta.total_frames == (2 + 2 * 3) * STEPS
    recording = json.loads((root / "meta" / "recording.json").read_text())
    assert [p["policy"] for p in recording["policies"]] == paths
    assert [[e["seed"] for e in p["episodes"]] for p in recording["policies"]] == [
        [500, 501, 502],
        [503, 504, 505],
    ]
    assert not (tmp_path / ".grown.parts").exists()

    tiny_policy(cameras=("wrist",)).save_pretrained(tmp_path / "wrist")
    cfg.root, cfg.policies = str(tmp_path / "refused"), [str(tmp_path / "wrist")]
    with pytest.raises(ValueError, match="reads cameras"):
        record_policies(cfg)


def test_interrupted_policy_recording_merges_nothing_and_says_where(tmp_path, monkeypatch, capsys):
    import worldloop.vla.sim_recording as sim_recording
    from worldloop import record_demos as cli
    from worldloop.data.recording import policy_recording_parts

    paths = []
    for k in range(2):
        tiny_policy(seed=k).save_pretrained(tmp_path / f"p{k}")
        paths.append(str(tmp_path / f"p{k}"))
    record = sim_recording.record_policy_episodes
    calls = {"n": 0}

    def second_policy_interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return record(*args, **kwargs)

    monkeypatch.setattr(sim_recording, "record_policy_episodes", second_policy_interrupted)
    root = tmp_path / "grown"
    with pytest.raises(SystemExit):
        cli.main([f"--root={root}", "--task=reach", "--episodes=2", f"--image_size={IMAGE_SIZE}",
                  "--cameras=[front]", f"--max_steps={STEPS}", "--image_writer_threads=0",
                  f"--policies=[{paths[0]},{paths[1]}]"])  # fmt: skip
    assert not root.exists()  # nothing merged
    parts = policy_recording_parts(root)
    assert f"{parts} (a dataset per policy, not merged into {root})" in capsys.readouterr().err
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    assert LeRobotDatasetMetadata("local/part", root=parts / "000").total_episodes == 2
