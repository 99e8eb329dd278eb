"""Does imagination tell a start's better rollouts from its worse? What RL in imagination has to learn from.

python benchmarks/imagination_groups.py --world_model=outputs/push_setting/judge/push_timed4_sr/pretrained_model \
    --policy=outputs/push_setting/zoo/flow_4k_step4000 --task=push --starts=100 --group_size=8

Every start (sim resets with seeds seed..) is imagined `group_size` times with the policy's own noise, in the env
policy RL collects in (success ends an episode); each episode's actions are then played in the simulator from the
same reset. Per score imagination gives an episode (RL's return, the judge's highest success probability, the
reward head's progress) it reports the within-start AUROC against the sim's verdicts and what picking the
top-scored rollout of each start gains in the sim (rl_finetune/imagination/rollout_groups.py), each with a
bootstrap interval over starts. `--observe=[drawn,first_frame,sim,replay]` runs once per mode (the policy on drawn frames,
or on the first frame held, the judge reading the drawn frames; or the policy in the simulator and the same judge
reading the sim's frames: the judge's own share; or the policy's sim rollouts replayed open loop in the world
model, judged on the drawn replay: the drawing of given actions apart from the closed loop, with, on push, the
cube's distance to its square read by colour in the sim's frames and the drawn ones, `reading_real` and
`reading_drawn`, a reading that learns nothing, and `reading_response`: the slope of the drawn reading on the
real one across a start's rollouts, 1 when the drawing sets them as far apart as the world), `--seeds=[...]` once
per set of starts,
with the mean over the sets and its Student-t interval. The result names the judge; `best_of_k.png` in
`output_dir` plots the best-of-K curves (K = 1..group_size) against a perfect pick's, and
`episodes_<observe>_seed<seed>.json` there holds every rollout's start seed, scores and sim verdict.

To screen a world model against another on the same rollouts (`replay` and `sim`, whose rollouts the world model
does not choose), run it with `--compare_to=<the other run's output_dir>`: per score, the paired within-start
AUROC difference (this run minus that one) and its bootstrap interval over starts, per set and their mean.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from benchmarks.imagination_eval import cube_to_square_reading  # noqa: E402
from worldloop.common.checkpoint import load_json, save_json  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.common.stats import mean_ci  # noqa: E402
from worldloop.rl_finetune.imagination.evaluation import ImaginationEvalConfig  # noqa: E402
from worldloop.rl_finetune.imagination.initial_states import sim_starts  # noqa: E402
from worldloop.rl_finetune.imagination.policy_ranking import load_world_model_env  # noqa: E402
from worldloop.rl_finetune.imagination.rollout_groups import (  # noqa: E402
    SCORES,
    GroupSettings,
    group_figures,
    imagine_groups,
    judged_sim_groups,
    paired_difference,
    reading_response,
    replayed_sim_groups,
    sim_verdicts,
)
from worldloop.rl_finetune.policy_rl.sim_rollouts import SimRolloutEnv  # noqa: E402
from worldloop.rl_finetune.sim_steps import count_sim_steps  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.vla.sim_evaluation import SimEvalConfig  # noqa: E402
from worldloop.world_model.world_model_env import WorldModelEnv  # noqa: E402


@dataclass
class ImaginationGroupsBenchmarkConfig:
    world_model: str = ""  # a pretrained world-model directory with its outcome heads (the judge)
    policy: str = ""  # the policy RL would fine-tune
    task: str = "push"  # the tabletop task whose resets start the episodes and whose sim judges their actions
    starts: int = 100
    group_size: int = 8  # rollouts per start (GRPO's and NFT's default group)
    seed: int = 810_000  # reset seeds seed..seed+starts-1; also seeds the sampling
    seeds: list[int] | None = None  # one set of starts per seed (as `seed`); None -> `seed` alone
    horizon: int = 50  # steps per episode (= the sim's max_steps, as in policy RL)
    sampler_steps: int = 2  # the world model's denoising steps per frame, as configs/finetune/tiny.yaml
    success_threshold: float = 0.0  # 0 -> the world model's calibrated threshold
    starts_per_batch: int = 2  # starts imagined together (batch = starts_per_batch x group_size)
    success_reward: float = 1.0  # RL's return weights (policy RL's defaults)
    progress_reward: float = 0.5
    observe: list[str] = field(
        default_factory=lambda: ["drawn"]
    )  # drawn | first_frame | sim | replay, one each
    threads: int = 2
    output_dir: str = "outputs/benchmarks/imagination_groups"  # the plot and the per-episode rows
    compare_to: str = ""  # another run's output_dir, the same rollouts: the paired difference per score
    name: str = "imagination_groups"


def group_settings(cfg: ImaginationGroupsBenchmarkConfig) -> GroupSettings:
    return GroupSettings(cfg.group_size, cfg.starts_per_batch, cfg.success_reward, cfg.progress_reward)


def save_episodes(
    cfg: ImaginationGroupsBenchmarkConfig,
    observe: str,
    seed: int,
    episodes: list[dict],
    labels: list[bool],
    scores: tuple[str, ...] = SCORES,
) -> None:
    """Every rollout's start (index and reset seed), scores and sim verdict, for readings after the run."""
    rows = [
        {"start": e["start"], "start_seed": seed + e["start"], **{k: e[k] for k in scores}, "sim_success": y}
        for e, y in zip(episodes, labels, strict=True)
    ]
    save_json(rows, Path(cfg.output_dir) / f"episodes_{observe}_seed{seed}.json")


