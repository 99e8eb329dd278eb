"""WorldModelEnv: observation contract, determinism, batching, horizon, termination, state model, resets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from imagination_fixtures import IMAGE_SIZE, random_starts, tiny_world_model

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.dataset import DatasetConfig, EpisodeDataset
from worldloop.data.features import STATE, TASK, image_key
from worldloop.rl_finetune.imagination import initial_states
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig, from_dataset


def _run(env, starts, actions, seed):
    obs = env.reset(starts, seed=seed)
    out = [obs]
    for chunk in actions:
        out.append(env.step(chunk))
    return out


def _chunks(b, n, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(b, k, 4, generator=g) for _ in range(n)]


def test_observation_has_the_policy_batch_format():
    env = WorldModelEnv(tiny_world_model(cameras=("front", "wrist")))
    obs = env.reset(random_starts(3, cameras=("front", "wrist")), seed=0)
    assert set(obs) == {image_key("front"), image_key("wrist"), STATE, TASK}
    for cam in ("front", "wrist"):
        img = obs[image_key(cam)]
        assert img.shape == (3, 3, IMAGE_SIZE, IMAGE_SIZE) and img.dtype == torch.float32
    obs, reward, terminated, truncated, info = env.step(torch.rand(3, 2, 4))
    for cam in ("front", "wrist"):
        img = obs[image_key(cam)]
        assert img.shape == (3, 3, IMAGE_SIZE, IMAGE_SIZE) and 0 <= img.min() and img.max() <= 1
        assert info["frames"][cam].shape == (3, 2, 3, IMAGE_SIZE, IMAGE_SIZE)
        # The observation is the last imagined frame of the chunk.
        assert torch.equal(img, info["frames"][cam][:, -1])
    assert reward.shape == terminated.shape == truncated.shape == (3,)
    assert info["rewards"].shape == info["success_prob"].shape == (3, 2)
    assert obs[STATE].shape == (3, 4) and len(obs[TASK]) == 3


def test_same_seed_same_rollout_other_seed_other_frames():
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=9))
    starts, actions = random_starts(2, context=2), _chunks(2, 3)
    a, b, c = (_run(env, starts, actions, seed) for seed in (5, 5, 6))
    for x, y in zip(a[1:], b[1:]):
        assert torch.equal(x[0][image_key("front")], y[0][image_key("front")])
        assert torch.equal(x[1], y[1]) and torch.equal(x[4]["success_prob"], y[4]["success_prob"])
    assert not torch.allclose(a[-1][0][image_key("front")], c[-1][0][image_key("front")])


def test_batch_rows_are_independent_episodes():
    """Two rows with the same start and actions get their own noise; a row's actions change only that row."""
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=4))
    starts = random_starts(1).repeat(2)
    env.reset(starts, seed=0)
    obs, *_ = env.step(torch.full((2, 4, 4), 0.3))
    img = obs[image_key("front")]
    assert not torch.allclose(img[0], img[1])
    # Same seed, different actions for row 1 only: the row-0 frames, which share row 0's noise, are unchanged.
    env.reset(starts, seed=0)
    other = torch.full((2, 4, 4), 0.3)
    other[1] = -0.5
    obs2, *_ = env.step(other)
    assert torch.allclose(obs2[image_key("front")][0], img[0], atol=1e-5)
    assert not torch.allclose(obs2[image_key("front")][1], img[1], atol=1e-3)


def test_kv_cache_matches_recompute_reference():
    wm = tiny_world_model(context_frames=3)
    starts, actions = random_starts(2, context=3), _chunks(2, 2, k=3)
    cached = _run(WorldModelEnv(wm, WorldModelEnvConfig(horizon=6, use_cache=True)), starts, actions, 1)
    slow = _run(WorldModelEnv(wm, WorldModelEnvConfig(horizon=6, use_cache=False)), starts, actions, 1)
    for x, y in zip(cached[1:], slow[1:]):
        torch.testing.assert_close(x[4]["frames"]["front"], y[4]["frames"]["front"], atol=2e-4, rtol=0)


