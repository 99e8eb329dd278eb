"""Policy RL's algorithm is one registered config choice: `--algorithm.type=<name>` selects its config class
(with its own fields and defaults) and the trainer built from it; anything else is a ConfigError that says
what to write instead."""

from __future__ import annotations

import pytest
from imagination_fixtures import tiny_policy, tiny_world_model

from worldloop.common.config import ConfigError, parse_cli
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, PolicyPath, make_trainer
from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.rl_finetune.policy_rl.grpo.grpo import GRPOTrainer
from worldloop.rl_finetune.policy_rl.nft.configuration_nft import PolicyNFTConfig
from worldloop.rl_finetune.policy_rl.nft.nft import PolicyNFTTrainer
from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig
from worldloop.rl_finetune.policy_rl.ppo.ppo import PPOTrainer
from worldloop.world_model.world_model_env import WorldModelEnv

TINY = "configs/finetune/tiny.yaml"


def test_default_is_grpo_with_the_tiny_configs_shared_fields():
    assert type(FinetunePolicyConfig().algorithm) is GRPOConfig
    cfg = parse_cli(FinetunePolicyConfig, ["--config", TINY])
    assert cfg.algorithm.type == "grpo"
    assert (cfg.algorithm.minibatch_size, cfg.algorithm.lr, cfg.algorithm.group_size) == (64, 3e-5, 8)


def test_nft_is_selected_with_its_own_fields_and_keeps_the_files_shared_ones():
    cfg = parse_cli(
        FinetunePolicyConfig,
        ["--config", TINY, "--algorithm.type=nft", "--algorithm.lr=1e-4", "--algorithm.hindsight=true"],
    )
    assert type(cfg.algorithm) is PolicyNFTConfig and cfg.algorithm.type == "nft"
    assert (cfg.algorithm.lr, cfg.algorithm.hindsight, cfg.algorithm.minibatch_size) == (1e-4, True, 64)
    assert (cfg.algorithm.beta, cfg.algorithm.reference_weight, cfg.algorithm.old_decay) == (1.0, 0.1, 0.5)


def test_ppo_from_the_command_line_alone_has_ppos_defaults():
    cfg = parse_cli(FinetunePolicyConfig, ["--algorithm.type=ppo", "--algorithm.gamma=0.9"])
    assert type(cfg.algorithm) is PPOConfig
    assert (cfg.algorithm.starts_per_iteration, cfg.algorithm.epochs, cfg.algorithm.gamma) == (16, 4, 0.9)


def test_unknown_type_names_the_choices():
    with pytest.raises(ConfigError, match=r"'foo'.*grpo.*nft.*ppo"):
        parse_cli(FinetunePolicyConfig, ["--algorithm.type=foo"])


def test_a_field_of_another_algorithm_is_an_error():
    with pytest.raises(ConfigError, match="beta"):
        parse_cli(FinetunePolicyConfig, ["--algorithm.type=grpo", "--algorithm.beta=0.5"])


@pytest.mark.parametrize(
    "args, match",
    [
        (["--algorithm=nft"], r"--algorithm is a choice: select it with --algorithm.type="),
        (["--nft.lr=1e-4"], r"unknown option --nft.lr"),
    ],
)
def test_old_command_line_spellings_are_clear_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        parse_cli(FinetunePolicyConfig, args)


@pytest.mark.parametrize(
    "text, match",
    [
        ("algorithm: nft\n", r"old\.yaml: algorithm='nft': algorithm is a choice.*grpo, nft, ppo"),
        ("nft:\n  beta: 0.5\n", r"old\.yaml: unknown key 'nft'"),
        ("algorithm:\n  type: sac\n", r"old\.yaml: algorithm\.type='sac' is not one of grpo, nft, ppo"),
    ],
)
def test_old_yaml_layouts_are_clear_errors(tmp_path, text, match):
    path = tmp_path / "old.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        parse_cli(FinetunePolicyConfig, ["--config", str(path)])


@pytest.mark.parametrize(
    "algorithm, trainer_class",
    [
        (GRPOConfig(group_size=2, starts_per_iteration=1), GRPOTrainer),
        (PPOConfig(starts_per_iteration=1, rollouts_per_start=1), PPOTrainer),
        (PolicyNFTConfig(group_size=2, starts_per_iteration=1), PolicyNFTTrainer),
    ],
)
def test_the_trainer_built_matches_the_chosen_type(algorithm, trainer_class):
    cfg = FinetunePolicyConfig(policy=PolicyPath("p"), world_model="w", algorithm=algorithm)
    trainer = make_trainer(cfg, tiny_policy(), WorldModelEnv(tiny_world_model()))
    assert type(trainer) is trainer_class and trainer.cfg is algorithm