def run(cfg: ImaginationGroupsBenchmarkConfig, observe: str, seed: int) -> dict:
    if observe not in ("drawn", "first_frame", "sim", "replay"):
        raise SystemExit(f"--observe={observe!r}: expected drawn, first_frame, sim or replay, one run each")
    im_cfg = ImaginationEvalConfig(
        world_model=cfg.world_model, horizon=cfg.horizon, sampler_steps=cfg.sampler_steps,
        success_threshold=cfg.success_threshold,
        observe="drawn" if observe == "replay" else observe,  # replays draw; no policy observes them
    )  # fmt: skip
    sim_cfg = SimEvalConfig(
        task=cfg.task, max_steps=cfg.horizon, batch_envs=cfg.starts_per_batch * cfg.group_size, videos=0
    )
    env = load_world_model_env(im_cfg, sim_cfg)
    policy = load_policy(cfg.policy, "cpu")
    judge = {**env.judge(), "observe": observe}
    if observe == "sim":
        t0 = time.perf_counter()
        episodes, labels = judged_sim_groups(
            policy, env.world_model, env.success_threshold, sim_cfg, range(seed, seed + cfg.starts), seed,
            group_settings(cfg),
        )  # fmt: skip
        save_episodes(cfg, observe, seed, episodes, labels)
        return {
            "observe": observe,
            "seed": seed,
            "judge": judge,
            **group_figures(episodes, labels),
            "judged_success": sum(e["success"] for e in episodes) / len(episodes),
            "sim_seconds": time.perf_counter() - t0,
        }
    starts = sim_starts(env, sim_cfg, cfg.starts, seed)
    if observe == "replay":
        return replay_run(cfg, env, policy, sim_cfg, starts, seed, judge)
    t0 = time.perf_counter()
    with count_sim_steps() as counter:
        episodes = imagine_groups(policy, env, starts, seed, group_settings(cfg))
    imagined_seconds = time.perf_counter() - t0
    if counter.steps:
        raise RuntimeError(f"imagination stepped the simulator {counter.steps} times")
    verdicts = sim_verdicts(episodes, sim_cfg, starts.seeds)
    save_episodes(cfg, observe, seed, episodes, verdicts["per_episode"])
    figures = group_figures(episodes, verdicts["per_episode"])
    return {
        "observe": observe,
        "seed": seed,
        "judge": judge,
        **figures,
        "imagined_success": sum(e["success"] for e in episodes) / len(episodes),
        "imagination_seconds": imagined_seconds,
        "sim_steps": verdicts["sim_steps"],
    }


