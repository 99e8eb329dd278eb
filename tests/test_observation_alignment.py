"""Drawn/real observation pairs from open-loop replays of recorded episodes, and the alignment loss NFT adds
with them: the pairs are the recorded frames next to what the world model drew, the loss is zero for
identical readings, and updates with it bring the policy's two readings together."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from imagination_fixtures import IMAGE_SIZE, tiny_policy, tiny_world_model
from rl_fixtures import make_trainer

from data.dataset import DatasetConfig, EpisodeDataset
from data.features import STATE, TASK, image_key
from data.recording import RecordingConfig, record_demos
from rl_finetune.observation_alignment import ObservationAlignmentConfig, alignment_loss, paired_observations
from rl_finetune.policy_nft import PolicyNFTConfig, PolicyNFTTrainer
from world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig, from_dataset

FRONT = image_key("front")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("align") / "data"
    record_demos(
        RecordingConfig(root=str(root), task="reach", episodes=20, skill_range=[0.0, 1.0], image_size=IMAGE_SIZE,
                        cameras=["front"], max_steps=7, terminate_on_success=False, image_writer_threads=0)
    )  # fmt: skip
    return root


def test_pairs_are_the_recorded_frames_next_to_the_open_loop_replay(recorded):
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=50))
    cfg = ObservationAlignmentConfig(weight=1.0, dataset_root=str(recorded), episodes=2, every=2, seed=3)
    pairs = paired_observations(env, cfg)
    dataset = EpisodeDataset(
        DatasetConfig(root=str(recorded), cameras=["front"], image_size=[IMAGE_SIZE] * 2)
    )
    held_out = dataset.split()[1]  # the 2 of 20 that world-model training keeps out
    assert len(held_out) == 2 and len(pairs) == 2 * 3  # after steps 2, 4 and 6 of 7 frames
    table, (a, b) = dataset.frame_table(), dataset.select_episodes(held_out)
    rows = torch.tensor([a.start + 2, b.start + 2, a.start + 4, b.start + 4, a.start + 6, b.start + 6])
    torch.testing.assert_close(pairs.real[FRONT], table.images["front"][rows].float() / 255)
    torch.testing.assert_close(pairs.real[STATE], table.state[rows])
    assert pairs.real[TASK] == pairs.imagined[TASK] == [table.task[int(r)] for r in rows]
    # the imagined half is the world model's replay of the recorded actions, seeded
    replay = WorldModelEnv(env.world_model, WorldModelEnvConfig(horizon=6, terminate_on_success=False))
    replay.reset(from_dataset(dataset, held_out, ("front",)), seed=3)
    starts = torch.tensor([a.start, b.start])
    for k, t in enumerate((2, 4, 6)):
        obs, *_ = replay.step(torch.stack([table.action[starts + s] for s in range(t - 2, t)], 1))
        torch.testing.assert_close(pairs.imagined[FRONT][2 * k : 2 * k + 2], obs[FRONT])
        torch.testing.assert_close(pairs.imagined[STATE][2 * k : 2 * k + 2], obs[STATE])
    assert not torch.allclose(pairs.imagined[FRONT], pairs.real[FRONT])  # a random world model draws badly
    with pytest.raises(ValueError, match="shortest episode"):
        paired_observations(env, dataclasses.replace(cfg, every=7))


def test_alignment_loss_is_zero_for_the_same_reading_and_nft_updates_reduce_it(recorded):
    policy = tiny_policy()
    real = {
        FRONT: torch.rand(4, 3, IMAGE_SIZE, IMAGE_SIZE),
        STATE: torch.rand(4, 4),
        TASK: ["reach the red cube"] * 4,
    }
    assert alignment_loss(policy, real, real).item() < 1e-10
    assert alignment_loss(policy, real, {**real, FRONT: torch.rand(4, 3, IMAGE_SIZE, IMAGE_SIZE)}).item() > 0

    cfg = PolicyNFTConfig(group_size=4, starts_per_iteration=2, epochs=1, minibatch_size=16, lr=1e-3)
    trainer = make_trainer(PolicyNFTTrainer, cfg, horizon=4)
    align = ObservationAlignmentConfig(weight=10.0, dataset_root=str(recorded), every=2, batch_size=8)
    pairs = paired_observations(trainer.env, align)
    trainer.align(pairs, align)
    every_pair = torch.arange(len(pairs))
    first = alignment_loss(trainer.policy, *pairs.batch(every_pair)).item()
    from imagination_fixtures import random_starts

    data = trainer.collect(random_starts(2), seed=0)
    for k in range(5):
        logs = trainer.update(data, seed=k)
    assert logs["align/loss"] > 0
    assert alignment_loss(trainer.policy, *pairs.batch(every_pair)).item() < 0.8 * first


def test_config_is_checked():
    from rl_finetune.policy_finetune import FinetunePolicyConfig, PolicyPath

    with pytest.raises(ValueError, match="align.dataset_root"):
        ObservationAlignmentConfig(weight=1.0).validate()
    cfg = FinetunePolicyConfig(
        policy=PolicyPath("p"),
        world_model="w",
        align=ObservationAlignmentConfig(weight=1.0, dataset_root="d"),
    )
    with pytest.raises(ValueError, match="algorithm=nft"):
        cfg.validate()
