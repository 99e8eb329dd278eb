"""`--rollouts=sim`: policy RL trained on the simulator's own episodes (the recipe's ceiling), behind the batched
interface imagination offers, from the same reset seeds; its training sim steps are reported, never hidden."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from imagination_fixtures import IMAGE_SIZE, random_starts, tiny_policy, tiny_world_model

from worldloop.data.features import STATE, image_key
from worldloop.rl_finetune.imagination import initial_states
from worldloop.rl_finetune.policy_rl.finetune import (
    FinetuneEvalConfig,
    FinetunePolicyConfig,
    PolicyPath,
    StartsConfig,
    finetune,
)
from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.rl_finetune.policy_rl.sim_rollouts import SimRolloutEnv
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig

SIM = SimEvalConfig(task="reach", max_steps=4, batch_envs=2, videos=0)


def _sim_starts(seeds: list[int]):
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=4))
    return initial_states.sim_starts(env, SIM, len(seeds), seeds[0])


def test_starts_from_sim_resets_carry_their_seeds_through_select_and_repeat():
    starts = _sim_starts([7, 8, 9])
    assert starts.seeds == [7, 8, 9]
    assert starts.select([2, 0]).seeds == [9, 7]
    assert starts.repeat(2).seeds == [7, 7, 8, 8, 9, 9]
    assert random_starts(2).seeds is None and random_starts(2).repeat(2).seeds is None


def test_episodes_are_the_simulators_own_from_the_starts_seeds():
    from worldloop.sim.tabletop_env import TabletopEnv

    starts = _sim_starts([3, 4])
    env = SimRolloutEnv(SIM, WorldModelEnvConfig(horizon=4), ("front",), IMAGE_SIZE)
    reference = TabletopEnv(task="reach", image_size=IMAGE_SIZE, cameras=("front",), max_steps=4)
    try:
        obs = env.reset(starts.repeat(2))  # two rollouts of each start, as a GRPO group
        first, info = reference.reset(seed=4)
        # the policy sees the start frame imagination would start from, in the batch format
        assert obs[image_key("front")].shape == (4, 3, IMAGE_SIZE, IMAGE_SIZE)
        expected = torch.from_numpy(first[image_key("front")]).permute(2, 0, 1).float() / 255
        torch.testing.assert_close(obs[image_key("front")][2], expected)
        assert obs["task"][2] == info["task"]
        chunk = torch.from_numpy(first[STATE])[None, None].repeat(4, 3, 1) + 0.2
        obs, reward, terminated, truncated, info = env.step(chunk)
        for action in chunk[2].numpy():
            ref_obs, _, _, _, ref_info = reference.step(action)
        assert env.steps_taken == 3 and not truncated.any()
        np.testing.assert_allclose(obs[STATE][2].numpy(), ref_obs[STATE], atol=1e-6)
        assert env.progress[2].item() == pytest.approx(ref_info["progress"])
        torch.testing.assert_close(reward, info["progress"])  # progress gained from 0 at reset
        # the same seed and actions, the same physics
        torch.testing.assert_close(obs[STATE][2], obs[STATE][3])
        env.step(chunk)  # cut at the horizon: one step left
        assert env.steps_taken == 4 and env.done.all()
        with pytest.raises(RuntimeError, match="horizon"):
            env.step(chunk)
    finally:
        env.close()
        reference.close()


def test_starts_without_seeds_and_hindsight_are_refused():
    env = SimRolloutEnv(SIM, WorldModelEnvConfig(horizon=4), ("front",), IMAGE_SIZE)
    with pytest.raises(ValueError, match="starts.source=sim"):
        env.reset(random_starts(2))
    with pytest.raises(NotImplementedError, match="hindsight"):
        env.success_prob({}, [])
    with pytest.raises(ValueError, match="max_steps=4 differs from env.horizon=5"):
        SimRolloutEnv(SIM, WorldModelEnvConfig(horizon=5), ("front",), IMAGE_SIZE)


def _config(tmp_path, **overrides) -> FinetunePolicyConfig:
    wm, policy = tmp_path / "wm", tmp_path / "policy"
    tiny_world_model().save_pretrained(wm)
    tiny_policy().save_pretrained(policy)
    return FinetunePolicyConfig(
        policy=PolicyPath(str(policy)), world_model=str(wm), output_dir=str(tmp_path / "ft"),
        env=WorldModelEnvConfig(horizon=4), iterations=2,
        algorithm=GRPOConfig(group_size=2, starts_per_iteration=2, epochs=1, minibatch_size=8, lr=1e-3),
        starts=StartsConfig(count=3, seed=0),
        eval=FinetuneEvalConfig(every=2, episodes=2, seed=100, batch_envs=2, max_gap=1.0, sim=SIM),
        **overrides,
    )  # fmt: skip


def test_finetune_on_sim_rollouts_trains_and_reports_its_sim_steps(tmp_path):
    summary = finetune(_config(tmp_path, rollouts="sim"))
    assert summary["rollouts"] == "sim" and summary["iterations_run"] == 2
    # 2 iterations x 2 starts x 2 rollouts, each at most 4 steps (success ends an episode early)
    assert 0 < summary["train_sim_steps"] <= 2 * 2 * 2 * 4
    assert (tmp_path / "ft" / "pretrained_model" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"rollouts": "world"}, "rollouts='world'"),
        (
            {"rollouts": "sim", "starts": StartsConfig(source="dataset", dataset_root="x")},
            "starts.source=sim",
        ),
    ],
)
def test_bad_rollouts_settings_are_named(tmp_path, overrides, match):
    cfg = FinetunePolicyConfig(policy=PolicyPath("p"), world_model="w", **overrides)
    with pytest.raises(ValueError, match=match):
        cfg.validate()