def replay_run(cfg, env, policy, sim_cfg: SimEvalConfig, starts, seed: int, judge: dict) -> dict:
    """`--observe=replay`: the sim's rollouts replayed open loop, every drawn step read to the horizon."""
    whole = WorldModelEnv(env.world_model, replace(env.config, terminate_on_success=False), env.embodiment)
    sim_env = SimRolloutEnv(sim_cfg, env.config, env.cameras, env.world_model.cfg.frame_size)
    reading = cube_to_square_reading(list(dict.fromkeys(starts.task)))  # None but on tabletop push
    t0 = time.perf_counter()
    try:
        episodes, labels = replayed_sim_groups(
            policy, whole, sim_env, starts, seed, group_settings(cfg), reading
        )
    finally:
        sim_env.close()
    scores = (*SCORES, "reading_real", "reading_drawn") if reading else SCORES
    save_episodes(cfg, "replay", seed, episodes, labels, scores)
    return {
        "observe": "replay",
        "seed": seed,
        "judge": judge,
        **group_figures(episodes, labels, scores=scores),
        **({"reading_response": reading_response(episodes)} if reading else {}),
        "sim_success": sum(labels) / len(labels),
        "seconds": time.perf_counter() - t0,
    }


def compare(cfg: ImaginationGroupsBenchmarkConfig, r: dict) -> dict:
    """This run's within-start AUROC minus `compare_to`'s on the same rollouts, per score (`paired_difference`)."""
    name = f"episodes_{r['observe']}_seed{r['seed']}.json"
    theirs_path = Path(cfg.compare_to) / name
    if not theirs_path.is_file():
        raise SystemExit(
            f"--compare_to={cfg.compare_to}: no {name} (run it with the same seeds and --observe)"
        )
    ours, theirs = load_json(Path(cfg.output_dir) / name), load_json(theirs_path)
    missing = [k for k in r["scores"] if k not in theirs[0]]
    if missing:
        raise SystemExit(f"{theirs_path}: no scores {missing} to compare")
    try:
        return {"to": str(theirs_path), "scores": paired_difference(ours, theirs, list(r["scores"]))}
    except ValueError as err:
        raise SystemExit(f"--compare_to: {theirs_path} against this run: {err}") from None


def finite_mean(values: list[float]) -> dict | None:
    """`mean_ci` of the sets where the figure is defined (a set with no mixed start has no within-start
    AUROC), with how many were not; None when none is."""
    finite = [v for v in values if np.isfinite(v)]
    return {**mean_ci(finite), "undefined": len(values) - len(finite)} if finite else None


def summary(runs: list[dict]) -> dict:
    """Per observe mode, the mean over its sets of starts (Student-t interval) of the base rate, a perfect
    pick, and per score the within-start AUROC and the best-of-K gain."""
    out = {}
    for mode in dict.fromkeys(r["observe"] for r in runs):
        mine = [r for r in runs if r["observe"] == mode]
        out[mode] = {
            "seeds": [r["seed"] for r in mine],
            "base": mean_ci([r["base"] for r in mine]),
            "oracle": mean_ci([r["oracle"] for r in mine]),
            **{
                name: {
                    "within_start_auroc": finite_mean(
                        [r["scores"][name]["within_start_auroc"]["value"] for r in mine]
                    ),
                    "best_of_k_minus_base": mean_ci(
                        [r["scores"][name]["best_of_k_minus_base"]["value"] for r in mine]
                    ),
                }
                for name in mine[0]["scores"]
            },
        }
        if "reading_response" in mine[0]:
            out[mode]["reading_response"] = {
                k: finite_mean([r["reading_response"][k] for r in mine]) for k in ("slope", "corr")
            }
        if "compared" in mine[0]:
            out[mode]["difference"] = {
                name: finite_mean([r["compared"]["scores"][name]["value"] for r in mine])
                for name in mine[0]["compared"]["scores"]
            }
    return out


