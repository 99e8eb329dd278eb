"""Recording scripted episodes into a LeRobotDataset v3 and reading them back with lerobot, offline; the one
writer (`data.recording.EpisodeWriter`) behind every recording: scripted experts, policies, deployment runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import worldloop.sim.recording as recording
from worldloop.data.features import ACTION, DONE, ENVIRONMENT_STATE, REWARD, STATE, SUCCESS, image_key
from worldloop.data.recording import RECORDING_META, EpisodeWriter, recording_part
from worldloop.sim.recording import RecordingConfig, record_demos
from worldloop.sim.tabletop_env import ENVIRONMENT_STATE_NAMES, TabletopEnv

TINY_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "record" / "tiny.yaml"


def _config(tmp_path, **overrides) -> RecordingConfig:
    base = dict(
        root=str(tmp_path / "demos"),
        repo_id="worldloop/test_demos",
        task="reach",
        episodes=2,
        image_size=16,
        max_steps=6,
        terminate_on_success=False,
    )
    return RecordingConfig(**{**base, **overrides})


def _read(cfg: RecordingConfig):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(cfg.repo_id, root=cfg.root)


def _interrupt_at_action(monkeypatch, n: int) -> None:
    """Make the scripted expert raise KeyboardInterrupt (Ctrl-C) when asked for its n-th action."""
    calls = {"n": 0}
    act = recording.ScriptedExpert.act

    def act_then_interrupt(self):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return act(self)

    monkeypatch.setattr(recording.ScriptedExpert, "act", act_then_interrupt)


def test_round_trip_through_lerobot_dataset(tmp_path):
    cfg = _config(tmp_path)
    record_demos(cfg)
    ds = _read(cfg)
    assert ds.num_episodes == 2 and ds.num_frames == 12 and ds.fps == 10
    env = TabletopEnv(task="reach", cameras=())
    instructions = [env.reset(seed=cfg.seed + i)[1]["task"] for i in range(2)]
    env.close()
    for i, frame in enumerate(ds):
        episode, t = divmod(i, 6)
        for cam in ("front", "wrist"):
            assert frame[image_key(cam)].shape == (3, 16, 16)
        assert frame[STATE].shape == (4,) and frame[ACTION].shape == (4,)
        assert frame["task"] == instructions[episode]
        assert bool(frame[DONE]) == (t == 5)
        assert 0.0 <= float(frame[REWARD]) <= 1.0 and frame[SUCCESS].dtype.is_floating_point is False
    meta = json.loads((tmp_path / "demos" / RECORDING_META).read_text())
    assert meta["complete"] and [e["seed"] for e in meta["episodes"]] == [0, 1]
    assert all(e["length"] == 6 for e in meta["episodes"])


def test_each_frame_records_where_the_cubes_were_at_that_frame(tmp_path):
    cfg = _config(
        tmp_path, task="push", episodes=1, cameras=["front"], max_steps=30, skill=1.0, environment_state=True
    )
    record_demos(cfg)
    ds = _read(cfg)
    assert ds.features[ENVIRONMENT_STATE]["names"] == list(ENVIRONMENT_STATE_NAMES)
    recorded = np.stack([ds[i][ENVIRONMENT_STATE].numpy() for i in range(ds.num_frames)])
    # replay the episode: the recorded state of frame t is the sim's before action t
    env = TabletopEnv(task="push", cameras=())
    env.reset(seed=cfg.seed)
    replayed = [env.environment_state()]
    for i in range(ds.num_frames - 1):
        env.step(ds[i][ACTION].numpy())
        replayed.append(env.environment_state())
    env.close()
    np.testing.assert_allclose(recorded, np.stack(replayed), atol=1e-5)
    assert np.abs(recorded[-1] - recorded[0]).max() > 0.005  # the expert moved a cube


def test_existing_root_is_an_error_unless_overwrite(tmp_path):
    (tmp_path / "demos").mkdir()
    with pytest.raises(FileExistsError, match="--overwrite"):
        record_demos(_config(tmp_path))
    record_demos(_config(tmp_path, episodes=1, overwrite=True, cameras=["front"]))
    assert _read(_config(tmp_path)).num_episodes == 1


def test_overwrite_with_the_root_included_is_an_error_and_deletes_nothing(tmp_path):
    root = tmp_path / "demos"
    root.mkdir()
    (root / "keep").write_text("the included dataset")
    with pytest.raises(ValueError, match="--overwrite=true with --include naming the root"):
        record_demos(_config(tmp_path, overwrite=True, include=[str(tmp_path / "." / "demos")]))
    assert (root / "keep").read_text() == "the included dataset"


def test_interrupted_recording_leaves_a_readable_dataset(tmp_path, monkeypatch):
    _interrupt_at_action(monkeypatch, 15)  # two whole 6-step episodes, then Ctrl-C in the third
    cfg = _config(tmp_path, episodes=5, cameras=["front"])
    with pytest.raises(KeyboardInterrupt):
        record_demos(cfg)
    ds = _read(cfg)
    assert ds.num_episodes == 2 and ds.num_frames == 12
    assert np.array_equal(ds.meta.episodes["length"], [6, 6])
    assert not json.loads((tmp_path / "demos" / RECORDING_META).read_text())["complete"]


def test_skill_mixture_and_bad_config():
    cfg = RecordingConfig(episodes=200, skill_range=[0.2, 0.9], seed=1)
    skills = recording.episode_skills(cfg)
    assert skills.min() >= 0.2 and skills.max() <= 0.9 and skills.std() > 0.1
    with pytest.raises(ValueError, match="skill_range"):
        RecordingConfig(skill_range=[0.9, 0.2]).validate()
    with pytest.raises(ValueError, match="task"):
        RecordingConfig(task="fly").validate()


def test_record_demos_cli_with_the_tiny_config(tmp_path):
    from worldloop import record_demos

    root = tmp_path / "cli"
    record_demos.main(
        [
            "--config",
            str(TINY_CONFIG),
            f"--root={root}",
            "--episodes=1",
            "--max_steps=3",
            "--image_size=16",
        ]
    )
    meta = json.loads((root / RECORDING_META).read_text())
    assert meta["complete"] and meta["config"]["skill_range"] == [0.3, 1.0]
    assert 0.3 <= meta["episodes"][0]["skill"] <= 1.0


# LeRobot's stats cast our bool columns and warn per process, flooding the progress bar: the writer hushes it.
@pytest.mark.filterwarnings("error:Converting input from bool:RuntimeWarning")
def test_an_episode_succeeds_when_any_step_does(tmp_path):
    """Without termination at success an episode can reach the goal and move on: it still succeeded."""

    class Env:
        def __init__(self):
            self.t = 0

        def reset(self, seed):
            return {STATE: np.zeros(1, dtype=np.float32)}, {}

        def step(self, action):
            self.t += 1
            info = {"success": self.t == 2, "task": "reach the red cube"}
            return {STATE: np.full(1, self.t, dtype=np.float32)}, 0.0, False, self.t == 4, info

    class Expert:
        def reset(self, seed):
            pass

        def act(self):
            return np.zeros(1, dtype=np.float32)

    with EpisodeWriter(tmp_path / "d", "local/d", 10, "arm", ["j"], (), (0, 0), episodes=1) as writer:
        episode = recording.record_episode(Env(), Expert(), writer, seed=3, skill=0.5)
    assert episode == {"episode_index": 0, "seed": 3, "success": True, "length": 4, "skill": 0.5}
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/d", root=tmp_path / "d")
    assert [bool(ds[i][SUCCESS]) for i in range(4)] == [False, True, False, False]
    # each frame holds the observation before its step
    assert [float(ds[i][STATE]) for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert json.loads((tmp_path / "d" / RECORDING_META).read_text()) == {
        "complete": True,
        "episodes": [episode],
    }


def test_recording_after_included_data_merges_them_in_order(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    first = _config(tmp_path, root=str(tmp_path / "first"), seed=10)
    record_demos(first)
    more = _config(tmp_path, root=str(tmp_path / "both"), seed=40, episodes=3, include=[first.root])
    record_demos(more)
    assert LeRobotDatasetMetadata(more.repo_id, root=more.root).total_episodes == 5
    both, alone = _read(more), _read(first)
    # the included episodes come first, unchanged
    np.testing.assert_array_equal(both[0][ACTION].numpy(), alone[0][ACTION].numpy())
    recorded = json.loads((tmp_path / "both" / RECORDING_META).read_text())
    assert [e["seed"] for e in recorded["episodes"]] == [40, 41, 42] and recorded["complete"]
    assert not (tmp_path / ".both.part").exists()


def test_interrupted_recording_after_included_data_merges_nothing_and_says_where(
    tmp_path, monkeypatch, capsys
):
    from worldloop import record_demos as cli

    first = _config(tmp_path, root=str(tmp_path / "first"))
    record_demos(first)
    _interrupt_at_action(monkeypatch, 9)  # one whole 6-step episode, then Ctrl-C in the second
    both = tmp_path / "both"
    with pytest.raises(SystemExit):
        cli.main([f"--root={both}", "--repo_id=worldloop/test_demos", "--task=reach", "--episodes=3",
                  "--image_size=16", "--max_steps=6", "--terminate_on_success=false", f"--include=[{first.root}]"])  # fmt: skip
    assert not both.exists()  # nothing merged
    part = recording_part(both)
    assert f"{part} (not merged into {both})" in capsys.readouterr().err
    assert len(json.loads((part / RECORDING_META).read_text())["episodes"]) == 1


def test_expert_policy_and_deploy_recordings_share_the_one_writer(tmp_path, monkeypatch):
    """Scripted experts, a policy in the sim and a deployment run all write through `EpisodeWriter`: every
    frame passes its `add_frame`, and the datasets share features and `meta/recording.json` facts."""
    from imagination_fixtures import IMAGE_SIZE, tiny_policy
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    from worldloop.real_robot.deploy import DeployConfig, deploy
    from worldloop.real_robot.fault_injection import SlowSmoothPolicy
    from worldloop.sim.tabletop_env import TabletopEnvConfig
    from worldloop.vla.sim_recording import record_policy_episodes

    written: dict[str, int] = {}
    add_frame = EpisodeWriter.add_frame

    def counted(self, *args, **kwargs):
        written[self.root.name] = written.get(self.root.name, 0) + 1
        return add_frame(self, *args, **kwargs)

    monkeypatch.setattr(EpisodeWriter, "add_frame", counted)
    record_demos(
        _config(tmp_path, root=str(tmp_path / "expert"), episodes=1, image_size=IMAGE_SIZE, max_steps=3)
    )
    env_cfg = TabletopEnvConfig(task="reach", image_size=IMAGE_SIZE, cameras=("front", "wrist"), max_steps=3)
    record_policy_episodes(tiny_policy(cameras=("front", "wrist")), env_cfg, tmp_path / "policy", [0])
    cfg = DeployConfig(episode_time_s=0.5, stop_on_success=False)
    cfg.robot.image_size = IMAGE_SIZE
    cfg.runtime.status_every_s = 0.0
    cfg.record.root = str(tmp_path / "deploy")
    deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.05))

    roots = ("expert", "policy", "deploy")
    metas = {r: LeRobotDatasetMetadata(f"local/{r}", root=tmp_path / r) for r in roots}
    assert written == {r: m.total_frames for r, m in metas.items()} and all(written.values())
    assert metas["expert"].features == metas["policy"].features == metas["deploy"].features
    for r in roots:
        recording = json.loads((tmp_path / r / RECORDING_META).read_text())
        assert recording["complete"] and len(recording["episodes"]) == 1, r
        episode = recording["episodes"][0]
        assert {"episode_index", "success", "length"} <= episode.keys(), r
        assert episode["episode_index"] == 0 and episode["length"] == metas[r].total_frames, r


def test_a_durable_recording_cut_inside_a_save_is_repaired(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from worldloop.data.recording import repair_recording

    root = tmp_path / "run"
    writer = EpisodeWriter(
        root, "local/run", 10, "sim", ("a", "b"), ("front",), (8, 8), episodes=None, durable=True
    )
    for episode in range(2):
        for t in range(3):
            frame = {
                STATE: np.full(2, 10 * episode + t, np.float32),
                image_key("front"): np.zeros((8, 8, 3), np.uint8),
            }
            writer.add_frame(frame, np.zeros(2), 0.0, False, False, "push")
        writer.end_episode(segment=episode)
        assert LeRobotDataset("local/run", root=root).num_frames == 3 * (episode + 1)  # readable as it stands
    # a crash inside the third save: a parquet file without its footer, info.json half written
    (root / "data" / "chunk-000" / "file-002.parquet").write_bytes(b"PAR1 partial")
    (root / "meta" / "info.json").write_text('{"codebase_version": ')
    assert repair_recording(root) == ["data/chunk-000/file-002.parquet"]
    ds = LeRobotDataset("local/run", root=root)
    assert ds.num_episodes == 2 and [float(ds[i][STATE][0]) for i in range(6)] == [0, 1, 2, 10, 11, 12]
    assert json.loads((root / RECORDING_META).read_text())["complete"] is False  # never closed


def test_replayed_actions_do_in_the_sim_what_they_did_when_recorded(tmp_path):
    cfg = _config(tmp_path, task="push", episodes=2, cameras=["front"], max_steps=30, environment_state=True)
    record_demos(cfg)
    ds = _read(cfg)
    lines = []
    for e in range(2):
        rows = [ds[i] for i in range(ds.num_frames) if int(ds[i]["episode_index"]) == e]
        actions = [r[ACTION].tolist() for r in rows]
        # the second episode's list stops early and its last action is held: a scripted push ends at rest
        lines.append(json.dumps({"seed": cfg.seed + e, "actions": actions if e == 0 else actions[:25]}))
    replays = tmp_path / "imagined_actions.jsonl"
    replays.write_text("\n".join(lines) + "\n")
    again = _config(
        tmp_path,
        task="push",
        cameras=["front"],
        max_steps=30,
        environment_state=True,
        root=str(tmp_path / "replayed"),
        replay=[str(replays)],
        repo_id="worldloop/replayed",
    )
    record_demos(again)
    replayed = _read(again)
    assert replayed.num_episodes == 2 and replayed.num_frames == ds.num_frames
    np.testing.assert_allclose(
        np.stack([replayed[i][ENVIRONMENT_STATE].numpy() for i in range(30)]),
        np.stack([ds[i][ENVIRONMENT_STATE].numpy() for i in range(30)]),
        atol=1e-5,
    )
    assert [replayed[i][ACTION].tolist() for i in range(30)] == [ds[i][ACTION].tolist() for i in range(30)]
    held = [replayed[i][ACTION].tolist() for i in range(30 + 24, 60)]
    assert all(a == held[0] for a in held)
    meta = json.loads((tmp_path / "replayed" / RECORDING_META).read_text())
    original = json.loads((tmp_path / "demos" / RECORDING_META).read_text())
    assert [e["seed"] for e in meta["episodes"]] == [0, 1]
    assert meta["episodes"][0]["success"] == original["episodes"][0]["success"]
    assert all(e["replay"] == str(replays) for e in meta["episodes"])


def test_bad_replay_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "a.jsonl"
    bad.write_text('{"seed": 1, "actions": [[0, 0, 0, 0]]}\n{"seed": 2}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2"):
        recording.read_replays([bad], 4)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        recording.read_replays([tmp_path / "missing.jsonl"], 4)
    with pytest.raises(ValueError, match="not both"):
        RecordingConfig(policies=["p"], replay=[str(bad)]).validate()
    wrong = tmp_path / "b.jsonl"
    wrong.write_text('{"seed": 1, "actions": [[0, 0]]}\n')
    cfg = _config(tmp_path, task="push", cameras=["front"], replay=[str(wrong)])
    with pytest.raises(ValueError, match=r"b\.jsonl, line 1: actions must be a non-empty \[steps, 4\]"):
        record_demos(cfg)
    assert not Path(cfg.root).exists()  # checked before anything is written
