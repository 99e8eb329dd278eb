"""Policy evaluation in imagination, ranking against the simulator and fine-tuning, end to end on tiny
random models (16x16 frames, 4-step episodes)."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import torch
from imagination_fixtures import random_starts, tiny_policy, tiny_world_model

from worldloop.rl_finetune.imagination.evaluation import (
    ImaginationEvalConfig,
    evaluate_in_imagination,
    side_by_side,
)
from worldloop.rl_finetune.imagination.policy_ranking import (
    fold_cli_args,
    imagination_error_split,
    imagined_actions_in_sim,
    rank_policies,
    short_names,
)
from worldloop.rl_finetune.policy_rl.finetune import (
    FinetuneEvalConfig,
    FinetunePolicyConfig,
    PolicyPath,
    StartsConfig,
    finetune,
)
from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig

SIM = SimEvalConfig(task="reach", max_steps=4, batch_envs=2, videos=1)


def test_imagination_eval_is_seeded_and_summarised(tmp_path):
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=4))
    policy, starts = tiny_policy(), random_starts(5)
    a, clips = evaluate_in_imagination(
        policy, env, starts, seed=3, batch_envs=2, video_dir=tmp_path, videos=2
    )
    b, _ = evaluate_in_imagination(policy, env, starts, seed=3, batch_envs=2, progress_bar=False)
    assert a["per_episode"] == b["per_episode"]
    assert a["judge"] == env.judge() and a["judge"]["kind"] == "drawn_frames"
    assert a["episodes"] == 5 and a["successes"] == sum(r["success"] for r in a["per_episode"])
    lo, hi = a["success_ci95"]
    assert 0 <= lo <= a["success_rate"] <= hi <= 1
    assert all(r["length"] <= 4 and 0 <= r["progress"] <= 1 for r in a["per_episode"])
    for k, (r, start) in enumerate(zip(a["per_episode"], starts.state)):
        # the imagined joint path: the start state, then one per step until the episode's batch ended
        batch_mate = a["per_episode"][k ^ 1] if k ^ 1 < len(a["per_episode"]) else r  # batches of 2
        assert len(r["joint_states"]) == len(batch_mate["joint_states"])
        assert r["length"] + 1 <= len(r["joint_states"]) <= 4 + 1
        assert r["joint_states"][0] == pytest.approx(start.tolist())
        # the heads' verdict on each of those steps; the episode's best is its max_success_prob
        assert len(r["success_probs"]) == len(r["joint_states"]) - 1
        assert max(r["success_probs"][: r["length"]], default=0.0) == pytest.approx(r["max_success_prob"])
        # the joint targets each of those steps was imagined under
        assert np.asarray(r["actions"]).shape == (len(r["success_probs"]), starts.state.shape[1])
    assert len(clips) == 2 and clips[0][0].shape == (16, 16, 3) and clips[0][0].dtype == np.uint8
    assert len(clips[0]) == 1 + 4 or a["per_episode"][0]["success"]  # initial frame + one per step
    assert len(list((tmp_path / "videos").glob("imagined_*.mp4"))) == 2


def test_policy_cameras_must_be_drawn_by_the_world_model():
    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=2))
    with pytest.raises(ValueError, match="wrist"):
        evaluate_in_imagination(tiny_policy(cameras=("front", "wrist")), env, random_starts(2), seed=0)


def test_side_by_side_holds_the_shorter_clip():
    left = [np.zeros((4, 4, 3), np.uint8)] * 3
    right = [np.full((4, 6, 3), 9, np.uint8)] * 5
    out = side_by_side(left, right)
    assert len(out) == 5 and out[-1].shape == (4, 12, 3) and out[-1][0, 0, 0] == 0 and out[-1][0, -1, 0] == 9


def test_cli_spelling_of_rank_and_compare_sim():
    assert fold_cli_args(["--rank", "a", "b/c", "--compare-sim", "--episodes=3"]) == [
        "--rank=[a,b/c]",
        "--compare_sim=true",
        "--episodes=3",
    ]


@pytest.fixture
def saved_models(tmp_path):
    wm = tmp_path / "wm"
    tiny_world_model().save_pretrained(wm)
    policies = []
    for i in range(2):
        path = tmp_path / f"policy_{i}"
        tiny_policy(seed=i).save_pretrained(path)
        policies.append(str(path))
    return str(wm), policies


@pytest.mark.slow  # two policies x (imagination + sim) with videos and a plot: ~10 s on the shared machine
def test_rank_against_sim_from_the_same_starts(tmp_path, saved_models):
    wm, policies = saved_models
    cfg = ImaginationEvalConfig(world_model=wm, horizon=4, batch_envs=2, videos=1)
    result = rank_policies(policies, cfg, SIM, episodes=3, seed=100, output_dir=tmp_path / "rank")
    assert [r["policy"] for r in result["rows"]] == ["policy_0", "policy_1"]
    for row in result["rows"]:
        assert 0 <= row["imagined"] <= 1 and 0 <= row["sim"] <= 1
        assert row["gap"] == pytest.approx(row["imagined"] - row["sim"])
    assert set(result["ranking"]) >= {"pearson", "spearman", "mmrv"}
    for name, ci in result["ranking_ci95"].items():
        assert ci["value"] == pytest.approx(result["ranking"][name], nan_ok=True) and ci["n_boot"] == 2000
    assert result["judge"]["kind"] in ("drawn_frames", "drawn_and_first_frame", "kinematic")
    assert (tmp_path / "rank" / "imagined_vs_sim.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "rank" / "ranking.json").read_text())
    record = saved["policies"]["policy_0"]
    assert record["imagination"]["sim_steps"] == 0  # imagination never steps the physics
    assert record["sim"]["sim_steps"] == sum(e["length"] for e in record["sim"]["per_episode"]) > 0
    sim_seeds = [e["seed"] for e in record["sim"]["per_episode"]]
    assert sim_seeds == [100, 101, 102]
    assert [e["task"] for e in record["sim"]["per_episode"]] == [
        e["task"] for e in record["imagination"]["per_episode"]
    ]
    assert list((tmp_path / "rank" / "policy_0" / "videos").glob("sim_vs_imagined_*.mp4"))
    # what the sim can replay (record_demos.py --replay): each imagined episode's seed and actions
    replays = (tmp_path / "rank" / "policy_0" / "imagined_actions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in replays] == [
        {"seed": 100 + i, "actions": e["actions"]} for i, e in enumerate(record["imagination"]["per_episode"])
    ]
    # The imagined paths judged by the sim's reach rule, from the same resets.
    paths = [e["joint_states"] for e in record["imagination"]["per_episode"]]
    by_state = record["imagination"]["success_rate_by_state"]
    env = TabletopEnv(TabletopEnvConfig(task="reach", cameras=()))
    expected = []
    for i, path in enumerate(paths):
        env.reset(seed=100 + i)
        expected.append(env.success_along(np.asarray(path)))
    env.close()
    assert by_state == pytest.approx(np.mean(expected))
    assert result["rows"][0]["imagined_by_state"] == by_state
    # The same actions played in the sim; the split of the ranking's error is there with them.
    in_sim = record["imagination"]["actions_in_sim"]
    assert len(in_sim["per_episode"]) == 3 and result["rows"][0]["actions_in_sim"] == in_sim["success_rate"]
    assert in_sim["sim_steps"] <= sum(e["length"] for e in record["imagination"]["per_episode"])
    assert set(result["error_split"]) == {"actions_in_sim", "world_and_judge", "policy_on_drawn_frames"}


def _no_drift(policy, env, starts, cfg, device):
    return {"imagined_success": 0.3, "sim_success": 0.3, "gap": 0.0, "sim_steps": 0,
            "imagined_success_ci95": [0, 1], "sim_success_ci95": [0, 1], "imagined_progress": 0.0,
            "sim_progress": 0.0, "reference": "sim", "sim_episodes": 2, "disagreement": None}  # fmt: skip


def _finetune_config(policy, wm, output_dir, lr=1e-3, evaluation=None, **overrides) -> FinetunePolicyConfig:
    """The tiny GRPO fine-tune these tests run: 2 rollouts of 4 imagined steps from each of 2 starts an iteration,
    checked on 2 sim episodes after every iteration unless `evaluation` says otherwise."""
    evaluation = {"every": 1, "episodes": 2, "seed": 100, "batch_envs": 2, "sim": SIM, **(evaluation or {})}
    return FinetunePolicyConfig(
        policy=PolicyPath(policy), world_model=wm, output_dir=str(output_dir), env=WorldModelEnvConfig(horizon=4),
        algorithm=GRPOConfig(group_size=2, starts_per_iteration=2, epochs=1, minibatch_size=8, lr=lr),
        starts=StartsConfig(count=3, seed=0), eval=FinetuneEvalConfig(**evaluation), **overrides,
    )  # fmt: skip


def test_finetune_end_to_end_uses_no_sim_steps_for_training(tmp_path, saved_models):
    wm, policies = saved_models
    cfg = _finetune_config(
        policies[0], wm, tmp_path / "ft", iterations=2, evaluation={"every": 2, "max_gap": 1.0}
    )
    summary = finetune(cfg)
    assert summary["train_sim_steps"] == 0 and summary["eval_sim_steps"] > 0
    assert summary["iterations_run"] == 2 and len(summary["evaluations"]) == 2
    assert 0 < summary["cpu_seconds"] and 0 < summary["wall_seconds"]
    assert (tmp_path / "ft" / "pretrained_model" / "model.safetensors").is_file()
    assert (tmp_path / "ft" / "learning_curve.png").is_file()
    history = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == 2
    # the summary's training-rollout figures are the iterations' own, averaged
    rollouts = summary["training_rollouts"]
    assert rollouts["imagined_success_mean"] == pytest.approx(sum(h["imagined/success"] for h in history) / 2)
    assert rollouts["mixed_starts_mean"] == pytest.approx(
        sum(h["imagined/mixed_starts"] for h in history) / 2
    )


@pytest.mark.slow  # three GRPO iterations with evaluation: ~12 s on the shared machine
def test_finetune_rolls_back_when_imagination_and_sim_drift_apart(tmp_path, saved_models, monkeypatch):
    from worldloop.rl_finetune.policy_rl import finetune as policy_finetune
    from worldloop.vla.factory import load_policy

    wm, policies = saved_models
    gaps = iter([0.1, 0.2, 0.6])  # BC, iteration 1 (drift +0.1: fine), iteration 2 (drift +0.5: exploit)

    def scripted(*args):
        gap = next(gaps)
        return {**_no_drift(*args), "imagined_success": 0.3 + gap, "gap": gap}

    monkeypatch.setattr(policy_finetune, "evaluate", scripted)
    cfg = _finetune_config(
        policies[0], wm, tmp_path / "ft", lr=1e-2, iterations=5, evaluation={"max_gap": 0.3}
    )
    summary = finetune(cfg)
    assert summary["iterations_run"] == 2 and "iteration 2" in summary["stopped"]
    assert summary["after"]["iteration"] == 1
    saved = load_policy(tmp_path / "ft" / "pretrained_model").state_dict()
    bc = load_policy(policies[0]).state_dict()
    # the saved weights are iteration 1's: trained (not BC), and not iteration 2's exploit
    assert any(not torch.equal(saved[k], bc[k]) for k in bc)


def test_evaluate_policy_cli_backend_imagination(tmp_path, saved_models, capsys):
    from worldloop import evaluate_policy

    wm, policies = saved_models
    out = tmp_path / "eval"
    evaluate_policy.main(
        ["--backend", "imagination", "--policy.path", policies[0], f"--imagination.world_model={wm}",
         "--sim.max_steps=3", "--episodes=2", "--imagination.videos=0", f"--output_dir={out}"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "imagined" in printed and "policy_0" in printed
    saved = json.loads((out / "ranking.json").read_text())
    record = saved["policies"]["policy_0"]["imagination"]
    assert record["episodes"] == 2 and record["sim_steps"] == 0 and "sim" not in saved["policies"]["policy_0"]
    assert all(e["length"] <= 3 for e in record["per_episode"])
    with pytest.raises(ValueError, match="--backend imagination"):
        evaluate_policy.main(["--rank", policies[0], policies[1], f"--imagination.world_model={wm}"])


def test_replay_actions_is_open_loop_and_seeded():
    from worldloop.world_model.world_model_env import replay_actions

    env = WorldModelEnv(tiny_world_model(), WorldModelEnvConfig(horizon=5))
    starts, actions = random_starts(3), torch.rand(3, 7, 4)
    a = replay_actions(env, starts, actions, seed=1, chunk=2)
    assert env.steps_taken == 5 or env.succeeded.all()  # stops at the horizon, not at the end of the actions
    assert a == replay_actions(env, starts, actions, seed=1, chunk=2)
    assert len(a) == 3 and all(0 <= r["progress"] <= 1 for r in a)
    with pytest.raises(ValueError, match="actions"):
        replay_actions(env, starts, actions[:2], seed=1)
    # a reading of the drawn frames, kept per step beside the heads' verdict, which it leaves alone
    read = replay_actions(env, starts, actions, seed=1, chunk=2, frame_reading=lambda f, t: f.mean((2, 3, 4)))
    assert [len(r.pop("frame_reading")) for r in read] == [env.steps_taken] * 3 and read == a


@pytest.mark.slow  # six GRPO iterations in three runs: ~11 s on the shared machine
def test_finetune_resume_continues_exactly(tmp_path, saved_models, monkeypatch):
    from worldloop.rl_finetune.policy_rl import finetune as policy_finetune
    from worldloop.vla.factory import load_policy

    monkeypatch.setattr(policy_finetune, "evaluate", _no_drift)
    wm, policies = saved_models

    def config(name, iterations, resume=False):
        return _finetune_config(policies[0], wm, tmp_path / name, iterations=iterations, resume=resume)

    straight = finetune(config("straight", 3))
    first = finetune(config("resumed", 2))
    resumed = finetune(config("resumed", 3, resume=True))
    assert resumed["cpu_seconds"] > first["cpu_seconds"]  # the first run's CPU time is carried over
    assert straight["iterations_run"] == resumed["iterations_run"] == 3
    a = load_policy(tmp_path / "straight" / "pretrained_model").state_dict()
    b = load_policy(tmp_path / "resumed" / "pretrained_model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["000002", "000003"]


@pytest.mark.slow  # four GRPO iterations: ~6 s on the shared machine
def test_finetune_stops_with_an_evaluation_inside_its_cpu_budget(tmp_path, saved_models, monkeypatch):
    from worldloop.rl_finetune.policy_rl import finetune as policy_finetune

    # A CPU clock that only evaluations and iterations move, 10 s each.
    clock = {"now": 0.0}

    def costs_10s(work):
        def timed(*args):
            clock["now"] += 10
            return work(*args)

        return timed

    def trainer_costing_10s(*args):
        trainer = make_trainer(*args)
        trainer.step = costs_10s(trainer.step)
        return trainer

    make_trainer = policy_finetune.make_trainer
    monkeypatch.setattr(policy_finetune, "make_trainer", trainer_costing_10s)
    monkeypatch.setattr(policy_finetune, "evaluate", costs_10s(_no_drift))
    monkeypatch.setattr(policy_finetune.time, "process_time", lambda: clock["now"])
    wm, policies = saved_models
    cfg = _finetune_config(
        policies[0], wm, tmp_path / "ft", iterations=50, cpu_budget_minutes=1.0, evaluation={"every": 100}
    )
    summary = finetune(cfg)
    # BC evaluation (10 s) + 4 iterations (40 s) + the closing evaluation (10 s) = the 60 s budget; a fifth
    # iteration would not have left room for the evaluation.
    assert summary["iterations_run"] == 4 and "CPU budget" in summary["stopped"]
    assert summary["cpu_seconds"] == 60
    # stopped by the budget, not rolled back: the closing evaluation is the result
    assert summary["after"] == summary["evaluations"][-1] and summary["after"]["iteration"] == 4
    with pytest.raises(ValueError, match="cpu_budget_minutes"):
        FinetunePolicyConfig(policy=PolicyPath(policies[0]), world_model=wm, cpu_budget_minutes=-1).validate()


@pytest.mark.slow  # three GRPO iterations: ~5 s on the shared machine
def test_finetune_can_keep_the_weights_imagination_rates_best(tmp_path, saved_models, monkeypatch):
    from worldloop.rl_finetune.policy_rl import finetune as policy_finetune
    from worldloop.vla.factory import load_policy

    rates = iter([0.3, 0.4, 0.7, 0.5])  # BC, then iterations 1, 2, 3: iteration 2 is imagined best

    def rated(*args):
        return {**_no_drift(*args), "imagined_success": next(rates), "sim_success": 0.1}

    monkeypatch.setattr(policy_finetune, "evaluate", rated)
    wm, policies = saved_models
    cfg = _finetune_config(
        policies[0],
        wm,
        tmp_path / "ft",
        iterations=3,
        keep_checkpoints=3,
        evaluation={"keep": "best_imagined"},
    )
    summary = finetune(cfg)
    assert summary["iterations_run"] == 3 and summary["after"]["iteration"] == 2
    kept = load_policy(tmp_path / "ft" / "pretrained_model").state_dict()
    second = load_policy(tmp_path / "ft" / "checkpoints" / "000002" / "pretrained_model").state_dict()
    last = load_policy(tmp_path / "ft" / "checkpoints" / "000003" / "pretrained_model").state_dict()
    assert all(torch.equal(kept[k], second[k]) for k in kept)
    assert not all(torch.equal(kept[k], last[k]) for k in kept)
    with pytest.raises(ValueError, match="eval.keep"):
        FinetunePolicyConfig(
            policy=PolicyPath("p"), world_model="w", eval=FinetuneEvalConfig(keep="best")
        ).validate()


def test_observe_sim_judges_the_sims_own_frames(tmp_path, saved_models):
    from worldloop.rl_finetune.imagination.judged_sim import JudgedSimEnv, evaluate_judged_in_sim
    from worldloop.vla.factory import load_policy
    from worldloop.vla.sim_evaluation import evaluate_in_sim
    from worldloop.world_model.model import WorldModel

    wm_path, policies = saved_models
    wm = WorldModel.from_pretrained(wm_path)
    judged = evaluate_judged_in_sim(load_policy(policies[0]), wm, 0.5, SIM, episodes=3, seed=100)
    plain = evaluate_in_sim(load_policy(policies[0]), SIM, 3, 100, progress_bar=False)
    assert judged["backend"] == "sim_judged" and judged["episodes"] == 3
    for j, p in zip(judged["per_episode"], plain["per_episode"]):
        assert j["seed"] == p["seed"] and j["sim_success"] == p["success"]  # the same sim episodes
        assert j["length"] == SIM.max_steps or j["success"]  # not ended by the sim's own success
        assert j["success"] == (j["max_success_prob"] > 0.5)
        assert j["sim_success_judged"] <= j["sim_success"]  # the sim's verdict on the steps the judge read
    # Resets given one per episode may repeat: the same layout, the policy's own noise.
    again = evaluate_judged_in_sim(
        load_policy(policies[0]), wm, 0.5, SIM, 3, seed=7, env_seeds=[100, 100, 101]
    )
    assert [e["seed"] for e in again["per_episode"]] == [100, 100, 101]
    with pytest.raises(ValueError, match="2 seeds for 3 episodes"):
        evaluate_judged_in_sim(load_policy(policies[0]), wm, 0.5, SIM, 3, seed=7, env_seeds=[100, 101])
    # The judge reads the frame the sim rendered: the heads on that frame, computed here by hand.
    import gymnasium as gym

    from worldloop import sim

    env = JudgedSimEnv(gym.make(sim.ENV_IDS["reach"], config=SIM.env_config(16, ("front",))), wm)
    obs, info = env.reset(seed=100)
    obs, _, _, _, info = env.step(obs["observation.state"])
    frame = torch.from_numpy(obs["observation.images.front"]).permute(2, 0, 1).float() / 255
    state = torch.as_tensor(obs["observation.state"]).float()[None, None]
    with torch.no_grad():
        expected = wm.outcomes(wm.frames_in(frame[None, None, None]), [info["task"]], state, env._first)
    assert info["judge_success_prob"] == pytest.approx(
        float(torch.sigmoid(expected["success_logit"]).flatten()[0])
    )
    env.close()
    # Ranking with observe=sim: the "imagination" side is the judged sim, and the result says so.
    cfg = ImaginationEvalConfig(world_model=wm_path, horizon=4, batch_envs=2, videos=0, observe="sim")
    result = rank_policies(
        policies, cfg, SIM, episodes=2, seed=100, output_dir=tmp_path / "r", compare_sim=False
    )
    assert result["judge"]["observe"] == "sim"
    saved = json.loads((tmp_path / "r" / "ranking.json").read_text())["policies"]["policy_0"]["imagination"]
    assert saved["backend"] == "sim_judged"
    assert [{k: v for k, v in e.items() if k != "video"} for e in saved["per_episode"]] == judged[
        "per_episode"
    ][:2]


def test_zoo_finds_our_lerobots_and_scripted_policies_and_skips_checkpoints(tmp_path):
    find_policies = importlib.import_module("benchmarks.imagination_eval").find_policies
    zoo = tmp_path / "zoo"
    for name, config in [
        ("flow", "config.yaml"),
        ("act", "config.json"),
        ("run/checkpoints/000100", "config.json"),
    ]:
        (zoo / name).mkdir(parents=True)
        (zoo / name / config).write_text("{}")
        (zoo / name / "model.safetensors").write_bytes(b"")
    (zoo / "pusher").mkdir()
    (zoo / "pusher" / "config.yaml").write_text("type: scripted_pusher\n")
    (zoo / "notes").mkdir()
    (zoo / "notes" / "config.json").write_text("{}")  # no weights: not a policy
    elsewhere = tmp_path / "lerobot_run" / "checkpoints" / "000200" / "pretrained_model"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    (elsewhere / "model.safetensors").write_bytes(b"")
    (zoo / "act_200").symlink_to(elsewhere)  # a checkpoint linked in joins the zoo
    assert find_policies(zoo) == [str(zoo / n) for n in ("act", "act_200", "flow", "pusher")]


def test_short_names_keep_the_names_of_policies_linked_into_a_zoo(tmp_path):
    target = tmp_path / "run" / "checkpoints" / "0000300" / "pretrained_model"
    target.mkdir(parents=True)
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "flow_300").symlink_to(target)
    (tmp_path / "zoo" / "pusher").mkdir()
    assert short_names([str(tmp_path / "zoo" / "flow_300"), str(tmp_path / "zoo" / "pusher")]) == [
        "flow_300",
        "pusher",
    ]


def _expert_push_episode(seed: int, skill: float) -> dict:
    """A scripted expert's push episode from the sim reset with `seed`, as an imagined episode's record."""
    from worldloop.sim.experts import ExpertConfig, ScriptedExpert

    env = TabletopEnv(TabletopEnvConfig(task="push", cameras=()))
    env.reset(seed=seed)
    expert = ScriptedExpert(env, ExpertConfig(skill=skill), seed=seed)
    expert.reset(seed=seed)
    actions, success = [], False
    for _ in range(env.config.max_steps):
        actions.append(expert.act().tolist())
        _, _, terminated, truncated, info = env.step(np.asarray(actions[-1]))
        success = success or bool(info["success"])
        if terminated or truncated:
            break
    env.close()
    return {"actions": actions, "length": len(actions), "success": success}


def test_imagined_actions_in_sim_say_what_those_actions_do_to_the_cube():
    sim_cfg = SimEvalConfig(task="push")
    episodes = [_expert_push_episode(seed, skill=1.0) for seed in (7, 8)]
    assert all(e["success"] for e in episodes)  # the expert pushes the cube home from these resets
    held = [{**e, "actions": [e["actions"][0]] * e["length"]} for e in episodes]  # the arm barely moves
    cut = [{**e, "length": 3} for e in episodes]  # the imagined episode ended (judged a success) at step 3
    assert imagined_actions_in_sim(episodes, sim_cfg, seeds=[7, 8])["per_episode"] == [True, True]
    assert imagined_actions_in_sim(held, sim_cfg, seeds=[7, 8])["per_episode"] == [False, False]
    assert imagined_actions_in_sim(cut, sim_cfg, seeds=[7, 8]) == {
        "success_rate": 0.0,
        "per_episode": [False, False],
        "sim_steps": 6,
    }
    # Another reset puts the cube elsewhere: the same actions no longer push it home.
    assert imagined_actions_in_sim(episodes[:1], sim_cfg, seeds=[100])["per_episode"] == [False]


def test_imagination_error_split_tells_the_world_from_the_policy():
    def record(imagined, probs, replayed, sim):
        return {
            "imagination": {
                "success_rate": float(np.mean(imagined)),
                "per_episode": [{"success": s, "max_success_prob": p} for s, p in zip(imagined, probs)],
                "actions_in_sim": {"success_rate": float(np.mean(replayed)), "per_episode": replayed},
            },
            "sim": {"success_rate": float(np.mean(sim)), "per_episode": [{"success": s} for s in sim]},
        }

    # The policy acts in imagination as in the sim (replayed = sim), but the judge calls it the other way round.
    records = {
        "weak": record(
            [True, True, True, False],
            [0.9, 0.9, 0.8, 0.1],
            [False, False, False, True],
            [False, False, False, True],
        ),
        "strong": record(
            [False, False, False, True],
            [0.1, 0.2, 0.1, 0.9],
            [True, True, True, False],
            [True, True, True, False],
        ),
    }
    split = imagination_error_split(records)
    assert split["actions_in_sim"] == [0.25, 0.75]
    assert split["policy_on_drawn_frames"]["pearson"] == pytest.approx(1.0)
    assert split["world_and_judge"]["pearson"] == pytest.approx(-1.0)
    assert split["world_and_judge"]["episode_agreement"] == 0.0
    assert split["world_and_judge"]["episode_auroc"]["value"] == 0.0


def test_drawn_vs_recorded_push_measures_how_far_the_drawn_cube_falls_short():
    compare = importlib.import_module("benchmarks.imagination_eval").drawn_vs_recorded_push
    steps = np.arange(31, dtype=float)
    recorded = [list(20 - k * steps / 30) for k in (4, 8, 12, 16)]  # the cube closes 4..16 px on its square
    drawn = [list(20 - 0.5 * k * steps / 30) for k in (4, 8, 12, 16)]  # drawn: half as far, step by step
    drawn[0][5] = float("nan")  # a frame where the cube was not found
    out = compare(drawn, recorded)
    assert out["closing_ratio"] == pytest.approx(0.5)
    assert out["closing_pearson"] == pytest.approx(1.0)
    assert out["closing_px"]["recorded_mean"] == pytest.approx(10.0)
    assert out["distance_error_px"]["h1"] == pytest.approx(0.0)  # the first frame: both the start
    assert out["distance_error_px"]["h31"] == pytest.approx(5.0)  # half of 4..16 px, at the last step
    lost = compare([[float("nan")] * 31] + drawn[1:], recorded)  # never seen in one drawn episode: left out
    assert lost["episodes_seen_in_both"] == 3
