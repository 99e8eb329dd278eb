"""Within-start figures of imagination (rl_finetune/imagination/rollout_groups.py, benchmarks/imagination_groups.py):
known inputs, then tiny random models end to end."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from imagination_fixtures import IMAGE_SIZE, random_starts, tiny_policy, tiny_world_model

import benchmarks._common
from benchmarks import imagination_groups
from worldloop.rl_finetune.imagination.initial_states import sim_starts
from worldloop.rl_finetune.imagination.rollout_groups import (
    SCORES,
    GroupSettings,
    best_of_k_curve,
    group_figures,
    imagine_groups,
    judged_sim_groups,
    paired_difference,
    reading_response,
    replayed_sim_groups,
)
from worldloop.rl_finetune.policy_rl.sim_rollouts import SimRolloutEnv
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig


def episodes_of(scores_by_start: list[list[float]]) -> list[dict]:
    """Episodes whose every score is the given one, in start order."""
    return [
        {"start": s, **{name: score for name in SCORES}}
        for s, scores in enumerate(scores_by_start)
        for score in scores
    ]


def test_group_figures_compare_rollouts_of_one_start_only():
    # Start 0: the sim success scores 0.9, its failures 0.5 and 0.1 (ordered right). Start 1: the success
    # scores 0.2 under a failure at 0.3 (ordered wrong). Start 2: all fail, scored high: pooled this start
    # pulls the AUROC down, within starts it does not count.
    episodes = episodes_of([[0.9, 0.5, 0.1], [0.2, 0.3, 0.0], [0.95, 0.96, 0.97]])
    success = [True, False, False, True, False, False, False, False, False]
    figures = group_figures(episodes, success, n_boot=200)
    assert figures["starts"] == 3 and figures["group_size"] == 3
    assert figures["base"] == pytest.approx(2 / 9)
    assert figures["oracle"] == pytest.approx(2 / 3)
    assert figures["mixed_starts"] == pytest.approx(2 / 3)
    for name in SCORES:
        score = figures["scores"][name]
        within = score["within_start_auroc"]
        # pairs: start 0 (0.9 > 0.5, 0.9 > 0.1) 2 wins; start 1 (0.2 > 0.3 no, 0.2 > 0.0 yes) 1 win: 3 of 4
        assert within["value"] == pytest.approx(0.75) and within["pairs"] == 4 and within["mixed_groups"] == 2
        assert within["low"] <= within["value"] <= within["high"]
        # the top-scored rollout: start 0 its success, start 1 a failure, start 2 a failure
        assert score["best_of_k"] == pytest.approx(1 / 3)
        assert score["best_of_k_minus_base"]["value"] == pytest.approx(1 / 3 - 2 / 9)
        assert score["pooled_auroc"] < within["value"]
        # best of K for K = 1..3: the base rate at 1, the top-scored rollout at 3
        assert score["best_of_k_curve"][0] == pytest.approx(2 / 9)
        assert score["best_of_k_curve"][-1] == pytest.approx(score["best_of_k"])
    assert figures["oracle_curve"] == pytest.approx([2 / 9, (2 / 3 + 2 / 3) / 3, 2 / 3])


def test_paired_difference_compares_two_readings_of_the_same_rollouts():
    success = [True, False, False, True, False, False, False, False, False]
    # theirs orders start 0 right and start 1 wrong (0.75, as above); ours orders both right (1.0)
    theirs = [
        {**e, "sim_success": y}
        for e, y in zip(episodes_of([[0.9, 0.5, 0.1], [0.2, 0.3, 0.0], [0.5] * 3]), success)
    ]
    ours = [
        {**e, "sim_success": y}
        for e, y in zip(episodes_of([[0.9, 0.5, 0.1], [0.4, 0.3, 0.0], [0.1] * 3]), success)
    ]
    diff = paired_difference(ours, theirs, SCORES, n_boot=200)
    for name in SCORES:
        assert diff[name]["value"] == pytest.approx(0.25)
        # a draw resamples the same starts for both: start 1 drawn gives +0.5 over its pairs, start 0 alone 0
        assert 0.0 <= diff[name]["low"] <= diff[name]["value"] <= diff[name]["high"] <= 0.5
    same = paired_difference(ours, ours, ["return"], n_boot=50)["return"]
    assert same["value"] == same["low"] == same["high"] == 0.0
    with pytest.raises(ValueError, match="episode 3 differs"):
        paired_difference(
            ours,
            [{**e, "sim_success": not e["sim_success"]} if i == 3 else e for i, e in enumerate(theirs)],
            SCORES,
        )
    with pytest.raises(ValueError, match="episode 0 differs"):  # another set of starts, the same indices
        paired_difference(
            [{**e, "start_seed": 10 + e["start"]} for e in ours],
            [{**e, "start_seed": 20 + e["start"]} for e in theirs],
            SCORES,
        )
    with pytest.raises(ValueError, match="9 episodes against 8"):
        paired_difference(ours, theirs[:8], SCORES)


def test_reading_response_is_the_within_start_slope_of_drawn_on_real():
    # start 0: real -2, 0, +2 about its mean, drawn half as far apart; start 1: drawn the opposite way round
    # but a third as far; an unseen drawn reading (-1e3) is left out with its real one
    real = [-8.0, -6.0, -4.0, -10.0, -9.0, -8.0, -5.0]
    drawn = [-7.0, -6.0, -5.0, -9.0 + 1 / 3, -9.0, -9.0 - 1 / 3, -1e3]
    episodes = [
        {"start": s, "reading_real": r, "reading_drawn": d}
        for s, r, d in zip([0, 0, 0, 1, 1, 1, 1], real, drawn)
    ]
    response = reading_response(episodes)
    # slope = sum(r d) / sum(r r) = (2 + 2 - 2/3) / (8 + 2)
    assert response["slope"] == pytest.approx((4 - 2 / 3) / 10)
    assert response["corr"] == pytest.approx((4 - 2 / 3) / np.sqrt(10 * (2 + 2 / 9)))
    assert response["episodes"] == 6
    same = reading_response([{**e, "reading_drawn": e["reading_real"]} for e in episodes])
    assert same["slope"] == pytest.approx(1.0) and same["corr"] == pytest.approx(1.0)


def test_best_of_k_curve_is_exact_over_the_subsets():
    # scores 0.9, 0.5, 0.1 with the sim success second: of the 3 pairs only {0.5, 0.1} picks it
    curve = best_of_k_curve(np.array([0.9, 0.5, 0.1]), np.array([False, True, False]), [np.arange(3)])
    assert curve["picked"] == pytest.approx([1 / 3, 1 / 3, 0.0])
    assert curve["oracle"] == pytest.approx([1 / 3, 2 / 3, 1.0])
    # ties go to the first rollout, as `best_of_k`'s argmax
    tied = best_of_k_curve(np.array([0.5, 0.5]), np.array([False, True]), [np.arange(2)])
    assert tied["picked"] == pytest.approx([0.5, 0.0])


def test_group_figures_refuse_ragged_groups_and_missing_verdicts():
    with pytest.raises(ValueError, match="same number of rollouts"):
        group_figures(episodes_of([[0.1, 0.2], [0.3]]), [True, False, True])
    with pytest.raises(ValueError, match="3 episodes but 2 sim verdicts"):
        group_figures(episodes_of([[0.1, 0.2, 0.3]]), [True, False])


def tiny_env(horizon: int = 4) -> WorldModelEnv:
    return WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=horizon))


def test_imagine_groups_orders_starts_and_pays_rls_return():
    env, policy, starts = tiny_env(), tiny_policy(), random_starts(3)
    episodes = imagine_groups(policy, env, starts, 5, GroupSettings(group_size=2, progress_reward=0.25))
    assert [e["start"] for e in episodes] == [0, 0, 1, 1, 2, 2]
    for e in episodes:
        assert e["return"] == pytest.approx(e["success"] + 0.25 * e["progress"])
    # the rollouts of one start differ (the policy's noise and the world model's draws) ...
    assert episodes[0]["actions"] != episodes[1]["actions"]
    # ... and the same seed draws them again
    again = imagine_groups(policy, env, starts, 5, GroupSettings(group_size=2, progress_reward=0.25))
    assert [e["actions"] for e in again] == [e["actions"] for e in episodes]
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        imagine_groups(policy, env, starts, 5, GroupSettings(group_size=1))


def test_judged_sim_groups_label_each_rollout_by_the_steps_the_judge_read():
    policy, wm = tiny_policy(), tiny_world_model()
    sim_cfg = SimEvalConfig(task="reach", max_steps=4, batch_envs=4, videos=0)
    episodes, labels = judged_sim_groups(
        policy, wm, 0.5, sim_cfg, [100, 101], 3, GroupSettings(group_size=2, progress_reward=0.25)
    )
    assert [e["start"] for e in episodes] == [0, 0, 1, 1]
    assert [e["seed"] for e in episodes] == [100, 100, 101, 101]  # a start's rollouts share its reset
    assert labels == [e["sim_success_judged"] for e in episodes]
    for e in episodes:
        assert e["return"] == pytest.approx(e["success"] + 0.25 * e["progress"])
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        judged_sim_groups(policy, wm, 0.5, sim_cfg, [100], 3, GroupSettings(group_size=1))


def test_replayed_sim_groups_replay_the_sims_actions_and_read_both_frames():
    policy, wm = tiny_policy(), tiny_world_model()
    env = WorldModelEnv(wm, WorldModelEnvConfig(horizon=4, terminate_on_success=False))
    sim_cfg = SimEvalConfig(task="reach", max_steps=4, videos=0)
    starts = sim_starts(env, sim_cfg, 2, 100)
    sim_env = SimRolloutEnv(sim_cfg, env.config, env.cameras, IMAGE_SIZE)
    seen = []

    def brightness(frames, task):  # [B, T, 3, H, W] -> [B, T]: a reading that knows nothing of the task
        seen.append(frames.shape[:2])
        return frames.float().mean((2, 3, 4))

    episodes, labels = replayed_sim_groups(
        policy, env, sim_env, starts, 0, GroupSettings(group_size=2), brightness
    )
    sim_env.close()
    assert [e["start"] for e in episodes] == [0, 0, 1, 1] and len(labels) == 4
    assert all(isinstance(y, bool) for y in labels)
    for e in episodes:
        assert e["return"] == pytest.approx(e["success"] + 0.5 * e["progress"])
        assert e["reading_real"] <= 0 and e["reading_drawn"] <= 0  # minus a least brightness
    # the sim's frame at each of the 2 chunks' ends, then the 4 drawn steps of the replay
    assert seen[:2] == [(4, 1), (4, 1)] and seen[2][0] == 4
    again, _ = replayed_sim_groups(
        policy,
        env,
        SimRolloutEnv(sim_cfg, env.config, env.cameras, IMAGE_SIZE),
        starts,
        0,
        GroupSettings(group_size=2),
    )
    assert [e["max_success_prob"] for e in again] == [e["max_success_prob"] for e in episodes]
    assert "reading_real" not in again[0]


@pytest.mark.slow  # imagination plus the sim's replays of 8 episodes, four times, and the sim twice: ~15 s
def test_benchmark_runs_each_observe_mode_and_names_the_judge(tmp_path, monkeypatch):
    tiny_world_model().save_pretrained(tmp_path / "wm")
    tiny_policy().save_pretrained(tmp_path / "policy")
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "imagination_groups.py",
            f"--world_model={tmp_path / 'wm'}",
            f"--policy={tmp_path / 'policy'}",
            "--task=reach",
            "--starts=2",
            "--group_size=2",
            "--horizon=4",
            "--observe=[drawn,first_frame,sim,replay]",
            "--seeds=[3,4]",
            f"--output_dir={tmp_path / 'out'}",
            "--name=groups_smoke",
        ],
    )
    imagination_groups.main()
    result = json.loads((tmp_path / "results" / "groups_smoke.json").read_text())
    runs = result["figures"]["runs"]
    assert [(r["observe"], r["seed"]) for r in runs] == [
        ("drawn", 3), ("drawn", 4), ("first_frame", 3), ("first_frame", 4), ("sim", 3), ("sim", 4),
        ("replay", 3), ("replay", 4),
    ]  # fmt: skip
    for run in runs:
        assert run["judge"]["observe"] == run["observe"] and "success_threshold" in run["judge"]
        assert run["starts"] == 2 and run["group_size"] == 2 and set(run["scores"]) == set(SCORES)
        if run["observe"] in ("drawn", "first_frame"):  # the imagined actions replayed in the sim
            assert 0 < run["sim_steps"] <= 2 * 2 * 4
    mean = result["figures"]["mean"]["drawn"]
    assert mean["seeds"] == [3, 4] and mean["base"]["n"] == 2
    assert mean["base"]["mean"] == pytest.approx((runs[0]["base"] + runs[1]["base"]) / 2)
    assert (tmp_path / "out" / "best_of_k.png").stat().st_size > 0
    rows = json.loads((tmp_path / "out" / "episodes_sim_seed4.json").read_text())
    assert [(r["start"], r["start_seed"]) for r in rows] == [(0, 4), (0, 4), (1, 5), (1, 5)]
    assert set(rows[0]) == {"start", "start_seed", "sim_success", *SCORES}
    drawn = json.loads((tmp_path / "out" / "episodes_drawn_seed3.json").read_text())
    assert sum(r["sim_success"] for r in drawn) / len(drawn) == pytest.approx(runs[0]["base"])
    # the same rollouts read again, compared with the first run: each set's difference is 0 (or undefined)
    argv = [a for a in sys.argv if not a.startswith(("--observe", "--output_dir", "--name"))]
    monkeypatch.setattr(
        sys,
        "argv",
        [*argv, "--observe=[replay]", f"--output_dir={tmp_path / 'again'}", "--name=groups_again",
         f"--compare_to={tmp_path / 'out'}"],
    )  # fmt: skip
    imagination_groups.main()
    again = json.loads((tmp_path / "results" / "groups_again.json").read_text())["figures"]
    for run in again["runs"]:
        assert run["compared"]["to"] == str(tmp_path / "out" / f"episodes_replay_seed{run['seed']}.json")
        assert all(d["value"] == 0 or np.isnan(d["value"]) for d in run["compared"]["scores"].values())
    assert set(again["mean"]["replay"]["difference"]) == set(SCORES)
    monkeypatch.setattr(sys, "argv", [*argv, "--observe=[sim]", f"--output_dir={tmp_path / 'third'}",
                                      "--seeds=[5]", f"--compare_to={tmp_path / 'out'}"])  # fmt: skip
    with pytest.raises(SystemExit, match="no episodes_sim_seed5.json"):
        imagination_groups.main()
    monkeypatch.setattr(
        sys, "argv", ["imagination_groups.py", "--world_model=x", "--policy=y", "--observe=[real]"]
    )
    with pytest.raises(SystemExit, match="drawn, first_frame, sim or replay"):
        imagination_groups.main()
