"""`evaluate_policy.py --backend imagination` and `--rank a b ... --compare-sim`: evaluate policies in the
world model (and in the simulator from the very same initial states), rank them, plot and tabulate.

Initial states are simulator resets with the evaluation seeds (rendered, never stepped), so episode i of
the imagination run and episode i of the simulator run start from the same layout, arm pose and
instruction. Simulator physics steps are counted (`rl_finetune.sim_steps`): the imagination run uses none.
For a robot the simulator does not have (the world model's stored embodiment), episodes start from the first
frames of a dataset's episodes (`--imagination.starts_dataset`) and are imagined only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from worldloop.common.checkpoint import atomic_write_text, save_json
from worldloop.common.config import ConfigError
from worldloop.common.run_record import print_table
from worldloop.common.stats import auroc_ci
from worldloop.rl_finetune.imagination.evaluation import (
    ImaginationEvalConfig,
    evaluate_in_imagination,
    side_by_side,
    write_video,
)
from worldloop.rl_finetune.imagination.initial_states import dataset_starts, sim_starts
from worldloop.rl_finetune.imagination.judged_sim import evaluate_judged_in_sim
from worldloop.rl_finetune.imagination.ranking import disagreement, ranking_cis, ranking_report
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.sim.tabletop_env import TabletopEnv
from worldloop.vla.factory import load_policy
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim
from worldloop.world_model.checkpoint_inputs import embodiment_of
from worldloop.world_model.model import WorldModel
from worldloop.world_model.success_calibration import CANDIDATES
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv

IMAGINED_ACTIONS = "imagined_actions.jsonl"


def fold_cli_args(args: list[str]) -> list[str]:
    """Accept the issue's spelling: `--rank a b c` -> `--rank=[a,b,c]`, `--compare-sim` -> `--compare_sim=true`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--rank":
            values = []
            while i + 1 < len(args) and not args[i + 1].startswith("--"):
                values.append(args[i + 1])
                i += 1
            out.append(f"--rank=[{','.join(values)}]")
        elif a in ("--compare-sim", "--compare_sim"):
            out.append("--compare_sim=true")
        else:
            out.append(a)
        i += 1
    return out


def load_world_model_env(
    cfg: ImaginationEvalConfig, sim_cfg: SimEvalConfig, device: str = "cpu"
) -> WorldModelEnv:
    if not cfg.world_model:
        raise ValueError("--imagination.world_model is required: a directory written by train_world_model.py")
    world_model = WorldModel.from_pretrained(cfg.world_model, device)
    embodiment = embodiment_of(world_model, cfg.embodiment, "imagination.embodiment")
    return WorldModelEnv(world_model, cfg.env_config(sim_cfg.max_steps), embodiment=embodiment)


def evaluation_starts(
    env: WorldModelEnv, cfg: ImaginationEvalConfig, sim_cfg: SimEvalConfig, episodes: int, seed: int
) -> InitialStates:
    """Dataset starts with `cfg.starts_dataset`, else sim resets (which only the tabletop arm has)."""
    if cfg.starts_dataset:
        return dataset_starts(env, cfg.starts_dataset, episodes, cfg.starts_resize)
    return sim_starts(env, sim_cfg, episodes, seed, hint="--imagination.starts_dataset=<a dataset of it>")


def evaluate_one(
    policy_path: str,
    env: WorldModelEnv,
    starts: InitialStates,
    im_cfg: ImaginationEvalConfig,
    seed: int,
    output_dir: Path,
    device: str,
    sim_cfg: SimEvalConfig,
    compare_sim: bool,
) -> dict:
    """Imagination (and, with `compare_sim`, simulator) evaluation of one policy from `starts`.

    With `im_cfg.observe == "sim"` the "imagination" side is the judge's upper bound instead: the policy acts
    in the simulator from the same resets and the world model's judge reads the sim's frames."""
    policy = load_policy(policy_path, device)
    with count_sim_steps() as counter:
        if im_cfg.observe == "sim":
            imagined = evaluate_judged_in_sim(
                policy,
                env.world_model,
                env.success_threshold,
                sim_cfg,
                starts.batch_size,
                seed,
                output_dir,
                device,
            )
            clips = []
        else:
            imagined, clips = evaluate_in_imagination(
                policy, env, starts, seed, im_cfg.batch_envs, output_dir, im_cfg.videos
            )
            if not im_cfg.starts_dataset:
                write_imagined_actions(imagined["per_episode"], seed, output_dir / IMAGINED_ACTIONS)
    imagined["sim_steps"] = counter.steps
    imagined["judge"] = {**env.judge(), "observe": im_cfg.observe}
    record = {"policy": policy_path, "imagination": imagined}
    if compare_sim:
        with count_sim_steps() as counter:
            simulated = evaluate_in_sim(policy, sim_cfg, starts.batch_size, seed, output_dir, device)
        simulated["sim_steps"] = counter.steps
        record["sim"] = simulated
        record["disagreement"] = disagreement(imagined, simulated)  # None when the 95% intervals overlap
        if im_cfg.observe != "sim":
            imagined["success_rate_by_state"] = success_by_imagined_states(
                imagined["per_episode"], sim_cfg, seed
            )
            imagined["actions_in_sim"] = imagined_actions_in_sim(
                imagined["per_episode"], sim_cfg, range(seed, seed + starts.batch_size)
            )
        _write_side_by_side(simulated, clips, output_dir, env.embodiment.fps)
    return record