def test_horizon_cuts_the_last_chunk_and_then_refuses_to_step():
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=5))
    env.reset(random_starts(2), seed=0)
    _, _, _, truncated, info = env.step(torch.rand(2, 3, 4))
    assert not truncated.any() and env.steps_taken == 3
    _, _, _, truncated, info = env.step(torch.rand(2, 3, 4))
    assert truncated.all() and env.steps_taken == 5 and info["rewards"].shape == (2, 2)
    assert env.done.all()
    with pytest.raises(RuntimeError, match="horizon"):
        env.step(torch.rand(2, 1, 4))


def test_success_terminates_and_stops_reward(monkeypatch):
    wm = tiny_world_model()
    env = WorldModelEnv(wm, WorldModelEnvConfig(horizon=8, success_threshold=0.5))
    real_rollout = wm.rollout
    success = torch.tensor([[0.1, 0.9, 0.1, 0.1], [0.1, 0.1, 0.1, 0.2]])
    rewards = torch.tensor([[0.2, 0.5, 7.0, 7.0], [0.1, 0.2, 0.3, 0.4]])

    def scripted(*args, **kwargs):
        frames, _, _ = real_rollout(*args, **kwargs)
        return frames, rewards, success

    monkeypatch.setattr(wm, "rollout", scripted)
    env.reset(random_starts(2), seed=0)
    _, reward, terminated, truncated, info = env.step(torch.rand(2, 4, 4))
    assert terminated.tolist() == [True, False] and not truncated.any()
    torch.testing.assert_close(reward, torch.tensor([0.7, 1.0]))  # row 0 stops at its success step
    torch.testing.assert_close(info["progress"], torch.tensor([1.0, 0.4]))
    _, reward, terminated, _, _ = env.step(torch.rand(2, 4, 4))
    assert reward[0] == 0 and terminated[0]  # a finished episode earns nothing more

    # By default the threshold is the world model's calibrated one: at 0.95 nobody succeeded above.
    wm.cfg.heads.success_threshold = 0.95
    strict = WorldModelEnv(wm, WorldModelEnvConfig(horizon=8))
    strict.reset(random_starts(2), seed=0)
    _, _, terminated, _, _ = strict.step(torch.rand(2, 4, 4))
    assert strict.success_threshold == 0.95 and not terminated.any()


def test_state_follows_targets_like_the_sim_servo():
    env = WorldModelEnv(tiny_world_model())
    start = torch.zeros(1, 4)
    far = torch.tensor([[[10.0, -10.0, 0.05, 0.0]] * 3])
    states = env.integrate_state(start, far)
    step = torch.tensor(TABLETOP_ARM.velocity_limit) / TABLETOP_ARM.fps
    torch.testing.assert_close(states[0, 0, :2], torch.stack([step[0], -step[1]]))
    assert states[0, 0, 2] == pytest.approx(0.05)  # a near target is reached in one step
    upper, lower = torch.tensor(TABLETOP_ARM.position_upper), torch.tensor(TABLETOP_ARM.position_lower)
    many = env.integrate_state(start, far.repeat(1, 20, 1))
    assert (many <= upper).all() and (many >= lower).all()
    assert many[0, -1, 0] == pytest.approx(upper[0]) and many[0, -1, 1] == pytest.approx(lower[1])


def test_bad_initial_frames_name_the_camera_and_shape():
    env = WorldModelEnv(tiny_world_model())
    starts = random_starts(2)
    starts.frames["front"] = torch.rand(2, 1, 3, 8, 8)
    with pytest.raises(ValueError, match=r"frames\['front'\].*16, 16"):
        env.reset(starts)
    starts.frames = {"wrist": torch.rand(2, 1, 3, 16, 16)}
    with pytest.raises(KeyError, match="front"):
        env.reset(starts)