def plot_best_of_k(runs: list[dict], path: Path) -> None:
    """Sim success of the top-scored (RL's return) of K imagined rollouts, K = 1..G, mean over the sets of
    starts, per observe mode, against a perfect pick's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, mode in enumerate(dict.fromkeys(r["observe"] for r in runs)):
        mine = [r for r in runs if r["observe"] == mode]
        k = np.arange(1, mine[0]["group_size"] + 1)
        picked = np.mean([r["scores"]["return"]["best_of_k_curve"] for r in mine], 0)
        oracle = np.mean([r["oracle_curve"] for r in mine], 0)
        ax.plot(k, picked, "o-", color=f"C{i}", label=f"{mode}: top-scored by the judge (RL's return)")
        ax.plot(k, oracle, "--", color=f"C{i}", label=f"{mode}: a perfect pick")
    ax.set_xlabel("K rollouts of a start")
    ax.set_ylabel("success of the pick's actions in the sim")
    ax.set_title(f"best of K, mean over {len({r['seed'] for r in runs})} set(s) of starts", fontsize=9)
    ax.set_ylim(0, None)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    cfg = parse_cli(ImaginationGroupsBenchmarkConfig)
    if not cfg.world_model or not cfg.policy:
        raise SystemExit("--world_model and --policy are required")
    if cfg.compare_to and Path(cfg.compare_to).resolve() == Path(cfg.output_dir).resolve():
        raise SystemExit(f"--compare_to={cfg.compare_to} is this run's own output_dir")
    torch.set_num_threads(cfg.threads)
    runs = [run(cfg, mode, seed) for mode in cfg.observe for seed in cfg.seeds or [cfg.seed]]
    for r in runs if cfg.compare_to else []:
        r["compared"] = compare(cfg, r)
    table = [
        {
            "observe": r["observe"],
            "seed": r["seed"],
            "score": name,
            "within-start AUROC [95% CI]": "{value:.3f} [{low:.2f}, {high:.2f}]".format(
                **r["scores"][name]["within_start_auroc"]
            ),
            "best of K": round(r["scores"][name]["best_of_k"], 3),
            "minus base [95% CI]": "{value:+.3f} [{low:+.3f}, {high:+.3f}]".format(
                **r["scores"][name]["best_of_k_minus_base"]
            ),
            "base": round(r["base"], 3),
            "oracle": round(r["oracle"], 3),
        }
        for r in runs
        for name in r["scores"]
    ]
    print_table(table, title=f"\n{cfg.starts} starts x {cfg.group_size} imagined rollouts, played in the sim")
    means = summary(runs)
    for mode, m in means.items():
        w, g = m["return"]["within_start_auroc"], m["return"]["best_of_k_minus_base"]
        within = f"{w['mean']:.3f} [{w['low']:.3f}, {w['high']:.3f}]" if w else "undefined (no mixed start)"
        print(
            f"{mode}, mean over {len(m['seeds'])} set(s): within-start AUROC of RL's return {within}, "
            f"best of {cfg.group_size} minus base {g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]"
        )
        for name, d in m.get("difference", {}).items():
            per_set = " / ".join(
                f"{r['compared']['scores'][name]['value']:+.3f}" for r in runs if r["observe"] == mode
            )
            print(
                f"{mode}, {name}: within-start AUROC minus {cfg.compare_to}'s, per set {per_set}, "
                + (f"mean {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" if d else "undefined")
            )
    plot_best_of_k(runs, Path(cfg.output_dir) / "best_of_k.png")
    path = write_result(cfg.name, {"config": asdict(cfg), "runs": runs, "mean": means})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