def write_imagined_actions(per_episode: list[dict], seed: int, path: Path) -> None:
    """One line per imagined episode (its starts: sim resets with seeds seed..): {"seed", "actions"}, the
    joint targets it was imagined under. `record_demos.py --replay=[path]` plays them in the simulator, which
    tells what those very actions do there (the labels a judge of drawn frames is fitted on)."""
    lines = [json.dumps({"seed": seed + i, "actions": e["actions"]}) for i, e in enumerate(per_episode)]
    atomic_write_text(path, "\n".join(lines) + "\n")


def success_by_imagined_states(per_episode: list[dict], sim_cfg: SimEvalConfig, seed: int) -> float | None:
    """The imagined episodes (starts: sim resets with seeds seed..) judged by the simulator's own success
    rule on their imagined joint states, for reach (None for other tasks). Next to the heads' verdict this
    tells a wrong judge (the success head) from a wrong world (the policy acting differently on imagined
    frames): the joint states follow the commanded actions whatever the frames show."""
    if sim_cfg.task != "reach":
        return None
    return float(np.mean([steps.any() for steps in reached_along_imagined_paths(per_episode, sim_cfg, seed)]))


def imagined_actions_in_sim(per_episode: list[dict], sim_cfg: SimEvalConfig, seeds: Sequence[int]) -> dict:
    """The imagined episodes' own actions (their first `length` steps; episode i started from the sim reset
    with `seeds[i]`) played in the simulator, which renders nothing: {"success_rate", "per_episode" (bool
    each), "sim_steps"}.
    Next to the imagined verdict and the policy's own sim run it splits an imagination error in two: the
    world drew or the judge read the actions' outcome wrong (imagined vs these), or the policy acted
    otherwise on drawn frames than on real ones (these vs the sim run). Unlike `success_by_imagined_states`
    it holds where the objects move (push): the physics says where the actions leave the cube."""
    env = TabletopEnv(sim_cfg.env_config(image_size=64, cameras=()))
    verdicts, steps = [], 0
    try:
        for episode, seed in zip(per_episode, seeds, strict=True):
            env.reset(seed=int(seed))
            success = False
            for action in episode["actions"][: episode["length"]]:
                _, _, terminated, truncated, info = env.step(np.asarray(action, dtype=np.float32))
                steps += 1
                success = success or bool(info["success"])
                if terminated or truncated:
                    break
            verdicts.append(success)
    finally:
        env.close()
    return {"success_rate": float(np.mean(verdicts)), "per_episode": verdicts, "sim_steps": steps}


def reached_along_imagined_paths(
    per_episode: list[dict], sim_cfg: SimEvalConfig, seed: int
) -> list[np.ndarray]:
    """Per episode, whether the simulator's reach rule holds at each of its imagined joint states (the start
    included), with the objects where the sim reset with seed `seed + i` put them."""
    env = TabletopEnv(sim_cfg.env_config(image_size=64, cameras=()))  # renders nothing
    try:
        verdicts = []
        for i, episode in enumerate(per_episode):
            env.reset(seed=seed + i)
            verdicts.append(np.array([env.success_along(np.asarray([q])) for q in episode["joint_states"]]))
    finally:
        env.close()
    return verdicts


def _write_side_by_side(simulated: dict, clips: list, output_dir: Path, fps: int) -> None:
    import imageio.v2 as imageio

    for i, clip in enumerate(clips):
        video = simulated["per_episode"][i].get("video")
        if video is None:
            continue
        sim_frames = [np.asarray(f) for f in imageio.mimread(video, memtest=False)]
        write_video(
            output_dir / "videos" / f"sim_vs_imagined_{i:03d}.mp4", side_by_side(sim_frames, clip), fps
        )