@pytest.mark.slow  # lerobot writes and opens a dataset: ~13 s on the shared 2-core machine
def test_reset_from_dataset_episodes(tmp_path, tiny_lerobot_dataset):
    root = tiny_lerobot_dataset(tmp_path, episodes=3, length=3, image_size=(IMAGE_SIZE, IMAGE_SIZE))
    dataset = EpisodeDataset(DatasetConfig(root=str(root), cameras=["front"]))
    starts = from_dataset(dataset, [2, 0], ("front",), context=2)
    # conftest's pattern: channel 0 = frame index, channel 1 = episode, state = 100 * ep + frame + j / 10
    assert starts.frames["front"].shape == (2, 2, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert starts.frames["front"][:, :, 1, 0, 0].tolist() == [[2, 2], [0, 0]]
    assert starts.frames["front"][0, :, 0, 0, 0].tolist() == [0, 1]
    torch.testing.assert_close(starts.state[0], torch.tensor([201.0, 201.1, 201.2, 201.3]))
    torch.testing.assert_close(starts.actions[0, 0], torch.tensor([200.5, 200.6, 200.7, 200.8]))
    assert starts.task == ["task 0", "task 0"]
    env = WorldModelEnv(tiny_world_model())
    obs = env.reset(starts, seed=0)
    assert obs[image_key("front")][0, 1].max() == pytest.approx(2 / 255)  # episode 2's last context frame
    obs, *_ = env.step(torch.zeros(2, 2, 4))
    assert obs[image_key("front")].shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)


def test_reset_from_sim_frames():
    from worldloop.sim.tabletop_env import TabletopEnv

    sim_env = TabletopEnv(task="reach", image_size=IMAGE_SIZE, cameras=("front",))
    try:
        starts = initial_states.from_sim_resets(sim_env, [0, 1], ("front",))
        obs0, info0 = sim_env.reset(seed=0)
    finally:
        sim_env.close()
    assert starts.frames["front"].dtype == torch.uint8 and starts.frames["front"].shape == (2, 1, 3, 16, 16)
    assert np.array_equal(starts.frames["front"][0, 0].permute(1, 2, 0).numpy(), obs0[image_key("front")])
    assert starts.task[0] == info0["task"] and starts.actions.shape == (2, 0, 4)
    env = WorldModelEnv(tiny_world_model())
    obs = env.reset(starts, seed=0)
    torch.testing.assert_close(obs[STATE][0], torch.from_numpy(obs0[STATE]))
    obs, reward, *_ = env.step(torch.from_numpy(obs0[STATE])[None, None].repeat(2, 2, 1))
    assert torch.isfinite(reward).all()


def _spy_on_heads(monkeypatch, wm) -> list[dict]:
    """The inputs of every call of `wm`'s outcome heads, recorded as they pass."""
    seen = []
    heads_forward = wm.heads.forward

    def spy(frames, task=None, state=None, first=None):
        seen.append({"state": state, "first": first})
        return heads_forward(frames, task, state, first)

    monkeypatch.setattr(wm.heads, "forward", spy)
    return seen


def test_heads_read_the_integrated_state(monkeypatch):
    wm = tiny_world_model(heads_use_state=True)
    seen = _spy_on_heads(monkeypatch, wm)
    env = WorldModelEnv(wm)
    env.reset(random_starts(2), seed=0)
    _, _, _, _, info = env.step(torch.rand(2, 3, 4))
    assert len(seen) == 3
    for k, call in enumerate(seen):
        torch.testing.assert_close(call["state"], wm.normalize_state(info["state"][:, k]))


