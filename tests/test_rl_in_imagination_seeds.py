"""benchmarks/rl_in_imagination.py --seeds: one fine-tuning run per seed, reproducible per seed, different
across seeds, summarised as a mean gain with its interval and every seed's gain."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import pytest
import yaml
from imagination_fixtures import tiny_policy, tiny_world_model
from safetensors.torch import load_file

import benchmarks._common
from benchmarks import rl_in_imagination
from worldloop.common.checkpoint import save_json
from worldloop.common.config import parse_cli
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, finished_run

FINETUNE = {
    "iterations": 2,
    "env": {"horizon": 4},
    "algorithm": {"type": "grpo", "group_size": 2, "starts_per_iteration": 2, "epochs": 1, "minibatch_size": 8, "lr": 1e-2},
    "starts": {"source": "sim", "count": 3, "seed": 0},
    "eval": {"every": 2, "episodes": 2, "seed": 100, "batch_envs": 2, "max_gap": 1.0,
             "sim": {"task": "reach", "max_steps": 4, "batch_envs": 2, "videos": 0}},
}  # fmt: skip


def _run(tmp_path, monkeypatch, name: str, seeds: str, observe: str = "drawn", jobs: int = 1) -> dict:
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    argv = [
        "rl_in_imagination.py",
        f"--finetune_config={tmp_path / 'ft.yaml'}",
        f"--policy={tmp_path / 'policy'}",
        f"--world_model={tmp_path / 'wm'}",
        f"--output_dir={tmp_path / name}",
        f"--seeds={seeds}",
        f"--observe={observe}",
        "--final_episodes=2",
        f"--jobs={jobs}",
        f"--result_name={name}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    rl_in_imagination.main()
    return json.loads((tmp_path / "results" / f"{name}.json").read_text())["figures"]


@pytest.mark.slow  # six 2-iteration fine-tuning runs with sim evaluations: ~60 s
def test_seeds_are_reproducible_and_different(tmp_path, monkeypatch):
    (tmp_path / "ft.yaml").write_text(yaml.safe_dump(FINETUNE))
    tiny_world_model().save_pretrained(tmp_path / "wm")
    tiny_policy().save_pretrained(tmp_path / "policy")
    two = _run(tmp_path, monkeypatch, "two", "[0,1]")
    parallel = _run(tmp_path, monkeypatch, "parallel", "[0,1]", jobs=2)  # the seeds in two processes
    again = _run(tmp_path, monkeypatch, "again", "[0]", observe="first_frame")
    assert two["seeds"] == [0, 1] and [s["seed"] for s in two["per_seed"]] == [0, 1]
    gains = [s["gain_points"] for s in two["per_seed"]]
    assert two["gain_points"] == pytest.approx(sum(gains) / 2)
    low, high = two["gain_points_ci95"]
    assert low <= two["gain_points"] <= high and two["every_seed_positive"] == all(g > 0 for g in gains)
    assert all(s["train_sim_steps"] == 0 for s in two["per_seed"])
    assert two["observe"] == "drawn" and again["observe"] == "first_frame"

    def weights(name, seed):
        return load_file(tmp_path / name / f"seed_{seed}" / "pretrained_model" / "model.safetensors")

    seed0, seed1 = weights("two", 0), weights("two", 1)
    assert any(not seed0[k].equal(seed1[k]) for k in seed0)  # another seed, another run
    # The same seed and observation mode again: the same weights and evaluations. Another observation mode
    # (the start frame held) changes what the policy acts on, so its weights differ.
    drawn_again = _run(tmp_path, monkeypatch, "drawn_again", "[0]")
    assert all(seed0[k].equal(v) for k, v in weights("drawn_again", 0).items())
    assert any(not seed0[k].equal(v) for k, v in weights("again", 0).items())
    assert drawn_again["per_seed"][0]["in_loop_evaluations"] == two["per_seed"][0]["in_loop_evaluations"]
    # Run side by side, each seed gives what it gives alone.
    for seed in (0, 1):
        alone = weights("two", seed)
        assert all(alone[k].equal(v) for k, v in weights("parallel", seed).items())
    assert [s["gain_points"] for s in parallel["per_seed"]] == gains


def test_a_finished_run_of_the_same_config_is_reused_and_no_other(tmp_path):
    """An interrupted --seeds benchmark run again reuses the seeds that finished: their summary records the same
    config and their weights are written. Another config (seed), or no weights, trains again."""
    args = ["--config", "configs/finetune/tiny.yaml", "--policy.path=p", "--world_model=w"]
    cfg = parse_cli(FinetunePolicyConfig, [*args, f"--output_dir={tmp_path}"])
    assert finished_run(cfg) is None
    save_json({"config": asdict(cfg), "iterations_run": 15}, tmp_path / "summary.json")
    assert finished_run(cfg) is None  # the weights are written last: without them the run did not finish
    (tmp_path / "pretrained_model").mkdir()
    (tmp_path / "pretrained_model" / "model.safetensors").write_bytes(b"")
    assert finished_run(cfg)["iterations_run"] == 15
    other = parse_cli(FinetunePolicyConfig, [*args, f"--output_dir={tmp_path}", "--seed=1"])
    assert finished_run(other) is None


def test_a_finished_lerobot_env_run_is_reused_though_its_max_steps_default_was_filled(tmp_path):
    """With the lerobot_env backend, `eval.env.max_steps` 0 means the imagination horizon. The finished run
    recorded the filled value; a fresh config that leaves it 0 is the same run, and a different explicit value is
    not."""
    args = ["--config", "configs/finetune/tiny.yaml", "--policy.path=p", "--world_model=w",
            "--eval.backend=lerobot_env", "--starts.source=lerobot_env", f"--output_dir={tmp_path}"]  # fmt: skip
    ran = parse_cli(FinetunePolicyConfig, args)
    ran.validate()  # as finetune() does before it records its config
    assert ran.eval.env.max_steps == ran.env.horizon > 0
    save_json({"config": asdict(ran), "iterations_run": 3}, tmp_path / "summary.json")
    (tmp_path / "pretrained_model").mkdir()
    (tmp_path / "pretrained_model" / "model.safetensors").write_bytes(b"")
    assert finished_run(parse_cli(FinetunePolicyConfig, args))["iterations_run"] == 3
    longer = parse_cli(FinetunePolicyConfig, [*args, f"--eval.env.max_steps={ran.env.horizon + 1}"])
    assert finished_run(longer) is None