def _row(name: str, rec: dict) -> dict:
    im = rec["imagination"]
    row = {
        "policy": name,
        "imagined": im["success_rate"],
        "imagined_ci": f"{im['success_ci95'][0]:.2f}-{im['success_ci95'][1]:.2f}",
        "imagined_progress": im["mean_progress"],
        "imagined_s": im["seconds"],
    }
    if "sim" in rec:
        sim = rec["sim"]
        row.update(
            {
                "sim": sim["success_rate"],
                "sim_ci": f"{sim['success_ci95'][0]:.2f}-{sim['success_ci95'][1]:.2f}",
                "sim_progress": sim["mean_progress"],
                "gap": im["success_rate"] - sim["success_rate"],
                "intervals": "disjoint" if rec["disagreement"] else "overlap",
                "imagined_by_state": im.get("success_rate_by_state"),
                "actions_in_sim": im["actions_in_sim"]["success_rate"] if "actions_in_sim" in im else None,
                "sim_s": sim["seconds"],
            }
        )
    return row


def plot_scatter(panels: list[tuple[str, list[dict], dict]], path: Path) -> None:
    """Imagined against simulated success, one panel per (title, policy rows, ranking report), side by side:
    each policy a point with both 95% intervals, the diagonal where imagination is right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), squeeze=False)
    for ax, (title, rows, report) in zip(axes[0], panels):
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="imagined = sim")
        for r in rows:
            (s_lo, s_hi), (i_lo, i_hi) = (map(float, r[k].split("-")) for k in ("sim_ci", "imagined_ci"))
            ax.errorbar(
                r["sim"], r["imagined"], xerr=[[r["sim"] - s_lo], [s_hi - r["sim"]]],
                yerr=[[r["imagined"] - i_lo], [i_hi - r["imagined"]]], fmt="o", capsize=3,
            )  # fmt: skip
            ax.annotate(
                r["policy"], (r["sim"], r["imagined"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        ax.set_xlabel("success in the simulator")
        ax.set_ylabel("success in imagination")
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(-0.05, 1.05)
        figures = (
            f"Pearson {report['pearson']:.2f}  Spearman {report['spearman']:.2f}  MMRV {report['mmrv']:.3f}"
        )
        ax.set_title(f"{title}\n{figures}" if title else figures, fontsize=9)
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rank_policies(
    policy_paths: list[str],
    im_cfg: ImaginationEvalConfig,
    sim_cfg: SimEvalConfig,
    episodes: int,
    seed: int,
    output_dir: Path,
    device: str = "cpu",
    compare_sim: bool = True,
) -> dict:
    """Evaluate every policy in imagination from the sim resets of `sim_cfg` (task, arm noise) with seeds
    seed.. (or from `im_cfg.starts_dataset`); with `compare_sim` also in the simulator from the same
    starts; rank; plot; save."""
    if compare_sim and im_cfg.starts_dataset:
        raise ConfigError(
            "--compare-sim runs the simulator from the imagined episodes' start states, which "
            "--imagination.starts_dataset takes from a dataset instead: drop one of them"
        )
    env = load_world_model_env(im_cfg, sim_cfg, device)
    if compare_sim and env.config.horizon != sim_cfg.max_steps:
        raise ValueError(
            f"imagination.horizon={env.config.horizon} differs from sim.max_steps={sim_cfg.max_steps}: "
            "compared episodes must last as long"
        )
    starts = evaluation_starts(env, im_cfg, sim_cfg, episodes, seed)
    names = short_names(policy_paths)
    records, rows = {}, []
    t0 = time.perf_counter()
    for name, path in zip(names, policy_paths):
        records[name] = evaluate_one(
            path, env, starts, im_cfg, seed, output_dir / name, device, sim_cfg, compare_sim
        )
        rows.append(_row(name, records[name]))
    result = {
        "episodes": episodes,
        "seed": seed,
        "judge": {**env.judge(), "observe": im_cfg.observe},
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }
    if compare_sim:
        # Policies whose imagined and simulated 95% intervals do not overlap, with both numbers.
        result["disagreements"] = {n: r["disagreement"] for n, r in records.items() if r["disagreement"]}
    if compare_sim and len(rows) >= 2:
        report = ranking_report([r["imagined"] for r in rows], [r["sim"] for r in rows])
        result["ranking"] = report
        result["ranking_ci95"] = ranking_cis(
            *(
                [[e["success"] for e in rec[side]["per_episode"]] for rec in records.values()]
                for side in ("imagination", "sim")
            )
        )
        result["imagination_seconds"] = sum(r["imagined_s"] for r in rows)
        result["sim_seconds"] = sum(r["sim_s"] for r in rows)
        plot_scatter([("", rows, report)], output_dir / "imagined_vs_sim.png")
        result["success_threshold"] = env.success_threshold
        result["threshold_sweep"] = threshold_sweep(records, env.success_threshold)
        if im_cfg.observe != "sim":
            result["error_split"] = imagination_error_split(records)
    save_json({"summary": result, "policies": records}, output_dir / "ranking.json")
    return result


def imagination_error_split(records: dict) -> dict:
    """Where imagination's ranking goes wrong, from each policy's imagined actions played in the sim
    (`imagined_actions_in_sim`): `world_and_judge` ranks the imagined verdicts against what those very actions
    did (the drawn outcome and its reading; with the judge's per-episode AUROC on them, pooled over the
    policies), `policy_on_drawn_frames` ranks what the actions did against the policy's own sim run (the
    policy acting otherwise on drawn frames than on real ones). Each ranking with bootstrap 95% intervals."""
    imagined, replayed, sim, probs = [], [], [], []
    for rec in records.values():
        im = rec["imagination"]
        imagined.append([e["success"] for e in im["per_episode"]])
        replayed.append(im["actions_in_sim"]["per_episode"])
        sim.append([e["success"] for e in rec["sim"]["per_episode"]])
        probs += [e["max_success_prob"] for e in im["per_episode"]]
    rate = [float(np.mean(x)) for x in replayed]
    judged, actual = np.concatenate(imagined).astype(bool), np.concatenate(replayed).astype(bool)
    return {
        "actions_in_sim": rate,
        "world_and_judge": {
            **ranking_report([float(np.mean(x)) for x in imagined], rate),
            "ci95": ranking_cis(imagined, replayed),
            "episode_auroc": auroc_ci(probs, actual),
            "episode_agreement": float(np.mean(judged == actual)),
        },
        "policy_on_drawn_frames": {
            **ranking_report(rate, [float(np.mean(x)) for x in sim]),
            "ci95": ranking_cis(replayed, sim),
        },
    }


def threshold_sweep(records: dict, run_threshold: float) -> list[dict]:
    """The ranking as it would be at each calibration candidate up to the run's success threshold, from
    the imagined episodes' max success probability. Exact, not a re-run: an episode ended by a success
    crossed every lower threshold, and one that ran to its horizon saw all its steps."""
    sim = [rec["sim"]["success_rate"] for rec in records.values()]
    sweep = []
    for threshold in (t for t in CANDIDATES if t <= run_threshold + 1e-9):
        imagined = [
            float(np.mean([e["max_success_prob"] > threshold for e in rec["imagination"]["per_episode"]]))
            for rec in records.values()
        ]
        sweep.append({"threshold": threshold, "imagined": imagined, **ranking_report(imagined, sim)})
    return sweep


def short_names(paths: list[str]) -> list[str]:
    """Readable unique names: the path parts that differ between the policies (as given: a policy linked
    into a zoo keeps the link's name)."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    names = []
    for p in parts:
        distinct = [x for x in p if any(x not in q for q in parts)]
        names.append("_".join(distinct) or Path(p[-1]).name)
    if len(set(names)) != len(names):
        names = [f"{i}_{Path(p).name}" for i, p in enumerate(paths)]
    return names


def print_ranking(result: dict, output_dir: Path) -> None:
    """Print what `rank_policies` returned: its table and, where the simulator was compared, the ranking
    figures (what `evaluate_policy.py --backend imagination` and `--rank` show)."""
    print_table(result["rows"])
    for name, sentence in result.get("disagreements", {}).items():
        print(f"DISAGREEMENT {name}: {sentence}")
    if "ranking" in result:
        r = result["ranking"]
        print(
            f"Pearson r {r['pearson']:.3f}  Spearman rho {r['spearman']:.3f}  MMRV {r['mmrv']:.3f}  "
            f"max |imagined - sim| {r['max_abs_gap']:.3f}  (imagination {result['imagination_seconds']:.0f} s, "
            f"sim {result['sim_seconds']:.0f} s)"
        )
    print(f"wrote {output_dir}")