def test_heads_read_the_reset_frame_at_every_step(monkeypatch):
    # Heads with use_first_frame judge every imagined frame against the real frame the episode started
    # from, also once the context holds only generated frames.
    wm = tiny_world_model(heads_use_state=True, heads_use_first_frame=True, context_frames=2)
    seen = _spy_on_heads(monkeypatch, wm)
    starts = random_starts(2, context=2)
    env = WorldModelEnv(wm)
    env.reset(starts, seed=0)
    for _ in range(2):
        env.step(torch.rand(2, 3, 4))
    assert len(seen) == 6
    reset_frame = wm.frames_in(starts.frames["front"][:, 0].unsqueeze(1))
    for call in seen:
        torch.testing.assert_close(call["first"], reset_frame)


def test_success_prob_under_the_own_instruction_is_the_step_s_and_differs_under_another():
    wm = tiny_world_model(heads_use_state=True, heads_use_first_frame=True)
    env = WorldModelEnv(wm)
    starts = random_starts(2)
    env.reset(starts, seed=0)
    _, _, _, _, info = env.step(torch.rand(2, 3, 4))
    torch.testing.assert_close(env.success_prob(info, starts.task), info["success_prob"])
    other = env.success_prob(info, ["reach the green cube"] * 2)
    assert other.shape == (2, 3) and not torch.allclose(other, info["success_prob"])
    with pytest.raises(ValueError, match="1 instructions for 2 episodes"):
        env.success_prob(info, ["reach the green cube"])


def test_observe_first_frame_holds_the_start_frame_while_the_model_draws_on():
    wm, starts = tiny_world_model(), random_starts(2, context=2)
    drawn = WorldModelEnv(wm, WorldModelEnvConfig(horizon=6, observe="drawn"))
    held = WorldModelEnv(wm, WorldModelEnvConfig(horizon=6, observe="first_frame"))
    start = starts.frames["front"][:, -1].float()
    start = start / 255 if starts.frames["front"].dtype == torch.uint8 else start
    chunk = torch.full((2, 3, 4), 0.2)
    for env in (drawn, held):
        assert torch.equal(env.reset(starts, seed=3)[image_key("front")], start)
    for _ in range(2):
        obs_d, _, _, _, info_d = drawn.step(chunk)
        obs_h, _, _, _, info_h = held.step(chunk)
        # The policy sees the start frame; the frames drawn (and judged) are the same as with observe=drawn.
        assert torch.equal(obs_h[image_key("front")], start)
        assert torch.equal(obs_d[image_key("front")], info_d["frames"]["front"][:, -1])
        assert torch.equal(info_h["frames"]["front"], info_d["frames"]["front"])
        assert torch.equal(info_h["success_prob"], info_d["success_prob"])
        assert not torch.equal(obs_d[image_key("front")], start)
    assert held.judge()["observe"] == "first_frame"
    with pytest.raises(ValueError, match="observe='video'"):
        WorldModelEnv(wm, WorldModelEnvConfig(observe="video"))


@pytest.mark.parametrize(
    "first_frame, frame, kind",
    [(False, True, "drawn_frames"), (True, True, "drawn_and_first_frame"), (True, False, "kinematic")],
)
def test_judge_configured_for_frames_never_reads_the_first_frame(first_frame, frame, kind):
    wm = tiny_world_model(heads_use_first_frame=first_frame, heads_use_frame=frame)
    env = WorldModelEnv(wm, WorldModelEnvConfig(horizon=4))
    judge = env.judge()
    assert judge["kind"] == kind and judge["reads_drawn_frame"] is frame
    assert judge["reads_first_frame"] is first_frame and judge["success_threshold"] > 0
    env.reset(random_starts(2), seed=0)
    # Poison the first-frame path after reset: a judge that reads it returns NaN, one that does not is unmoved.
    env._first = torch.full_like(env._first, float("nan"))
    _, reward, _, _, info = env.step(torch.full((2, 3, 4), 0.1))
    assert bool(torch.isnan(info["success_prob"]).any()) is first_frame
    assert bool(torch.isnan(reward).any()) is first_frame
